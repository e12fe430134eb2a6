"""The ops transformers add to a CNN's set (tril/triu), on opencl vs CPU, forward and backward, over odd
shapes, dtypes and strided views."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op, strided, t

TRI_CASES = [((5, 7), 0), ((7, 5), 2), ((3, 4, 6), -2), ((2, 3, 1, 1), 1), ((1, 1), 0), ((0, 3), 0), ((2, 0, 4), 1),
             ((4, 4), 100), ((4, 4), -100), ((2, 3, 5, 4), 3), ((3, 257, 33), -1)]


@pytest.mark.parametrize("fn", [torch.tril, torch.triu])
@pytest.mark.parametrize("shape,k", TRI_CASES)
def test_tril_triu(fn, shape, k):
    check_op(lambda x: fn(x, k), torch.randn(shape))


@pytest.mark.parametrize("fn", [torch.tril, torch.triu])
def test_tril_triu_of_strided_views(fn):
    check_op(lambda x: fn(x, 1), t(torch.randn(6, 9)))
    check_op(lambda x: fn(x, -1), strided(torch.randn(3, 5, 10)))
    check_op(lambda x: fn(x), Input(torch.randn(4, 6, 8), lambda v: v.transpose(0, 2)))
    # batch dims that do not merge (gaps between the matrices): through a contiguous copy
    check_op(lambda x: fn(x, 2), Input(torch.randn(4, 3, 5, 6), lambda v: v[::2, :, 1:, ::2]))


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.int32, torch.uint8, torch.float16])
def test_tril_triu_of_other_dtypes(dtype):
    x = (torch.randn(3, 6, 5) * 4).to(dtype)
    check_op(lambda v: (torch.tril(v, 1), torch.triu(v, -1)), x)


@pytest.mark.parametrize("name", ["tril_", "triu_"])
def test_tril_triu_in_place(name):
    def fn(x, k):
        y = x.clone()
        getattr(y, name)(k)   # a contiguous tensor
        z = x.clone()
        getattr(z[:, ::2], name)(k)   # a strided view, updated in place
        w = x.clone().transpose(0, 1)
        getattr(w, name)(k)
        return y, z, w
    for k in (0, -2, 3):
        check_op(lambda x, k=k: fn(x, k), torch.randn(5, 8, 7))


def test_causal_mask(strict):
    mask = torch.tril(torch.ones(9, 9, dtype=torch.bool, device="opencl"))
    assert torch.equal(mask.cpu(), torch.tril(torch.ones(9, 9, dtype=torch.bool)))

