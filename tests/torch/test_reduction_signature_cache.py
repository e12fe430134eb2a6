"""Pre-built sum/mean calls (ops/reduction.py's functional fast paths, Reduce.prepare): a signature's launch is
built once and enqueued again with new buffers; every result equals, bit for bit, what the ``.out`` route
gives, and matches CPU torch, under everything that can change between calls."""

from __future__ import annotations

import pytest
import torch
from opcheck import same_results

from tunecl.backend import counters, state
from tunecl.backend.ops import reduction
from tunecl.kernels.ops import reduce as reduce_kernels
from tunecl.profiling import KernelProfile

DEV = "opencl"
OPS = {"sum": (torch.sum, torch.ops.aten.sum.IntList_out), "mean": (torch.mean, torch.ops.aten.mean.out)}


@pytest.fixture
def calls(strict):
    table = state.get().reduce.calls
    table.clear()
    yield table
    table.clear()


def _built(table):
    return {key: call for key, call in table.items() if call is not None}


def _out_route(op, x, dim, keepdim):
    """The same reduction through the ``.out`` kernel (torch's structured route)."""
    fn, out_overload = OPS[op]
    meta = torch.empty(x.shape, device="meta")
    out = torch.empty((fn(meta, dim, keepdim) if dim is not None else fn(meta)).shape, device=DEV)
    return out_overload(x, [] if dim is None else dim, keepdim, out=out)


def _check(op, x, dim=None, keepdim=False):
    fn = OPS[op][0]
    result = fn(x, dim, keepdim) if dim is not None else fn(x)
    same_results(result, _out_route(op, x, dim, keepdim))
    expected = fn(x.cpu(), dim, keepdim) if dim is not None else fn(x.cpu())
    torch.testing.assert_close(result.cpu(), expected, atol=1e-5, rtol=1e-5)
    return result


CASES = [((16,), None, False), ((3, 5, 7), None, False), ((3, 5, 7), 1, False), ((3, 5, 7), (0, 2), True),
         ((3, 5, 7), [-1], False), ((3, 5, 7), [], False), ((1, 1), 0, True), ((300, 70), 0, False),
         ((2, 4097), -1, True)]


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("shape, dim, keepdim", CASES, ids=lambda v: str(v).replace(" ", ""))
def test_repeated_calls_are_built_once_and_match_the_out_route_and_cpu(calls, op, shape, dim, keepdim):
    for i in range(3):
        x = torch.randn(shape, device=DEV) + i
        _check(op, x, dim, keepdim)
    built = _built(calls)
    assert len(built) == 1
    assert all(isinstance(call.prepared, reduce_kernels.Prepared) for call in built.values())


def test_a_call_makes_no_second_trip_through_python(calls, fresh_stats):
    x = torch.randn(4, 6, device=DEV)
    x.sum()
    counters.op_counts.clear()
    x.sum()
    x.mean(0)
    assert dict(counters.op_counts) == {"aten::sum": 1, "aten::mean.dim": 1}


def test_new_shapes_strides_offsets_and_dims_get_their_own_calls(calls):
    base = torch.randn(4 * 6 + 3, device=DEV)
    x = base[:24].view(4, 6)
    shifted = base[3:].view(4, 6)                    # an offset
    transposed = x.t()                               # other strides
    for t in (x, shifted, transposed, x, shifted, transposed):
        for dim in (None, 0, 1):
            for op in OPS:
                _check(op, t, dim)
    keys = list(_built(calls))
    assert len(keys) == 3 * 3 * 2
    assert len({(key[1], key[2], key[3]) for key in keys}) == 3


@pytest.mark.parametrize("call", [
    lambda x: x.sum(dtype=torch.float16), lambda x: x.half().sum(), lambda x: x.sum((0, 0)),
    lambda x: x.sum(5), lambda x: torch.tensor(2.5, device=DEV).sum(), lambda x: x[:0].sum(0),
    lambda x: x.long().sum(), lambda x: x.bool().sum(1), lambda x: x.long().mean()], ids=[
    "dtype_arg", "float16", "repeated_dim", "dim_out_of_range", "zero_dim", "empty", "int64", "bool", "int_mean"])
def test_other_calls_take_torch_s_route(calls, call):
    """Other dtypes, empty and 0-dim inputs, and dims torch refuses: the result (or the error) is torch's."""
    x = torch.randn(3, 4)

    def outcome(t):
        try:
            return call(t).cpu()
        except Exception as error:   # noqa: BLE001 (the CPU's own exception is the reference)
            return type(error), str(error).splitlines()[0]

    expected, actual = outcome(x), outcome(x.to(DEV))
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, atol=1e-2, rtol=1e-3)
    else:
        assert actual == expected
    assert not _built(calls)


def test_graph_capture_records_the_same_commands(calls):
    x = torch.randn(5, 9, device=DEV)
    x.sum()
    x.sum()                                          # built
    assert _built(calls)
    graphs_made, outputs = [], []
    for route in (lambda: x.sum(), lambda: _out_route("sum", x, None, False)):
        g = torch.opencl.Graph()
        with torch.opencl.graph(g):
            outputs.append(route())
        graphs_made.append(g)
    assert graphs_made[0].commands == graphs_made[1].commands > 0
    x.mul_(2.0)
    for g in graphs_made:
        g.replay()
    torch.opencl.synchronize()
    same_results(outputs[0], outputs[1])
    torch.testing.assert_close(outputs[0].cpu(), x.cpu().sum())
    for g in graphs_made:
        g.reset()


def test_a_kernel_profile_sees_the_launch(calls):
    x = torch.randn(5, 9, device=DEV)
    for _ in range(2):
        x.sum(1)
    with KernelProfile() as fast:
        x.sum(1)
        torch.opencl.synchronize()
    with KernelProfile() as general:
        _out_route("sum", x, 1, False)
        torch.opencl.synchronize()
    assert fast.commands == general.commands == 1
    assert {row.name for row in fast.summary()} == {row.name for row in general.summary()}


def test_the_cache_is_bounded(calls, monkeypatch):
    monkeypatch.setattr(reduction, "MAX_CALLS", 3)
    for n in range(1, 8):
        _check("sum", torch.randn(n, 3, device=DEV), 0)
        assert len(state.get().reduce.calls) <= 3
    assert _built(calls)


def test_a_new_state_has_its_own_calls(calls, monkeypatch):
    x = torch.randn(4, 5, device=DEV)
    x.sum()
    built = _built(calls)
    monkeypatch.setattr(state, "_state", state.State(state.get().device))
    assert not state.get().reduce.calls
    _check("sum", x)
    assert _built(state.get().reduce.calls) and all(
        call is not built.get(key) for key, call in _built(state.get().reduce.calls).items())
