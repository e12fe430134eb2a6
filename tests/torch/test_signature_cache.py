"""Pre-built convolution calls (ops/conv.py, tunecl.kernels.launches): a signature's launches are recorded
once and enqueued again with new buffers; every result equals, bit for bit, what the general route
(each plan's own ``run``) gives, under everything that can change between calls."""

from __future__ import annotations

import pytest
import torch
from opcheck import same_results

import tunecl.backend
from tunecl import config
from tunecl.backend import plans, state, weight_cache
from tunecl.backend.ops import conv as conv_ops
from tunecl.db import TuningDB
from tunecl.kernels import algorithm, launches
from tunecl.problems import ConvProblem
from tunecl.profiling import KernelProfile

aten = torch.ops.aten
PROBLEM = ConvProblem(2, 8, 10, 9, 12, 3, 3, padding=1)


def _forward(x, w, b=None, padding=1, stride=1, groups=1):
    return aten.convolution(x, w, b, [stride, stride], [padding, padding], [1, 1], False, [0, 0], groups)


def _backward(dy, x, w, padding=1, mask=(True, True, True)):
    return aten.convolution_backward(dy, x, w, [w.shape[0]], [1, 1], [padding, padding], [1, 1], False, [0, 0], 1,
                                     list(mask))


def _general(fn, *args, **kwargs):
    """``fn`` with the pre-built calls bypassed: the general route."""
    saved = conv_ops._fast_forward, conv_ops._fast_backward
    conv_ops._fast_forward = conv_ops._fast_backward = lambda *a, **k: None
    try:
        return fn(*args, **kwargs)
    finally:
        conv_ops._fast_forward, conv_ops._fast_backward = saved


def _built(kind: str = "fwd") -> list:
    return [call for key, call in conv_ops._calls.items() if key[0] == kind and call is not None]


def _recorded(call) -> bool:
    directions = [call.direction] if hasattr(call, "direction") else [call.data, call.weight]
    return any(d is not None and (d.full.launches or d.transformed.launches) for d in directions)


@pytest.fixture
def winograd(fresh_plans, strict):
    """Winograd plans for PROBLEM (forward and input gradient), an empty weight cache and no pre-built calls."""
    device = state.get().device
    winograd = algorithm("conv_winograd")
    for direction in ("fwd", "bwd_data"):
        problem = PROBLEM.with_direction(direction)
        TuningDB(config.get().db_url).record(device.fingerprint, problem, winograd.name, winograd.version,
                                             winograd.default(problem, device), time_s=1e-4)
    weight_cache.clear()
    conv_ops._calls.clear()
    yield
    weight_cache.clear()


def _inputs(requires_grad=False):
    x = torch.randn(PROBLEM.input_shape, device="opencl")
    w = torch.randn(PROBLEM.weight_shape, device="opencl").requires_grad_(requires_grad)
    b = torch.randn(PROBLEM.k, device="opencl")
    return x, w, b


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_repeated_calls_are_recorded_once_and_match_the_general_route(winograd, grad):
    x, w, b = _inputs(requires_grad=grad)
    dy = torch.randn(2, PROBLEM.k, PROBLEM.p, PROBLEM.q, device="opencl")
    with torch.set_grad_enabled(grad):
        for _ in range(3):
            same_results(_forward(x, w.detach() if not grad else w, b), _general(_forward, x, w, b))
            same_results(_backward(dy, x, w), _general(_backward, dy, x, w))
    (fwd,), (bwd,) = _built("fwd"), _built("bwd")
    assert _recorded(fwd) and _recorded(bwd)


