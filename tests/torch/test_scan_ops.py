"""cumsum on opencl vs CPU along every dim, forward and backward, over odd shapes, dtypes (the result dtype
rules included), strided views, in place and out=; every call under ``TUNECL_FALLBACK=error``."""

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
