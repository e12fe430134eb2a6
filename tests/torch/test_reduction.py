"""Reductions and softmax on opencl vs CPU, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op, t

REDUCTIONS = {
    "sum": lambda x: x.sum(1), "sum_all": lambda x: x.sum(), "sum_keep": lambda x: x.sum((0, 2), keepdim=True),
    "mean": lambda x: x.mean(-1), "mean_all": lambda x: x.mean(), "amax": lambda x: x.amax(1),
    "amin": lambda x: x.amin((0, 1)), "max_all": lambda x: x.max(), "min_all": lambda x: x.min(),
    "max_dim": lambda x: x.max(2), "min_dim": lambda x: x.min(0, keepdim=True), "argmax": lambda x: x.argmax(1),
    "argmax_all": lambda x: x.argmax(), "argmin": lambda x: x.argmin(-1, keepdim=True),
    "var": lambda x: x.var(1), "std_all": lambda x: x.std(), "var_unbiased0": lambda x: x.var(0, correction=0),
    "var_mean": lambda x: torch.var_mean(x, (0, 2)), "std_mean": lambda x: torch.std_mean(x, 1),
    "norm2": lambda x: torch.linalg.vector_norm(x), "norm1": lambda x: torch.linalg.vector_norm(x, 1, dim=1),
    "norm_inf": lambda x: torch.linalg.vector_norm(x, float("inf"), dim=0),
    "norm3": lambda x: torch.linalg.vector_norm(x, 3, dim=(1, 2)), "prod": lambda x: x.prod(1),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_of_permuted_input(name):
    x = torch.randn(3, 5, 4)
    check_op(REDUCTIONS[name], Input(x, lambda v: v.permute(1, 0, 2)), atol=2e-5)


@pytest.mark.parametrize("shape,dim", [((3, 1000), 1), ((1000, 3), 0), ((2, 300, 5), (0, 1)), ((4096, 2), 1)])
def test_long_and_many_reductions(shape, dim):
    x = torch.randn(*shape)
    check_op(lambda v: v.sum(dim), x, atol=1e-4)
    check_op(lambda v: v.mean(dim), x)
    check_op(lambda v: v.var(dim), x, atol=1e-4)
    check_op(lambda v: v.amax(dim), x)


def test_argmax_ties_and_nan_follow_torch():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("nan"), 1.0, float("nan"), 5.0], [2.0, 2.0, 2.0, 2.0]])
    check_op(lambda v: v.argmax(1), x, grad=False)
    check_op(lambda v: v.argmin(1), x, grad=False)
    check_op(lambda v: v.max(1), x, grad=False)
    check_op(lambda v: v.amax(1), x, grad=False)


def test_integer_and_bool_reductions():
    i = torch.randint(-50, 50, (6, 7))
    check_op(lambda v: v.sum(), i)
    check_op(lambda v: v.sum(0), i)
    check_op(lambda v: (v > 0).sum(1), i)
    check_op(lambda v: v.amax(1), i)
    check_op(lambda v: v.argmin(0), i)


def test_zero_dim_and_empty_reductions():
    check_op(lambda v: v.sum(), torch.tensor(2.5))
    check_op(lambda v: v.mean(0), torch.tensor(2.5))
    check_op(lambda v: v.sum(1), torch.randn(0, 3))
    check_op(lambda v: v.sum(0), torch.randn(0, 3))
    check_op(lambda v: v.amax(1), torch.randn(0, 3))
    with pytest.raises((RuntimeError, IndexError)):
        torch.empty(0, device="opencl").max()


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((4, 10), 1), ((4, 10), 0), ((2, 3, 5), 1), ((3, 500), -1), ((), 0)])
def test_softmax(fn, shape, dim):
    check_op(lambda v: fn(v, dim), torch.randn(shape) * 3)


def test_softmax_of_transposed_input():
    check_op(lambda v: F.log_softmax(v, 1), t(torch.randn(7, 5)))


def test_gather_scatter_index_select():
    x = torch.randn(4, 6)
    idx = torch.randint(0, 6, (4, 3))
    check_op(lambda v, i: torch.gather(v, 1, i), x, idx, grad=False)
    check_op(lambda v, i: torch.gather(v, 0, i), t(torch.randn(6, 5)), torch.randint(0, 5, (2, 6)), grad=False)
    check_op(lambda v, i, s: v.scatter(1, i, s), x, torch.tensor([[0, 1], [2, 3], [4, 5], [1, 0]]), torch.randn(4, 5),
             grad=False)
    check_op(lambda v, i: v.scatter(0, i, -1.0), x, torch.tensor([[3, 2, 1, 0, 1, 2]]), grad=False)
    check_op(lambda v, i: torch.index_select(v, 1, i), x, torch.tensor([5, 0, 0, 2]), grad=False)
    check_op(lambda v, i: torch.index_select(v, 0, i), torch.arange(12).reshape(3, 4), torch.tensor([2, 0]))


def test_float16_moves_its_bits_unchanged(strict):
    x = torch.tensor([[1.0, -0.0, float("inf"), float("nan"), 6.1e-5, 65504.0]]).half().repeat(4, 1)
    x[1:] = torch.randn(3, 6).half()
    check_op(lambda v, i: torch.gather(v, 1, i), x, torch.randint(0, 6, (4, 3)), grad=False)
    check_op(lambda v, i: torch.index_select(v, 1, i), x, torch.tensor([5, 0, 3, 2, 1]), grad=False)
    check_op(lambda v, i, s: v.scatter(1, i, s), x, torch.tensor([[0, 1], [2, 3], [4, 5], [1, 0]]),
             torch.randn(4, 5).half(), grad=False)
    check_op(lambda v, i: v.scatter(0, i, -1.5), t(x), torch.tensor([[3, 2, 1, 0]]), grad=False)
    check_op(lambda v, i: v.index_fill(1, i, 0.333), x, torch.tensor([1, 4]), grad=False)


def test_any_all():
    x = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    for fn in (torch.any, torch.all, lambda v: v.any(1), lambda v: v.all(0, keepdim=True),
               lambda v: v.any((0, 1)), lambda v: (v > 0).all(1)):
        check_op(fn, x, grad=False)


@pytest.mark.parametrize("call", [
    lambda w, i: torch.index_select(w, 0, i),
    lambda w, i: torch.gather(w, 0, i.view(-1, 1).expand(-1, 4)),
    lambda w, i: torch.nn.functional.embedding(i, w),
    lambda w, i: w.clone().scatter_(0, i.view(-1, 1).expand(-1, 4), 1.0),
])
def test_an_index_out_of_range_raises_at_the_next_wait(strict, call):
    w = torch.randn(10, 4, device="opencl")
    for bad in ([3, 12], [-1, 0]):   # (negative indices too, as on the CPU)
        result = call(w, torch.tensor(bad, device="opencl"))   # enqueued: the error comes at the next wait
        with pytest.raises(IndexError, match="index out of range"):
            result.cpu()
    call(w, torch.tensor([12], device="opencl"))
    with pytest.raises(IndexError, match="index out of range"):
        torch.opencl.synchronize()
    good = call(w, torch.tensor([9, 0], device="opencl"))   # the fault is cleared
    torch.testing.assert_close(good.cpu(), call(w.cpu(), torch.tensor([9, 0])))