def test_new_shapes_strides_offsets_and_dtypes_get_their_own_calls(winograd):
    x, w, b = _inputs()
    with torch.no_grad():
        same_results(_forward(x, w, b), _general(_forward, x, w, b))
        bigger = torch.randn(3, *PROBLEM.input_shape[1:], device="opencl")      # a new batch
        same_results(_forward(bigger, w, b), _general(_forward, bigger, w, b))
        storage = torch.randn(x.numel() + 5, device="opencl")
        shifted = storage[5:].view(x.shape)                                    # a new storage offset
        shifted.copy_(x)
        same_results(_forward(shifted, w, b), _general(_forward, shifted, w, b))
        same_results(_forward(shifted, w, b), _forward(x, w, b))
        wide = torch.randn(*PROBLEM.weight_shape[:3], 2 * PROBLEM.s, device="opencl")[..., ::2]
        assert not wide.is_contiguous()                                        # new strides: the general route
        same_results(_forward(x, wide, b), _general(_forward, x, wide.contiguous(), b))
        half = x.half(), w.half(), b.half()                                    # a new dtype
        same_results(_forward(*half), _general(_forward, *half))
        keys = [key for key in conv_ops._calls if key[0] == "fwd"]
    assert len(keys) == 5 and len({key[1] for key in keys}) == 4   # (x, bigger, shifted; None: not float32)
    assert [conv_ops._calls[key] is None for key in keys].count(True) == 2   # the strided and the half ones


def test_tf32_flags_pick_their_own_call(winograd):
    x, w, b = _inputs()
    before = torch.backends.cudnn.allow_tf32
    try:
        with torch.no_grad():
            for allow in (True, False, True):
                torch.backends.cudnn.allow_tf32 = allow
                same_results(_forward(x, w, b), _general(_forward, x, w, b))
                (call,) = [c for k, c in conv_ops._calls.items() if k[0] == "fwd" and k[-1] == plans.accepted_precisions("conv")]
                assert call.direction.plan is plans.cached(PROBLEM).plan
    finally:
        torch.backends.cudnn.allow_tf32 = before
    assert len(_built("fwd")) == 2


@pytest.mark.parametrize("write", ["in_place", "through_data", "fused_adam"])
def test_a_weight_written_behind_its_cached_transform_is_transformed_again(winograd, write):
    x, w, b = _inputs()
    with torch.no_grad():
        _forward(x, w, b)
        _forward(x, w, b)
        assert weight_cache.stats()["hits"] >= 1
        if write == "in_place":
            w.mul_(-0.5)
        elif write == "through_data":
            w.data.copy_(torch.randn(PROBLEM.weight_shape))
    if write == "fused_adam":
        p = torch.nn.Parameter(w)
        with torch.no_grad():
            _forward(x, p, b)
        p.grad = torch.ones_like(p)
        torch.optim.Adam([p], lr=0.1, fused=True).step()
        w = p.detach()
    with torch.no_grad():
        same_results(_forward(x, w, b), _general(_forward, x, w, b))
        same_results(_forward(x, w, b), _general(_forward, x, w, b))


def test_graph_capture_records_the_launches_of_the_general_route(winograd):
    x, w, b = _inputs()
    with torch.no_grad():
        _forward(x, w, b)
        _forward(x, w, b)                         # recorded, then pre-built
        assert _recorded(_built("fwd")[0])
        graphs_made = []
        for route in (_forward, lambda *a: _general(_forward, *a)):
            expected = _general(_forward, x, w, b)
            g = torch.opencl.Graph()
            graphs_made.append(g)
            with torch.opencl.graph(g):
                y = route(x, w, b)
            g.replay()
            same_results(y, expected)
            x.copy_(torch.randn(PROBLEM.input_shape))
            w.mul_(2.0)                           # replays transform the weight again
            g.replay()
            same_results(y, _general(_forward, x, w, b))
        assert graphs_made[0].commands == graphs_made[1].commands
        for g in graphs_made:
            g.reset()


def test_a_kernel_profile_sees_every_launch(winograd):
    x, w, b = _inputs()
    with torch.no_grad():
        _forward(x, w, b)
        _forward(x, w, b)
        with KernelProfile() as fast:
            y = _forward(x, w, b)
            torch.opencl.synchronize()
        with KernelProfile() as general:
            _general(_forward, x, w, b)
            torch.opencl.synchronize()
    assert fast.commands == general.commands > 0
    same_results(y, _general(_forward, x, w, b))


