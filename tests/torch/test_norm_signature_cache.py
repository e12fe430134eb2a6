"""Pre-built batch-norm calls (ops/nn.py, BatchNorm.prepare_forward / prepare_backward,
tunecl.kernels.launches.Bound): a signature's launches are built once and enqueued again with new buffers;
every result equals, bit for bit, what the general route (BatchNorm.forward / backward) gives, under
everything that can change between calls."""

from __future__ import annotations

import pytest
import torch
from opcheck import same_results

from tunecl.backend import state
from tunecl.backend.ops import nn as nn_ops
from tunecl.kernels.ops import norm as norm_kernels
from tunecl.profiling import KernelProfile

aten = torch.ops.aten
DEV = "opencl"
SHAPE = (2, 6, 5, 4)   # L = 20: the float4 kernels


@pytest.fixture
def norm(strict):
    """The backend's BatchNorm with no pre-built calls before and after the test."""
    instance = state.get().norm
    instance.forget_launches()
    yield instance
    instance.forget_launches()


def _general(fn, *args):
    """``fn(*args)`` with the pre-built calls bypassed: the general route."""
    saved = nn_ops._fast_batch_norm, nn_ops._fast_batch_norm_backward
    nn_ops._fast_batch_norm = nn_ops._fast_batch_norm_backward = lambda *a, **k: None
    try:
        return fn(*args)
    finally:
        nn_ops._fast_batch_norm, nn_ops._fast_batch_norm_backward = saved


def _params(c, dtype=torch.float32):
    g = torch.Generator().manual_seed(c)
    weight, bias = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
    mean, var = torch.randn(c, generator=g) * 0.1, torch.rand(c, generator=g) + 0.5
    return [t.to(DEV, dtype) for t in (weight, bias, mean, var)]


class _Pair:
    """The same batch-norm layer twice (own running statistics each): one for the pre-built route, one for
    the general route."""

    def __init__(self, c, dtype=torch.float32, stats_dtype=None):
        self.fast, self.general = _params(c, stats_dtype or dtype), _params(c, stats_dtype or dtype)

    def forward(self, x, training, momentum=0.1, eps=1e-5, affine=True, running=True):
        outs = []
        for route, (w, b, rm, rv) in ((lambda f, *a: f(*a), self.fast), (_general, self.general)):
            args = (x, w if affine else None, b if affine else None, rm if running else None,
                    rv if running else None, training, momentum, eps)
            outs.append(route(aten.native_batch_norm, *args))
        same_results(*outs)
        same_results(tuple(self.fast[2:]), tuple(self.general[2:]))   # the running statistics, updated in place
        return outs[0]

    def backward(self, dy, x, saved, train, eps=1e-5, mask=(True, True, True), affine=True):
        w, _, rm, rv = self.fast
        args = (dy, x, w if affine else None, rm, rv, saved[1], saved[2], train, eps, list(mask))
        result = aten.native_batch_norm_backward(*args)
        same_results(result, _general(aten.native_batch_norm_backward, *args))
        return result


def _built():
    return {key: call for key, call in state.get().norm.calls.items() if call is not None}


def test_repeated_calls_are_built_once_and_match_the_general_route(norm):
    c = SHAPE[1]
    pair = _Pair(c)
    for i in range(3):
        x, dy = torch.randn(SHAPE, device=DEV) + i, torch.randn(SHAPE, device=DEV)
        saved = pair.forward(x, True)
        pair.backward(dy, x, saved, True)
    calls = _built()
    assert [key[0] for key in calls] == ["fwd", "bwd"]
    assert all(isinstance(call.prepared, norm_kernels.Prepared) for call in calls.values())


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("running", [True, False], ids=["running", "no_running"])
def test_every_operand_set_and_output_mask(norm, affine, running):
    c = SHAPE[1]
    pair = _Pair(c)
    x, dy = torch.randn(SHAPE, device=DEV), torch.randn(SHAPE, device=DEV)
    for _ in range(2):
        saved = pair.forward(x, True, affine=affine, running=running)
        for mask in ((True, True, True), (True, False, False), (False, True, True), (False, False, True)):
            pair.backward(dy, x, saved, True, mask=mask, affine=affine)


def test_new_shapes_offsets_and_scalars_get_their_own_calls(norm):
    pair = _Pair(3)
    for shape in ((4, 3, 7, 7), (1, 3, 9), (5, 3), (4, 3, 2052)):   # scalar and float4 kernels, P > 1 (2052)
        x = torch.randn(shape, device=DEV)
        pair.forward(x, True)
        pair.forward(x, True)
    storage = torch.randn(4 * 3 * 49 + 3, device=DEV)
    shifted = storage[3:].view(4, 3, 7, 7)                                 # an offset: the scalar kernels
    pair.forward(shifted, True)
    pair.forward(shifted, True, momentum=0.3, eps=1e-3)                    # new scalars
    pair.forward(shifted, True, momentum=0.3, eps=1e-3)
    keys = [key for key in state.get().norm.calls if key[0] == "fwd"]
    assert len(keys) == 6 and len({(key[1], key[3]) for key in keys}) == 5


def test_eval_and_train_switch(norm):
    pair = _Pair(SHAPE[1])
    x, dy = torch.randn(SHAPE, device=DEV), torch.randn(SHAPE, device=DEV)
    for training in (True, False, True, False):
        saved = pair.forward(x, training)
        pair.backward(dy, x, saved if training else (None, None, None), training)
    _, mean, invstd = pair.forward(x, False)
    assert mean.shape == invstd.shape == (0,)
    assert {(key[0], key[8] if key[0] == "fwd" else key[12]) for key in _built()} == {
        ("fwd", True), ("fwd", False), ("bwd", True), ("bwd", False)}


