"""The Winograd weight cache (``tunecl.backend.weight_cache``): a transformed weight serves later calls
until the weight is written — through the tensor, a view, ``.data``, an optimizer or another alias —
and goes when the weight dies; ``TUNECL_WINOGRAD_CACHE`` decides when it is used.

Each test records a Winograd result for its shapes in the test's private tuning DB, so the backend runs
``conv_winograd``/``conv_winograd_f4``; results are compared with CPU ``conv2d``.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch
import torch.nn.functional as F

import tunecl.backend
from tunecl import config
from tunecl.backend import memory, plans, state, weight_cache
from tunecl.backend.ops import conv as conv_ops
from tunecl.db import TuningDB
from tunecl.kernels import algorithm
from tunecl.problems import ConvProblem

TOL = {"atol": 2e-4, "rtol": 1e-4}   # Winograd rounds in the transformed domain (F(4×4) more)
PROBLEM = ConvProblem(2, 8, 10, 9, 12, 3, 3, padding=1)


def _record(problem: ConvProblem, name: str) -> None:
    device = state.get().device
    winograd = algorithm(name)
    assert winograd.applies(problem, device)
    TuningDB(config.get().db_url).record(device.fingerprint, problem, winograd.name, winograd.version,
                                         winograd.default(problem, device), time_s=1e-4)


@pytest.fixture(params=["conv_winograd", "conv_winograd_f4"])
def winograd_plans(request, fresh_plans):
    """Winograd plans for PROBLEM in both directions that read the weight; an empty cache."""
    for direction in ("fwd", "bwd_data"):
        _record(PROBLEM.with_direction(direction), request.param)
    weight_cache.clear()
    tunecl.backend.reset_stats()
    yield request.param
    weight_cache.clear()


@pytest.fixture
def winograd(winograd_plans, strict):
    """``winograd_plans`` with the CPU fallback forbidden."""
    return winograd_plans


def _conv(x, w, b=None):
    return F.conv2d(x, w, b, padding=1)


def _inputs(requires_grad: bool = False):
    x, w, b = torch.randn(PROBLEM.input_shape), torch.randn(PROBLEM.weight_shape), torch.randn(PROBLEM.k)
    wd = w.to("opencl").requires_grad_(requires_grad)
    return x, w, b, x.to("opencl"), wd, b.to("opencl")


def _cache() -> dict[str, int]:
    return weight_cache.stats()


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> None:
    torch.testing.assert_close(y.detach().cpu(), _conv(x, w.detach().cpu(), b), **TOL)


def test_the_plan_is_winograd(winograd):
    x, w, b, xd, wd, bd = _inputs()
    with torch.no_grad():
        _check(_conv(xd, wd, bd), x, w, b)
    assert tunecl.backend.stats()["plans"][PROBLEM.key]["algorithm"] == winograd


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cached_result_equals_uncached(winograd, dtype, monkeypatch):
    # float16 through the float32 Winograd plan (on tensor-core GPUs a float16 plan would run instead)
    monkeypatch.setattr(conv_ops, "_half_plan", lambda *args: None)
    x, w, b, xd, wd, bd = _inputs()
    xd, wd, bd = xd.to(dtype), wd.to(dtype), bd.to(dtype)
    with torch.no_grad(), config.override(winograd_cache="off"):
        uncached = _conv(xd, wd, bd).cpu()
    assert _cache()["entries"] == 0
    with torch.no_grad():
        first = _conv(xd, wd, bd).cpu()    # transforms and keeps the weight
        second = _conv(xd, wd, bd).cpu()   # runs from the kept transform
    counts = _cache()
    assert (counts["entries"], counts["misses"], counts["hits"]) == (1, 1, 1)
    torch.testing.assert_close(first, uncached, rtol=0, atol=0)
    torch.testing.assert_close(second, uncached, rtol=0, atol=0)
    if dtype == torch.float32:
        _check(second, x, w, b)


def _add(w):
    with torch.no_grad():
        w.add_(1)


def _no_grad_copy(w):
    with torch.no_grad():
        w.copy_(torch.randn(w.shape))


def _data_copy(w):
    w.data.copy_(torch.randn(w.shape))   # .data has its own version counter: w._version stays


def _data_mul(w):
    w.data.mul_(-0.5)


def _view_add(w):
    with torch.no_grad():
        w[3:5, :, 1].add_(2)


def _alias_copy(w):
    # another tensor on the same storage with its own version counter
    alias = torch.empty(0, device="opencl").set_(w.untyped_storage(), w.storage_offset(), w.shape, w.stride())
    alias.copy_(torch.randn(w.shape))


def _storage_copy(w):
    w.untyped_storage().copy_(torch.randn(w.shape).untyped_storage())


def _sgd_step(w):
    w.grad = torch.randn(w.shape).to("opencl")
    torch.optim.SGD([w], lr=0.5).step()


def _fused_adam_step(w):
    w.grad = torch.randn(w.shape).to("opencl")
    torch.optim.Adam([w], lr=0.5, fused=True).step()


def _fused_sgd_step(w):   # fused steps leave w._version alone
    w.grad = torch.randn(w.shape).to("opencl")
    torch.optim.SGD([w], lr=0.5, fused=True).step()


def _uniform_init(w):
    torch.nn.init.uniform_(w.data, -3, 3)


UPDATES = {f.__name__.lstrip("_"): f for f in (_add, _no_grad_copy, _data_copy, _data_mul, _view_add, _alias_copy,
                                                _storage_copy, _sgd_step, _fused_adam_step, _fused_sgd_step,
                                                _uniform_init)}


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_an_updated_weight_is_transformed_again(winograd, update):
    x, _, b, xd, wd, bd = _inputs(requires_grad=update.endswith("step"))
    with torch.no_grad():
        _check(_conv(xd, wd, bd), x, wd, b)
        _conv(xd, wd, bd)
    assert _cache()["hits"] == 1
    before = wd.detach().cpu().clone()
    UPDATES[update](wd)
    assert not torch.equal(wd.detach().cpu(), before), "the update must change the weight"
    with torch.no_grad():
        _check(_conv(xd, wd, bd), x, wd, b)
        _check(_conv(xd, wd, bd), x, wd, b)
    counts = _cache()
    assert counts["entries"] == 1 and counts["hits"] == 2
    assert counts.get("invalidations", 0) + counts.get("stale", 0) >= 1


def test_writes_through_data_are_caught_without_the_version_counter(winograd):
    """``w.data`` writes do not move ``w._version``: the storage-level write report drops the entry."""
    x, _, b, xd, wd, bd = _inputs()
    with torch.no_grad():
        _conv(xd, wd, bd)
    version = wd._version
    wd.data.copy_(torch.randn(wd.shape))
    assert wd._version == version
    assert _cache()["entries"] == 0 and _cache()["invalidations"] == 1
    with torch.no_grad():
        _check(_conv(xd, wd, bd), x, wd, b)


def test_a_training_loop_sees_every_step(winograd):
    """Forward, backward (the input gradient runs the bwd_data plan) and a step, with the cache on for
    weights that require grad too."""
    x, _, b, xd, wd, bd = _inputs(requires_grad=True)
    xd.requires_grad_(True)
    optimizer = torch.optim.SGD([wd], lr=0.1)
    with config.override(winograd_cache="on"):
        for _ in range(3):
            optimizer.zero_grad()
            dy = torch.randn(PROBLEM.output_shape)
            y = _conv(xd, wd, bd)
            y.backward(dy.to("opencl"))
            xc = x.clone().requires_grad_(True)
            wc = wd.detach().cpu()
            _conv(xc, wc, b).backward(dy)
            torch.testing.assert_close(y.detach().cpu(), _conv(x, wc, b), **TOL)
            torch.testing.assert_close(xd.grad.cpu(), xc.grad, **TOL)
            xd.grad = None
            optimizer.step()
    # each step: the forward's transform and the flipped one of bwd_data, both dropped by the update
    counts = _cache()
    assert (counts["misses"], counts["invalidations"], counts["entries"]) == (6, 6, 0)


def test_entries_go_when_the_weight_is_deleted(winograd):
    _, _, _, xd, wd, bd = _inputs()
    with torch.no_grad():
        _conv(xd, wd, bd)
    held = _cache()["bytes"]
    assert held > 0 and memory.memory_stats()["allocated_bytes"] >= held
    allocated = memory.memory_stats()["allocated_bytes"]
    del wd
    gc.collect()
    counts = _cache()
    assert (counts["entries"], counts["bytes"], counts["freed"]) == (0, 0, 1)
    # the weight's block and the transform's went back to the allocator
    assert memory.memory_stats()["allocated_bytes"] <= allocated - held
    assert tunecl.backend.stats()["winograd_cache"]["entries"] == 0


def test_off_by_config_and_by_environment(winograd_plans, monkeypatch):
    """(Without ``strict``: inside any ``config.override`` block the environment is not read.)"""
    x, w, b, xd, wd, bd = _inputs()
    with torch.no_grad():
        with config.override(winograd_cache="off"):
            _check(_conv(xd, wd, bd), x, w, b)
        assert _cache()["entries"] == 0
        monkeypatch.setenv("TUNECL_WINOGRAD_CACHE", "off")
        _check(_conv(xd, wd, bd), x, w, b)
        assert _cache()["entries"] == 0
        monkeypatch.setenv("TUNECL_WINOGRAD_CACHE", "on")
        _conv(xd, wd, bd)
        assert _cache()["entries"] == 1
        monkeypatch.setenv("TUNECL_WINOGRAD_CACHE", "sometimes")
        with pytest.raises(ValueError, match="TUNECL_WINOGRAD_CACHE"):
            _conv(xd, wd, bd)


def test_auto_caches_inference_and_frozen_weights_only(winograd):
    x, w, b, xd, wd, bd = _inputs(requires_grad=True)
    xd.requires_grad_(True)
    _conv(xd, wd, bd).sum().backward()       # training: neither the forward nor bwd_data keeps it
    assert _cache()["entries"] == 0
    with torch.no_grad():
        _conv(xd, wd, bd)                    # evaluation
    assert _cache()["entries"] == 1
    with torch.inference_mode():
        _conv(xd, wd, bd)
    assert _cache()["hits"] == 1
    weight_cache.clear()
    wd.requires_grad_(False)                 # a frozen layer: its input gradient uses it too
    xd.grad = None
    _conv(xd, wd, bd).sum().backward()
    assert _cache()["entries"] == 2
    torch.testing.assert_close(xd.grad.cpu(), torch.autograd.grad(_conv(x.requires_grad_(True), w, b).sum(), x)[0],
                               **TOL)


def test_batch_sizes_share_one_transform(winograd):
    x, w, b, xd, wd, bd = _inputs()
    with torch.no_grad():
        _conv(xd, wd, bd)
        _check(_conv(xd[:1], wd, bd), x[:1], w, b)   # n=1: the near-batch lookup serves the n=2 result
    assert tunecl.backend.stats()["plans"][dataclasses.replace(PROBLEM, n=1).key]["algorithm"] == winograd
    assert (_cache()["entries"], _cache()["hits"]) == (1, 1)


def test_views_of_one_storage_are_separate_entries(winograd):
    x = torch.randn(PROBLEM.input_shape)
    both = torch.randn(2 * PROBLEM.k, PROBLEM.c, 3, 3)
    bothd = both.to("opencl")
    with torch.no_grad():
        for half_ in range(2):
            rows = slice(half_ * PROBLEM.k, (half_ + 1) * PROBLEM.k)
            _check(_conv(x.to("opencl"), bothd[rows]), x, both[rows])
            _check(_conv(x.to("opencl"), bothd[rows]), x, both[rows])
    assert (_cache()["entries"], _cache()["hits"]) == (2, 2)


def test_the_cap_evicts_the_least_recently_used(winograd, monkeypatch):
    x = torch.randn(PROBLEM.input_shape).to("opencl")
    weights = [torch.randn(PROBLEM.weight_shape).to("opencl") for _ in range(3)]
    with torch.no_grad():
        _conv(x, weights[0])
    one = _cache()["bytes"]
    monkeypatch.setattr(weight_cache, "settings", lambda: ("on", 2 * one))
    with torch.no_grad():
        _conv(x, weights[1])
        _conv(x, weights[0])     # used last: weights[1] is the least recently used now
        _conv(x, weights[2])
        _conv(x, weights[0])
    counts = _cache()
    assert (counts["entries"], counts["bytes"], counts["evictions"], counts["hits"]) == (2, 2 * one, 1, 2)
    monkeypatch.setattr(weight_cache, "settings", lambda: ("on", one - 1))
    with torch.no_grad():
        _conv(x, weights[1])     # larger than the cap: runs uncached
    assert _cache()["too_large"] == 1


def test_memory_pressure_drops_the_cache(winograd):
    x, w, b, xd, wd, bd = _inputs()
    with torch.no_grad():
        _conv(xd, wd, bd)
    assert _cache()["entries"] == 1
    memory.allocator._relieve()
    assert _cache()["entries"] == 0
    with torch.no_grad():
        _check(_conv(xd, wd, bd), x, w, b)


def test_transposed_convolution_uses_the_cache(fresh_plans, strict):
    """conv_transpose2d's forward is the regular convolution's bwd_data: a flipped transform."""
    _record(PROBLEM.with_direction("bwd_data"), "conv_winograd")
    weight_cache.clear()
    tunecl.backend.reset_stats()
    y = torch.randn(PROBLEM.output_shape)     # the transposed convolution's input
    w = torch.randn(PROBLEM.weight_shape)     # (in = K, out = C, 3, 3) for conv_transpose2d
    with torch.no_grad():
        for _ in range(2):
            got = F.conv_transpose2d(y.to("opencl"), w.to("opencl"), padding=1).cpu()
            torch.testing.assert_close(got, F.conv_transpose2d(y, w, padding=1), **TOL)
    assert (_cache()["misses"], _cache()["entries"]) == (2, 0)   # w.to() made a new storage each time
    wd = w.to("opencl")
    with torch.no_grad():
        F.conv_transpose2d(y.to("opencl"), wd, padding=1)
        F.conv_transpose2d(y.to("opencl"), wd, padding=1)
    assert _cache()["hits"] >= 1
    weight_cache.clear()


def test_plans_without_a_weight_transform_do_not_use_the_cache(fresh_plans, strict):
    weight_cache.clear()
    tunecl.backend.reset_stats()
    x, w = torch.randn(PROBLEM.input_shape), torch.randn(PROBLEM.weight_shape)
    with torch.no_grad():   # stride 2: no Winograd plan applies
        got = F.conv2d(x.to("opencl"), w.to("opencl"), stride=2, padding=1).cpu()
    torch.testing.assert_close(got, F.conv2d(x, w, stride=2, padding=1), **TOL)
    assert not weight_cache.can_transform(plans.cached(dataclasses.replace(PROBLEM, stride=(2, 2))).plan)
    assert _cache()["entries"] == 0 and "misses" not in _cache()