def test_cleared_plans_and_a_new_state_drop_the_calls(winograd, monkeypatch):
    x, w, b = _inputs()
    with torch.no_grad():
        _forward(x, w, b)
        (call,) = _built("fwd")
        plans.clear()                                # a device reset / new tuning DB: plans chosen again
        same_results(_forward(x, w, b), _general(_forward, x, w, b))
        (again,) = _built("fwd")
        assert again is not call and again.direction.plan is plans.cached(PROBLEM).plan
        monkeypatch.setattr(state, "_state", state.State(state.get().device))   # a new backend state
        same_results(_forward(x, w, b), _general(_forward, x, w, b))
        (third,) = _built("fwd")
        assert third is not again


def test_the_cache_is_bounded(winograd, monkeypatch):
    monkeypatch.setattr(conv_ops, "MAX_CALLS", 3)
    w = torch.randn(4, 3, 1, 1, device="opencl")
    with torch.no_grad():
        for n in range(1, 8):
            x = torch.randn(n, 3, 4, 4, device="opencl")
            same_results(_forward(x, w, padding=0), _general(_forward, x, w, padding=0))
            assert len(conv_ops._calls) <= 3


def test_a_recording_refuses_copies_and_a_busy_swap_lock():
    device = state.get().device
    buffer = device.alloc(16)
    with launches.recording() as recorder:
        device.copyin(buffer, torch.zeros(4).numpy())
    assert recorder.refused is not None and recorder.launches([buffer]) is None
    with KernelProfile(), launches.recording() as busy:
        assert busy is None


def test_a_recording_takes_waits_for_its_own_launches_only():
    """A launch that waits for an earlier launch of the same recording (a split reduction's second launch)
    is recorded (the in-order queue orders them anyway); one that waits for another event refuses it."""
    device = state.get().device
    buffer = device.alloc(64)
    kernel = device.kernel(device.build("__kernel void k(__global float *x) { x[get_global_id(0)] = 1.0f; }"),
                           "k")
    with launches.recording() as recorder:
        first = device.launch(kernel, (4,), None, buffer)
        device.launch(kernel, (4,), None, buffer, wait_for=[first])
    assert recorder.refused is None and recorder.launches([buffer]) is not None
    before = device.launch(kernel, (4,), None, buffer)
    with launches.recording() as recorder:
        device.launch(kernel, (4,), None, buffer, wait_for=[before])
    assert recorder.refused is not None and recorder.launches([buffer]) is None


@pytest.mark.parametrize("name", ["conv_direct", "conv_implicit_gemm"])
def test_split_weight_gradients_are_recorded_and_match_the_general_route(fresh_plans, strict, name):
    """A weight gradient whose plan splits its reduction (two launches, or one that finishes the split
    itself) is pre-built like any other, and gives the general route's results bit for bit."""
    device = state.get().device
    chosen = algorithm(name)
    problem = PROBLEM.with_direction("bwd_weight")
    chosen_config = next(c for c in chosen.space(problem, device).configs() if c["SPLIT"] > 1)
    TuningDB(config.get().db_url).record(device.fingerprint, problem, chosen.name, chosen.version, chosen_config,
                                         time_s=1e-5)
    conv_ops._calls.clear()
    for _ in range(3):
        x, w, _ = _inputs()
        dy = torch.randn(PROBLEM.output_shape, device="opencl")
        same_results(_backward(dy, x, w, mask=(False, True, False)),
                     _general(_backward, dy, x, w, mask=(False, True, False)))
    (call,) = _built("bwd")
    assert call.weight.full.launches


def test_stats_count_every_call(winograd, fresh_stats):
    x, w, b = _inputs()
    with torch.no_grad():
        for _ in range(4):
            _forward(x, w, b)
    assert sum(fresh_stats()["plan_sources"].values()) == 4
    assert tunecl.backend.stats()["winograd_cache"]["hits"] == 3
