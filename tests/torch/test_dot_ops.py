"""dot on opencl vs CPU: forward and both gradients over odd lengths (empty, one, long against float64),
strided vectors and integer dtypes; every call under ``TUNECL_FALLBACK=error``."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op


@pytest.mark.parametrize("n", [0, 1, 7, 256, 1025])
def test_dot(n):
    check_op(torch.dot, torch.randn(n), torch.randn(n), atol=1e-4, rtol=1e-5)


def test_dot_of_strided_vectors_and_integers():
    check_op(torch.dot, Input(torch.randn(20), lambda v: v[::2]), Input(torch.randn(4, 10), lambda v: v[1]))
    check_op(torch.dot, Input(torch.randn(5, 3), lambda v: v[:, 1]), torch.randn(5))
    for dtype in (torch.int64, torch.int32):
        check_op(torch.dot, torch.randint(-9, 9, (33,), dtype=dtype), torch.randint(-9, 9, (33,), dtype=dtype))


def test_dot_of_a_long_vector_against_float64(strict):
    a, b = torch.randn(100_000, dtype=torch.float64), torch.randn(100_000, dtype=torch.float64)
    actual = torch.dot(a.float().to("opencl"), b.float().to("opencl"))
    torch.testing.assert_close(actual.cpu().double(), torch.dot(a, b), atol=1e-2, rtol=1e-4)


def test_dot_bad_input_raises(strict):
    x = torch.randn(3, device="opencl")
    with pytest.raises(RuntimeError, match="1D"):
        torch.dot(x, x.view(3, 1))
    with pytest.raises(RuntimeError):
        torch.dot(x, torch.randn(4, device="opencl"))
    with pytest.raises(RuntimeError):
        torch.dot(x, torch.ones(3, dtype=torch.int64, device="opencl"))
