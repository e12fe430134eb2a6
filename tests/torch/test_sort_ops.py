"""sort, topk and isin on opencl vs CPU: sorts along every dim, ascending and descending, stable (ties in
input order), NaN, odd lengths (past powers of two, one, empty), 0-d, dtypes, strided views and out=, with gradients;
every call under ``TUNECL_FALLBACK=error``."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op, strided

SHAPES = [(7,), (1,), (0,), (3, 5), (4, 1, 6), (2, 3, 17), (1025,), (3, 0, 2), (2, 33, 3)]


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_sort_along_every_dim(shape, descending):
    x = torch.randn(shape)
    for dim in range(-len(shape), len(shape)):
        check_op(lambda v, d=dim: torch.sort(v, dim=d, descending=descending), x)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_is_stable_and_orders_nan_last(descending):
    x = torch.randint(0, 4, (5, 40)).float()
    x[1, 3] = x[2, 7] = x[2, 9] = float("nan")
    x[3, :5] = float("inf")
    x[4, :5] = -0.0
    check_op(lambda v: torch.sort(v, dim=1, descending=descending, stable=True), x)
    check_op(lambda v: torch.sort(v, dim=0, descending=descending, stable=True), x)


def test_sort_of_strided_views_0d_and_out():
    check_op(lambda v: torch.sort(v, 0), Input(torch.randn(6, 9), lambda v: v.t()))
    check_op(lambda v: torch.sort(v, 1, descending=True), strided(torch.randn(3, 5, 10)))
    check_op(lambda v: torch.sort(v, 1), Input(torch.randn(4, 3, 5, 6), lambda v: v[::2, :, 1:, ::2].permute(0, 3, 2, 1)))
    check_op(lambda v: torch.sort(v), torch.tensor(2.5))

    def into_out(v):
        values, indices = torch.empty(0, device=v.device), torch.empty(0, dtype=torch.int64, device=v.device)
        torch.sort(v.detach(), 1, out=(values, indices))
        return values, indices
    check_op(into_out, torch.randn(3, 11))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
                                   torch.float16])
def test_sort_of_other_dtypes(dtype):
    x = (torch.randn(4, 37) * 50).to(dtype)
    # (float16's gradient is a scatter, which the device's scatter kernel takes in float32 only)
    check_op(lambda v: (torch.sort(v, dim=1, stable=True), torch.sort(v, dim=0, descending=True, stable=True)),
             Input(x, grad=False))


TOPKS = [((10,), 3, -1), ((3, 17), 5, 1), ((6, 4), 6, 0), ((2, 9, 3), 1, 1), ((5, 1), 1, 1), ((4, 7), 0, 1),
         ((0, 5), 2, 1), ((3, 1030), 10, 1)]


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("shape,k,dim", TOPKS)
def test_topk(shape, k, dim, largest):
    # distinct values: which of several equal elements torch's CPU topk picks is its own choice
    x = torch.randperm(max(1, torch.Size(shape).numel())).float()[:torch.Size(shape).numel()].reshape(shape)
    check_op(lambda v: torch.topk(v, k, dim, largest=largest), x)
    check_op(lambda v: torch.topk(v, k, dim, largest=largest, sorted=False)[0].sort(dim)[0], x)


def test_topk_of_strided_views_0d_dtypes_and_bad_input(strict):
    check_op(lambda v: torch.topk(v, 2, 0), Input(torch.randn(6, 9), lambda v: v.t()))
    check_op(lambda v: torch.topk(v, 1), torch.tensor(2.5))
    x = torch.randperm(60).reshape(5, 12)
    for dtype in (torch.int64, torch.int32, torch.float16):
        check_op(lambda v: torch.topk(v, 4, 1), Input(x.to(dtype), grad=False))
    with pytest.raises(RuntimeError, match="out of range"):
        torch.topk(torch.randn(3, 4, device="opencl"), 5)


ISIN_CASES = [((3, 7), (5,)), ((20,), (4, 3)), ((0,), (3,)), ((4,), (0,)), ((), (6,)), ((2, 3, 4), (1,)),
              ((1000,), (257,))]


@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize("shape,test_shape", ISIN_CASES)
def test_isin(shape, test_shape, invert):
    elements, test = torch.randint(-10, 10, shape), torch.randint(-10, 10, test_shape)
    check_op(lambda e, t: torch.isin(e, t, invert=invert), elements, test)
    check_op(lambda e, t: torch.isin(e, t, invert=invert), elements.float() / 2, test.float() / 2)


def test_isin_the_kernels_do_not_search_runs_on_the_cpu_with_its_result_and_errors():
    """bfloat16 elements (no search kernel): the CPU fallback's answer, not an error; an ``out`` of another
    dtype than bool: CPU torch's error."""
    import warnings

    from tunecl import config

    elements, test = torch.tensor([1.0, 2.0, 3.0]).bfloat16(), torch.tensor([2.0, 5.0]).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (the fallback's warning)
        got = torch.isin(elements.to("opencl"), test.to("opencl"), invert=True)
    assert got.device.type == "opencl" and got.cpu().tolist() == torch.isin(elements, test, invert=True).tolist()
    with config.override(fallback="error"), pytest.raises(RuntimeError, match="isin of torch.bfloat16"):
        torch.isin(elements.to("opencl"), test.to("opencl"))
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype bool"):
        torch.isin(torch.ones(2, device="opencl"), torch.ones(1, device="opencl"),
                   out=torch.empty(2, device="opencl"))


def test_isin_of_mixed_dtypes_nan_scalars_and_strided_views(strict):
    e = torch.tensor([1.0, float("nan"), 2.5, -0.0, 3.0])
    t = torch.tensor([float("nan"), 0.0, 3.0])
    check_op(lambda a, b: torch.isin(a, b), e, t)
    check_op(lambda a, b: torch.isin(a, b), torch.tensor([1, 2, 3, 250], dtype=torch.uint8), torch.tensor([2, 250]))
    check_op(lambda a, b: torch.isin(a, b), torch.arange(6, dtype=torch.int32), torch.tensor([1.0, 4.5, 5.0]))
    check_op(lambda a, b: torch.isin(a, b), torch.randint(0, 5, (4, 6)).half(), torch.tensor([1.0, 3.0]).half())
    check_op(lambda a: torch.isin(a, 3), torch.randint(0, 5, (4, 6)))
    check_op(lambda b: (torch.isin(3, b), torch.isin(7, b, invert=True)), torch.tensor([1, 3, 5]))
    check_op(lambda a, b: torch.isin(a, b), Input(torch.randint(0, 9, (6, 5)), lambda v: v.t()[::2]),
             Input(torch.randint(0, 9, (4, 4)), lambda v: v[:, 1]))


@pytest.mark.parametrize("k, dim, keepdim", [(1, 1, False), (3, 1, True), (6, 1, False), (2, 0, False), (4, -2, True)])
def test_kthvalue(strict, k, dim, keepdim):
    """Values and indices of the k-th smallest (distinct values; NaN counts as the largest, as in torch)."""
    x = torch.randperm(24).float().view(4, 6) - 11.5
    x[1, 2] = float("nan")
    check_op(lambda x: torch.kthvalue(x, k, dim, keepdim), Input(x))
    check_op(lambda x: torch.kthvalue(x.t(), k if dim else min(k, 4), 1 - dim % 2, keepdim), Input(x))


def test_kthvalue_of_a_0_dim_tensor_and_bad_k(strict):
    check_op(lambda x: torch.kthvalue(x, 1), Input(torch.tensor(2.5)))
    for device in ("cpu", "opencl"):
        with pytest.raises(RuntimeError, match="out of range"):
            torch.randn(3, 4, device=device).kthvalue(5, 1)


@pytest.mark.parametrize("dim, keepdim", [(0, False), (1, True), (-1, False)])
def test_median_along_a_dim(strict, dim, keepdim):
    """The lower median and its index (distinct values); a row with NaN gives NaN at its first NaN."""
    x = torch.randperm(20).float().view(4, 5) - 7.0
    check_op(lambda x: torch.median(x, dim, keepdim), Input(x))
    nan = float("nan")
    with_nan = torch.tensor([[1.0, nan, 2.0, 5.0], [4.0, 3.0, 2.0, 1.0], [nan, 1.0, nan, 0.0]])
    check_op(lambda x: torch.median(x, dim, keepdim), Input(with_nan, grad=False), grad=False)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_nanmedian_along_a_dim(strict, dim, keepdim):
    """The lower median of the elements that are not NaN, and its index (distinct values)."""
    x = torch.randperm(20).float().view(4, 5) - 7.0
    check_op(lambda x: torch.nanmedian(x, dim, keepdim), Input(x))
    nan = float("nan")
    with_nan = torch.tensor([[1.0, nan, 2.0, 5.0], [4.0, 3.0, 2.0, 1.0], [nan, 1.0, nan, 0.0], [7.0, nan, nan, 6.0]])
    check_op(lambda x: torch.nanmedian(x, dim, keepdim), Input(with_nan, grad=False), grad=False)
    check_op(lambda x: torch.nanmedian(x, dim, keepdim), Input(torch.randint(-5, 5, (3, 4)), grad=False),
             grad=False)


def test_nanmedian_of_everything_and_of_nan_only(strict):
    nan = float("nan")
    check_op(torch.nanmedian, Input(torch.tensor([3.0, nan, 1.0, 2.0, nan, 4.0]), grad=False), grad=False)
    check_op(torch.nanmedian, Input(torch.randperm(12).float().view(3, 4)))
    check_op(torch.nanmedian, Input(torch.empty(0), grad=False), grad=False)
    check_op(torch.nanmedian, Input(torch.tensor(3.0)))
    # a row of NaNs only: NaN (CPU torch's index there is wherever its partial sort leaves one: not compared)
    values = torch.nanmedian(torch.full((2, 4), nan, device="opencl"), 1).values
    assert values.isnan().all()
    for device in ("cpu", "opencl"):
        with pytest.raises(IndexError, match="non-zero size"):
            torch.empty(2, 0, device=device).nanmedian(1)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_mode(strict, dim, keepdim):
    """The most frequent value (the smallest of a tie) and the index of its last occurrence, as CPU torch."""
    ties = torch.tensor([[5.0, 1, 1, 5, 5, 1, 2], [3, 3, 3, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]])
    check_op(lambda x: torch.mode(x, dim, keepdim), Input(ties))
    generator = torch.Generator().manual_seed(0)
    check_op(lambda x: torch.mode(x, dim, keepdim), Input(torch.randint(0, 4, (5, 6), generator=generator).float()))
    check_op(lambda x: torch.mode(x, dim, keepdim), Input(torch.randint(-3, 3, (4, 7), generator=generator)))
    check_op(lambda x: torch.mode(x.t(), dim, keepdim),
             Input(torch.randint(0, 3, (6, 5), generator=generator).half(), grad=False), grad=False)


def test_mode_of_a_0_dim_tensor_and_of_no_elements(strict):
    check_op(lambda x: torch.mode(x), Input(torch.tensor(4.0)))
    check_op(lambda x: torch.mode(x, 0), Input(torch.tensor([7.0])))
    for device in ("cpu", "opencl"):
        with pytest.raises(IndexError, match="non-zero size"):
            torch.empty(2, 0, device=device).mode(1)


def test_median_of_everything(strict):
    check_op(torch.median, Input(torch.randperm(25).float().view(5, 5)))
    check_op(torch.median, Input(torch.tensor([3.0, 1.0, 2.0, 4.0])))   # even count: the lower one
    check_op(torch.median, Input(torch.tensor([1.0, float("nan"), 2.0]), grad=False), grad=False)
    check_op(torch.median, Input(torch.empty(0), grad=False), grad=False)
    check_op(torch.median, Input(torch.tensor(3.0)))
    check_op(torch.median, Input(torch.arange(7), grad=False), grad=False)
    for device in ("cpu", "opencl"):
        with pytest.raises(IndexError, match="non-zero size"):
            torch.empty(2, 0, device=device).median(1)
