"""scatter_add and scatter_reduce ("sum", "mean", "amax", "amin") on the device (graph nets' message passing),
forward and backward against CPU torch, with repeated indices, include_self either way, NaN, integers, and
torch's errors; index_fill_ lives in test_math_and_reduction_ops.py."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op

from tunecl import config

CASES = [((5, 4), (7, 4), 0), ((5, 4), (3, 2), 1), ((2, 3, 4), (2, 3, 6), 2), ((6,), (9,), 0), ((4, 3), (2, 3), -2)]


def _case(shape, index_shape, dim, grad=True):
    """self, index, src (of the index's shape; without gradients larger: only its leading block is read, and
    torch's backward cannot give a larger src its gradient)."""
    index = torch.randint(0, shape[dim], index_shape)
    src_shape = index_shape if grad else [n + 1 for n in index_shape]
    return Input(torch.randn(shape), grad=grad), index, Input(torch.randn(src_shape), grad=grad)


@pytest.mark.parametrize("shape, index_shape, dim", CASES)
def test_scatter_add(strict, shape, index_shape, dim):
    x, index, src = _case(shape, index_shape, dim)
    check_op(lambda x, s: x.scatter_add(dim, index.to(x.device), s), x, src)
    check_op(lambda x, s: x.clone().scatter_add_(dim, index.to(x.device), s), x, src)
    x, index, src = _case(shape, index_shape, dim, grad=False)
    check_op(lambda x, s: x.scatter_add(dim, index.to(x.device), s), x, src, grad=False)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("shape, index_shape, dim", CASES)
def test_scatter_reduce(strict, reduce, include_self, shape, index_shape, dim):
    for grad in (True, False):
        x, index, src = _case(shape, index_shape, dim, grad)
        check_op(lambda x, s: x.scatter_reduce(dim, index.to(x.device), s, reduce, include_self=include_self), x, src,
                 grad=grad)


def test_scatter_add_of_a_0_dim_tensor_an_empty_index_and_int32_indices(strict):
    check_op(lambda x, s: x.scatter_add(0, torch.tensor(0, device=x.device), s), Input(torch.tensor(1.5)),
             Input(torch.tensor(2.0)))
    check_op(lambda x, s: x.scatter_add(0, torch.zeros(0, 3, dtype=torch.long, device=x.device), s),
             Input(torch.randn(2, 3)), Input(torch.randn(0, 3)))
    check_op(lambda x, s: x.scatter_add(1, torch.tensor([[2, 2], [0, 1]], dtype=torch.int32, device=x.device), s),
             Input(torch.randn(2, 3)), Input(torch.randn(2, 2)))


@pytest.mark.parametrize("call, message", [
    (lambda d: torch.zeros(3, 3, device=d).scatter_add(0, torch.zeros(2, 4, dtype=torch.long, device=d),
                                                       torch.ones(2, 4, device=d)), "no larger than self"),
    (lambda d: torch.zeros(3, 3, device=d).scatter_add(0, torch.zeros(2, dtype=torch.long, device=d),
                                                       torch.ones(2, device=d)), "same number of dimensions"),
    (lambda d: torch.zeros(3, 3, device=d).scatter_add(0, torch.full((2, 3), 5, device=d),
                                                       torch.ones(2, 3, device=d)), "out of bounds|out of range"),
    (lambda d: torch.zeros(3, 3, device=d).scatter_add(0, torch.zeros(2, 3, dtype=torch.long, device=d),
                                                       torch.ones(2, 3, dtype=torch.float16, device=d)),
     "self.dtype to be equal to src.dtype"),
    (lambda d: torch.zeros(3, 3, device=d).scatter_reduce(0, torch.zeros(2, 3, dtype=torch.long, device=d),
                                                          torch.ones(2, 3, device=d), "bad"), "reduce argument"),
])
def test_bad_scatters_raise_torch_errors(strict, call, message):
    for device in ("cpu", "opencl"):
        with pytest.raises((RuntimeError, IndexError), match=message):
            call(device)


@pytest.mark.parametrize("reduce", ["amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_extremes_with_nan_ties_integers_and_views(strict, reduce, include_self):
    nan = float("nan")
    index = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    src = torch.tensor([1.0, nan, 3.0, 2.0, 5.0, 5.0, -1.0])   # NaN wins its position; ties
    for self in (torch.zeros(4), torch.tensor([nan, 9.0, -9.0, 1.0])):
        check_op(lambda x, s: x.scatter_reduce(0, index.to(x.device), s, reduce, include_self=include_self),
                 Input(self, grad=False), Input(src, grad=False), grad=False)
    check_op(lambda x, s: x.scatter_reduce(0, index.to(x.device), s, reduce, include_self=include_self),
             torch.randint(-5, 5, (4,)), torch.randint(-9, 9, (7,)))
    view_index = torch.randint(0, 3, (4, 2))
    check_op(lambda x, s: x[:, ::2].scatter_reduce(1, view_index.to(x.device), s.t(), reduce,
                                                   include_self=include_self),
             Input(torch.randn(4, 6), grad=False), Input(torch.randn(2, 4), grad=False), grad=False)


def test_prod_takes_the_counted_cpu_fallback(fresh_stats):
    x, index, src = torch.randn(5, 4), torch.randint(0, 5, (7, 4)), torch.randn(7, 4)
    with config.override(fallback="silent"):   # (warn mode warns once per process: another test may have)
        got = x.to("opencl").scatter_reduce(0, index.to("opencl"), src.to("opencl"), "prod")
    torch.testing.assert_close(got.cpu(), x.scatter_reduce(0, index, src, "prod"))
    assert [op for op in fresh_stats()["fallback_ops"] if "scatter_reduce" in op]


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_copy(strict, dim):
    index = torch.tensor([3, 0]) if dim == 0 else torch.tensor([4, 1])
    size = [2, 5] if dim == 0 else [4, 2]
    check_op(lambda x, s: x.index_copy(dim, index.to(x.device), s), Input(torch.randn(4, 5)), Input(torch.randn(size)))
    check_op(lambda x, s: x.clone().index_copy_(dim, index.to(x.device), s.t().t()), Input(torch.randn(4, 5)),
             Input(torch.randn(size)))
    for device in ("cpu", "opencl"):
        with pytest.raises(IndexError, match="Number of indices"):
            torch.zeros(4, 5, device=device).index_copy(dim, index.to(device), torch.ones(4, 5, device=device))