def test_non_contiguous_input_and_statistics_take_the_general_route(norm):
    pair = _Pair(SHAPE[1])
    x = torch.randn(SHAPE[0], SHAPE[1], SHAPE[3], SHAPE[2], device=DEV).transpose(2, 3)
    assert not x.is_contiguous()
    pair.forward(x, True)
    pair.forward(x.contiguous(memory_format=torch.channels_last), True)
    assert not _built()
    wide = torch.randn(2 * SHAPE[1], device=DEV)[::2]                     # a strided weight
    args = (torch.randn(SHAPE, device=DEV), wide, None, None, None, True, 0.1, 1e-5)
    same_results(aten.native_batch_norm(*args), _general(aten.native_batch_norm, *args))
    assert [call for call in state.get().norm.calls.values()] == [None]


def test_float16_takes_the_general_route(norm):
    pair = _Pair(SHAPE[1], stats_dtype=torch.float32)
    x, dy = torch.randn(SHAPE, device=DEV).half(), torch.randn(SHAPE, device=DEV).half()
    for _ in range(2):
        saved = pair.forward(x, True)
        assert saved[0].dtype == torch.float16
        pair.backward(dy, x, saved, True)
    assert not _built()


def test_an_in_place_relu_still_folds_into_the_normalising_launch(norm, monkeypatch):
    device = state.get().device
    folded, replace = [], device.replace_held
    monkeypatch.setattr(device, "replace_held", lambda tag, op="relu": folded.append(replace(tag, op)) or folded[-1])
    pair = _Pair(SHAPE[1])
    x = torch.randn(SHAPE, device=DEV)
    results = []
    for route in (lambda f, *a: f(*a), _general, lambda f, *a: f(*a)):
        w, b, rm, rv = pair.fast
        y = route(aten.native_batch_norm, x, w, b, rm, rv, True, 0.1, 1e-5)[0]
        results.append(route(aten.relu_, y))
    assert folded == [True, True, True]
    same_results(results[0], results[1])
    same_results(results[2], results[1])
    assert (results[0].cpu() >= 0).all()
    # a relu of another tensor, or one that comes after another launch, does not fold
    y = aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)[0]
    other = torch.randn(SHAPE, device=DEV)
    expected = _general(aten.native_batch_norm, x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)[0]
    other.relu_()
    same_results(y, expected)
    same_results(y.relu_(), expected.relu_())


def test_graph_capture_records_the_same_commands(norm):
    pair = _Pair(SHAPE[1])
    w, b, rm, rv = pair.fast
    x, dy = torch.randn(SHAPE, device=DEV), torch.randn(SHAPE, device=DEV)

    def step(route):
        y, mean, invstd = route(aten.native_batch_norm, x, w, b, rm, rv, True, 0.1, 1e-5)
        y = route(aten.relu_, y)
        return (y, *route(aten.native_batch_norm_backward, dy, x, w, rm, rv, mean, invstd, True, 1e-5,
                          [True, True, True]))

    fast = lambda f, *a: f(*a)
    step(fast)
    step(fast)                                    # built
    assert len(_built()) == 2
    graphs_made, outputs = [], []
    for route in (fast, _general):
        g = torch.opencl.Graph()
        with torch.opencl.graph(g):
            outputs.append(step(route))
        graphs_made.append(g)
    assert graphs_made[0].commands == graphs_made[1].commands > 0
    for g in graphs_made:
        g.replay()
    torch.opencl.synchronize()
    same_results(tuple(outputs[0]), tuple(outputs[1]))
    for g in graphs_made:
        g.reset()


def test_a_kernel_profile_sees_every_launch(norm):
    pair = _Pair(SHAPE[1])
    w, b, rm, rv = pair.fast
    x = torch.randn(SHAPE, device=DEV)
    for _ in range(2):
        aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
    with KernelProfile() as fast:
        y = aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)[0].relu_()
        torch.opencl.synchronize()
    with KernelProfile() as general:
        _general(lambda: aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)[0].relu_())
        torch.opencl.synchronize()
    assert fast.commands == general.commands > 0
    assert {row.name for row in fast.summary()} == {row.name for row in general.summary()}
    assert (y.cpu() >= 0).all()


def test_the_cache_is_bounded_and_forget_launches_drops_it(norm, monkeypatch):
    monkeypatch.setattr(nn_ops, "MAX_CALLS", 3)
    pair = _Pair(2)
    for n in range(1, 8):
        pair.forward(torch.randn(n, 2, 4, device=DEV), True)
        assert len(state.get().norm.calls) <= 3
    assert _built()
    norm.forget_launches()
    assert not norm.calls
    pair.forward(torch.randn(3, 2, 4, device=DEV), True)
    pair.forward(torch.randn(3, 2, 4, device=DEV), True)


def test_forced_parts_get_their_own_calls(norm):
    pair = _Pair(3)
    x = torch.randn(4, 3, 50, device=DEV)
    for parts in (None, 3, None, 3):
        norm.force_parts = parts
        try:
            saved = pair.forward(x, True)
            pair.backward(torch.randn(4, 3, 50, device=DEV), x, saved, True)
        finally:
            norm.force_parts = None
    assert len(_built()) == 4


def test_a_new_state_has_its_own_calls(norm, monkeypatch):
    pair = _Pair(SHAPE[1])
    x = torch.randn(SHAPE, device=DEV)
    pair.forward(x, True)
    built = _built()
    monkeypatch.setattr(state, "_state", state.State(state.get().device))
    assert not state.get().norm.calls
    pair.forward(x, True)
    assert _built() and all(call is not built.get(key) for key, call in _built().items())
