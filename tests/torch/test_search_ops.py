"""``torch.searchsorted`` and ``torch.bucketize`` on the device against CPU torch: both sides, ties, NaN among
the values and the boundaries, a sorter, one boundary row shared or one per leading index, mixed dtypes,
scalars, int32 results, views, empty operands, ``out=``, and torch's errors."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op

NAN = float("nan")
# CPU torch's notes on non-contiguous operands (the views below are deliberate)
pytestmark = pytest.mark.filterwarnings("ignore:.*non-contiguous, this will lower the performance")


def _fixed(t: torch.Tensor) -> Input:
    return Input(t, grad=False)


@pytest.mark.parametrize("right", [False, True])
def test_ties_nan_and_both_sides(strict, right):
    boundaries = torch.tensor([1.0, 2.0, 2.0, 3.0, NAN])
    values = torch.tensor([[0.0, 1.0, 2.0, 2.5, 3.0, 4.0, NAN]])
    check_op(lambda s, v: torch.searchsorted(s, v, right=right), _fixed(boundaries), _fixed(values), grad=False)
    check_op(lambda s, v: torch.searchsorted(s, v, side="right" if right else "left"), _fixed(boundaries),
             _fixed(values), grad=False)
    check_op(lambda v, s: torch.bucketize(v, s[:4], right=right), _fixed(values), _fixed(boundaries), grad=False)


@pytest.mark.parametrize("values_shape", [(3, 6), (3, 1), (3, 0)])
def test_one_boundary_row_per_leading_index(strict, values_shape):
    boundaries = torch.randn(3, 10).sort(-1).values
    values = torch.randn(values_shape)
    check_op(lambda s, v: torch.searchsorted(s, v), _fixed(boundaries), _fixed(values), grad=False)
    check_op(lambda s, v: torch.searchsorted(s, v, right=True, out_int32=True), _fixed(boundaries), _fixed(values),
             grad=False)
    batched = torch.randn(2, 3, 7).sort(-1).values
    check_op(lambda s, v: torch.searchsorted(s, v), _fixed(batched), _fixed(torch.randn(2, 3, 4)), grad=False)


def test_sorter(strict):
    unsorted = torch.randn(3, 10)
    values = torch.randn(3, 6)
    for right in (False, True):
        check_op(lambda s, v, o: torch.searchsorted(s, v, right=right, sorter=o), _fixed(unsorted), _fixed(values),
                 _fixed(unsorted.argsort(-1)), grad=False)
    flat = torch.randn(12)
    check_op(lambda s, v, o: torch.searchsorted(s, v, sorter=o), _fixed(flat), _fixed(torch.randn(5, 4)),
             _fixed(flat.argsort()), grad=False)


def test_dtypes_scalars_and_views(strict):
    check_op(lambda s, v: torch.searchsorted(s, v), _fixed(torch.arange(10)), _fixed(torch.tensor([3.5, -1.0, 20.0])),
             grad=False)
    check_op(lambda s, v: torch.searchsorted(s, v), _fixed(torch.arange(10).int()),
             Input(torch.randint(-2, 12, (4, 5)), lambda v: v.t(), grad=False), grad=False)
    check_op(lambda s, v: torch.bucketize(v, s), _fixed(torch.tensor([-3, 0, 5], dtype=torch.int8)),
             _fixed(torch.randint(-6, 8, (20,), dtype=torch.int8)), grad=False)
    check_op(lambda s, v: torch.searchsorted(s, v), _fixed(torch.linspace(-2, 2, 9).half()),
             _fixed(torch.randn(30).half()), grad=False)
    check_op(lambda s, v: torch.searchsorted(s[::2], v), _fixed(torch.arange(20.0)), _fixed(torch.randn(8) * 10),
             grad=False)
    check_op(lambda s: (torch.searchsorted(s, 4), torch.searchsorted(s, 4.5, right=True)),
             _fixed(torch.arange(10)), grad=False)
    check_op(lambda s: torch.bucketize(4.5, s, out_int32=True), _fixed(torch.arange(10.0)), grad=False)
    check_op(lambda s, v: torch.searchsorted(s, v), _fixed(torch.tensor([])), _fixed(torch.tensor([1.0, 2.0])),
             grad=False)
    check_op(lambda s, v: torch.searchsorted(s, v), _fixed(torch.arange(5.0)), _fixed(torch.empty(0)), grad=False)


def test_out_arguments(strict):
    s, v = torch.arange(10.0).to("opencl"), (torch.randn(2, 3) * 5).to("opencl")
    out = torch.empty(0, dtype=torch.int64, device="opencl")
    torch.searchsorted(s, v, out=out)
    assert torch.equal(out.cpu(), torch.searchsorted(s.cpu(), v.cpu()))
    strided = torch.zeros(3, 4, dtype=torch.int32, device="opencl")[:, ::2]
    torch.bucketize(v.t(), s, out_int32=True, out=strided)
    assert torch.equal(strided.cpu(), torch.bucketize(v.cpu().t(), s.cpu(), out_int32=True))
    with pytest.raises(RuntimeError, match="dtype"):
        torch.searchsorted(s, v, out=torch.empty(0, dtype=torch.int32, device="opencl"))


@pytest.mark.parametrize("call, message", [
    (lambda d: torch.searchsorted(torch.randn(3, 5, device=d), torch.randn(2, 4, device=d)), "first N-1 dimensions"),
    (lambda d: torch.searchsorted(torch.randn(3, 5, device=d), 1.0), "scalar only"),
    (lambda d: torch.searchsorted(torch.arange(5.0, device=d), torch.randn(3, device=d),
                                  sorter=torch.tensor([0, 1, 2, 3, 5], device=d)), "out of range"),
    (lambda d: torch.searchsorted(torch.arange(5.0, device=d), torch.randn(3, device=d),
                                  sorter=torch.tensor([0, 1, 2], device=d)), "same size"),
    (lambda d: torch.bucketize(torch.randn(3, device=d), torch.randn(2, 5, device=d)), "1 dimension"),
])
def test_bad_calls_raise_torch_errors(strict, call, message):
    for device in ("cpu", "opencl"):
        with pytest.raises(RuntimeError, match=message):
            call(device)
