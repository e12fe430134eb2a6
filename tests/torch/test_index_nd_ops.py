"""Advanced indexing on opencl vs CPU: ``x[i, j]``, ``index_put_`` (accumulate either way), ``index_add``,
``nonzero`` and ``masked_select``/``masked_scatter_``, forward and backward, over index layouts (adjacent,
split, broadcast, negative, int32, bool masks), odd and empty shapes, dtypes and strided views; every call
under ``TUNECL_FALLBACK=error``."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op, strided

i3 = torch.tensor([2, 0, -1])
j3 = torch.tensor([1, 4, 3])
INDEXINGS = [
    lambda x: x[i3],
    lambda x: x[:, j3],
    lambda x: x[i3, j3],                                   # adjacent pair
    lambda x: x[i3, :, torch.tensor([0, 1, 1])],           # split: the index dims go first
    lambda x: x[..., torch.tensor([[0, 1], [1, 0]])],      # a 2-d index
    lambda x: x[torch.tensor([[0], [2]]), j3],             # broadcast index tensors
    lambda x: x[:, torch.tensor([3, 3, 3, 0])],            # repeated (the gradient accumulates)
    lambda x: x[:, torch.tensor([1, 2], dtype=torch.int32)],
    lambda x: x[x > 0],                                    # a full mask
    lambda x: x[(x > 0).any(-1)],                          # a mask over the leading dims
    lambda x: x[torch.tensor([], dtype=torch.int64)],      # no positions
    lambda x: x[torch.tensor(1)],                          # a 0-d index
    lambda x: x[1:, torch.tensor([0, 2]), 1:],
]


@pytest.mark.parametrize("case", range(len(INDEXINGS)))
def test_index(case):
    check_op(INDEXINGS[case], torch.randn(3, 5, 4))


def test_index_of_strided_views_empty_dims_and_dtypes():
    check_op(lambda x: x[torch.tensor([1, 0]), torch.tensor([2, 2])], Input(torch.randn(5, 3), lambda v: v.t()))
    check_op(lambda x: x[:, :, torch.tensor([4, 0, 1])], strided(torch.randn(3, 4, 10)))
    check_op(lambda x: x[torch.tensor([0, 1])], torch.randn(2, 0, 3))
    for dtype in (torch.int64, torch.bool, torch.float16, torch.uint8, torch.int32):
        x = (torch.randn(4, 6) * 9).to(dtype)
        check_op(lambda v: (v[torch.tensor([3, 0]), torch.tensor([5, -6])], v[:, torch.tensor([1, 1])]), x)


def test_index_out_of_range_raises(strict):
    x = torch.randn(3, 4, device="opencl")
    with pytest.raises(IndexError, match="out of bounds"):
        x[torch.tensor([0, 3], device="opencl")]
    with pytest.raises(IndexError, match="out of bounds"):
        x[:, torch.tensor([-5], device="opencl")]
    with pytest.raises(IndexError):
        x[torch.ones(3, 3, dtype=torch.bool, device="opencl")]


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    """Positions do not repeat where accumulate is False (which write lands is unspecified then, as on
    CUDA); accumulating sums repeats by atomics (float sums may differ in the last bit run to run)."""
    rows = torch.tensor([2, 0, 4, 2, 2]) if accumulate else torch.tensor([2, 0, 4])
    n = rows.numel()
    check_op(lambda x, v: torch.index_put(x, (rows,), v, accumulate), torch.randn(5, 3), torch.randn(n, 3))
    check_op(lambda x, v: torch.index_put(x, (rows, torch.tensor([1] * n)), v, accumulate), torch.randn(5, 3),
             torch.randn(n))
    check_op(lambda x, v: torch.index_put(x, (rows,), v, accumulate), torch.randn(5, 3), torch.randn(3))
    check_op(lambda x, v: torch.index_put(x, (rows[:2],), v, accumulate), torch.randn(5, 2, 3), torch.randn(1, 3))
    check_op(lambda x, v: torch.index_put(x, (x[:, 0] > 0,), v, accumulate), torch.randn(5, 3), torch.randn(3))
    # in place on a strided view, and a scalar value through __setitem__
    def in_place(x):
        y = x.clone()
        y[:, ::2].index_put_((rows,), torch.ones(n, 2) if y.device.type == "cpu" else
                             torch.ones(n, 2, device="opencl"), accumulate=accumulate)
        z = x.clone()
        z[rows[:2]] = 7.0
        z[z < -1] = 0.5
        return y, z
    check_op(in_place, torch.randn(5, 4))


def test_index_put_of_integers_and_bad_input(strict):
    x = torch.zeros(6, dtype=torch.int32)
    rows = torch.tensor([1, 3, 1, 1])
    d = x.to("opencl")
    d.index_put_((rows.to("opencl"),), torch.tensor([1, 2, 3, 4], dtype=torch.int32, device="opencl"), True)
    x.index_put_((rows,), torch.tensor([1, 2, 3, 4], dtype=torch.int32), True)
    assert torch.equal(d.cpu(), x)
    e = torch.zeros(6, dtype=torch.int64, device="opencl")
    e[torch.tensor([5, 0], device="opencl")] = torch.tensor([9, 8], device="opencl")
    assert e.cpu().tolist() == [8, 0, 0, 0, 0, 9]
    with pytest.raises(RuntimeError, match="shape mismatch"):
        torch.zeros(4, 3, device="opencl").index_put_((torch.tensor([0, 1], device="opencl"),),
                                                      torch.ones(3, 3, device="opencl"))


INDEX_ADDS = [((5, 3), 0, [0, 4, 4, 1]), ((5, 3), 1, [2, 2]), ((2, 4, 3), 1, [3, 0, 1]), ((6,), 0, [5, 5, 0]),
              ((4, 3), -1, [0]), ((4, 0), 0, [1, 1]), ((3, 2), 0, [])]


@pytest.mark.parametrize("shape,dim,rows", INDEX_ADDS)
@pytest.mark.parametrize("alpha", [1, 2.5])
def test_index_add(shape, dim, rows, alpha):
    index = torch.tensor(rows, dtype=torch.int64)
    source_shape = list(shape)
    source_shape[dim] = len(rows)
    check_op(lambda x, i, s: torch.index_add(x, dim, i, s, alpha=alpha), torch.randn(shape), index,
             torch.randn(source_shape))


def test_index_add_in_place_strided_and_int32():
    check_op(lambda x, s: x.clone().t().index_add_(0, torch.tensor([1, 1, 0]).to(x.device), s), torch.randn(3, 4),
             torch.randn(3, 3))
    check_op(lambda x, s: torch.index_add(x, 0, torch.tensor([2, 0, 2], dtype=torch.int32).to(x.device), s),
             torch.randint(-5, 5, (3, 2), dtype=torch.int32), torch.randint(-5, 5, (3, 2), dtype=torch.int32))
    check_op(lambda x, s: torch.index_add(x, 0, torch.tensor(0).to(x.device), s), torch.tensor(1.5),
             torch.tensor(2.0))


NONZERO_SHAPES = [(7,), (3, 5), (2, 3, 4), (0,), (3, 0), (1, 1), (2, 1, 3, 1, 2)]


@pytest.mark.parametrize("shape", NONZERO_SHAPES)
def test_nonzero_and_masked_select(shape):
    x = torch.randn(shape)
    x[x.abs() < 0.5] = 0
    check_op(lambda v: (torch.nonzero(v), torch.nonzero(v > 0), torch.where(v != 0)), x)
    check_op(lambda v: torch.masked_select(v, v > 0), x)


def test_masked_select_broadcast_0d_strided_and_dtypes():
    mask = torch.tensor([True, False, True, True])
    check_op(lambda v: torch.masked_select(v, mask.to(v.device)), torch.randn(3, 4))
    check_op(lambda v: torch.masked_select(v, (v > 0).any(0, keepdim=True)), torch.randn(3, 4))
    check_op(lambda v: torch.masked_select(v, v > 0), Input(torch.randn(5, 6), lambda v: v.t()[::2]))
    for value in (1.5, -1.0):
        check_op(lambda v: (torch.masked_select(v, v > 0), torch.nonzero(v)), torch.tensor(value))
    for dtype in (torch.int64, torch.bool, torch.float16):
        x = (torch.randn(4, 5) * 3).to(dtype)
        check_op(lambda v: (torch.masked_select(v, v != 0), torch.nonzero(v)), x)


def test_masked_scatter(strict):
    x, source = torch.randn(3, 5), torch.randn(20)
    mask = torch.randn(3, 5) > 0
    d = x.to("opencl").masked_scatter_(mask.to("opencl"), source.to("opencl"))
    assert torch.equal(d.cpu(), x.clone().masked_scatter_(mask, source))
    row = torch.tensor([True, False, False, True, True])
    e = x.to("opencl").t().masked_scatter_(row.to("opencl")[:, None], source.to("opencl"))
    assert torch.equal(e.cpu(), x.clone().t().masked_scatter_(row[:, None], source))
    with pytest.raises(RuntimeError):
        x.to("opencl").masked_scatter_(torch.ones(3, 5, dtype=torch.bool, device="opencl"), source[:3].to("opencl"))
