"""cumsum and cumprod on opencl vs CPU along every dim, forward and backward, over odd shapes, dtypes (the
result dtype rules included), strided views, zeros in cumprod's input (its backward's special cases), in place
and out=; every call under ``TUNECL_FALLBACK=error``."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op, strided

SHAPES = [(7,), (1,), (0,), (3, 5), (4, 1, 6), (2, 3, 4, 5), (1000,), (3, 257), (5, 0, 2), (2, 6, 3, 2, 2)]


@pytest.mark.parametrize("shape", SHAPES)
def test_cumsum_along_every_dim(shape):
    x = torch.randn(shape)
    for dim in range(-len(shape), len(shape)):
        check_op(lambda v, d=dim: torch.cumsum(v, d), x, atol=2e-5, rtol=1e-5)


def test_cumsum_of_a_0d_tensor():
    check_op(lambda v: (torch.cumsum(v, 0), torch.cumsum(v, -1)), torch.tensor(2.5))


def test_cumsum_of_strided_views():
    check_op(lambda v: v.cumsum(0), Input(torch.randn(6, 9), lambda v: v.t()))
    check_op(lambda v: v.cumsum(1), strided(torch.randn(3, 5, 10)))
    check_op(lambda v: v.cumsum(2), Input(torch.randn(4, 6, 8), lambda v: v.transpose(0, 2)))
    # batch dims that do not merge into two: through contiguous copies
    check_op(lambda v: v.cumsum(1), Input(torch.randn(4, 3, 5, 6), lambda v: v[::2, :, 1:, ::2].permute(0, 3, 2, 1)))


def test_cumsum_of_a_long_line_against_float64(strict):
    x = torch.randn(100_003, dtype=torch.float64)
    actual = torch.cumsum(x.float().to("opencl"), 0)
    torch.testing.assert_close(actual.cpu().double(), torch.cumsum(x, 0), atol=2e-3, rtol=1e-4)
    assert torch.equal(actual.cpu(), torch.cumsum(x.float().to("opencl"), 0).cpu())   # the same bits run to run


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
def test_cumsum_of_integers(dtype):
    x = (torch.randn(4, 37) * 50).to(dtype)
    check_op(lambda v: (v.cumsum(0), v.cumsum(1), v.cumsum(1, dtype=dtype if dtype != torch.bool else torch.int32)), x)


def test_cumsum_dtype_argument_and_float16(strict):
    x = torch.randn(3, 40)
    i = torch.randint(-100, 100, (3, 40))
    for value, dtype in ((x, torch.float16), (i, torch.float32), (x.half(), torch.float32), (i, torch.int16),
                         (x * 10, torch.int64)):
        actual = torch.cumsum(value.to("opencl"), 1, dtype=dtype)
        expected = torch.cumsum(value, 1, dtype=dtype)
        assert actual.dtype == expected.dtype
        if dtype.is_floating_point:
            torch.testing.assert_close(actual.cpu(), expected, atol=2e-2 if dtype == torch.float16 else 1e-5,
                                       rtol=1e-3 if dtype == torch.float16 else 1e-5)
        else:
            assert torch.equal(actual.cpu(), expected)
    h = x.half()
    torch.testing.assert_close(torch.cumsum(h.to("opencl"), 1).cpu().float(), torch.cumsum(h.float(), 1),
                               atol=2e-2, rtol=1e-3)


def test_cumsum_in_place_and_out(strict):
    x = torch.randn(5, 8)
    d = x.to("opencl")
    d.cumsum_(1)
    d[:, ::2].cumsum_(0)
    e = x.clone()
    e.cumsum_(1)
    e[:, ::2].cumsum_(0)
    torch.testing.assert_close(d.cpu(), e, atol=1e-5, rtol=1e-5)
    out = torch.empty(0, device="opencl")
    torch.cumsum(x.to("opencl"), 0, out=out)
    torch.testing.assert_close(out.cpu(), torch.cumsum(x, 0))
    with pytest.raises(RuntimeError, match="dtype"):
        torch.cumsum(x.to("opencl"), 0, out=torch.empty(0, dtype=torch.int64, device="opencl"))
    with pytest.raises(IndexError):
        torch.cumsum(x.to("opencl"), 2)


def _near_one(shape: tuple[int, ...]) -> torch.Tensor:
    """Factors whose products stay near 1 over long lines, so the comparison is not of overflow."""
    return (1 + 0.05 * torch.randn(shape, dtype=torch.float64)).float()


@pytest.mark.parametrize("shape", SHAPES)
def test_cumprod_along_every_dim(shape):
    x = _near_one(shape)
    for dim in range(-len(shape), len(shape)):
        check_op(lambda v, d=dim: torch.cumprod(v, d), x, atol=2e-5, rtol=1e-4)


def test_cumprod_with_zeros_views_and_0d(strict):
    # one zero, several zeros, a zero first and last in a line: the backward's branches around zeros
    x = torch.tensor([[1.5, 0.0, 2.0, -3.0], [0.0, 0.0, 1.0, 2.0], [2.0, -1.0, 0.5, 0.0], [0.5, 2.0, -1.5, 1.0]])
    for dim in (0, 1):
        check_op(lambda v, d=dim: v.cumprod(d), x)
        check_op(lambda v, d=dim: v.cumprod(d), Input(x, lambda v: v.t()))
    check_op(lambda v: v.cumprod(1), strided(_near_one((3, 5, 10))))
    check_op(lambda v: (v.cumprod(0), v.cumprod(-1)), torch.tensor(-2.5))


def test_cumprod_of_integers_dtypes_in_place_and_out(strict):
    i = torch.randint(-3, 4, (4, 9))
    check_op(lambda v: (v.cumprod(1), v.cumprod(0, dtype=torch.float32), v.int().cumprod(1)), i)
    check_op(lambda v: v.cumprod(1, dtype=torch.float16), _near_one((2, 30)), grad=False, atol=5e-3,
             rtol=2e-3)   # products in float32 rounded once; CPU torch rounds each to float16
    d = _near_one((5, 8)).to("opencl")
    e = d.cpu()
    d[:, ::2].cumprod_(0)
    e[:, ::2].cumprod_(0)
    torch.testing.assert_close(d.cpu(), e)
    out = torch.empty(0, device="opencl")
    torch.cumprod(d, 1, out=out)
    torch.testing.assert_close(out.cpu(), torch.cumprod(e, 1))
    with pytest.raises(RuntimeError, match="dtype"):
        torch.cumprod(d, 0, out=torch.empty(0, dtype=torch.int64, device="opencl"))
    with pytest.raises(IndexError):
        torch.cumprod(d, 2)
