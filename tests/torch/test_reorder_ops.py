"""flip and roll on opencl vs CPU, forward and backward (each other's gradients), over odd shapes, dims
(negative, several, repeated roll dims, none), shifts (negative, past the size), dtypes and strided views;
every call under ``TUNECL_FALLBACK=error``."""

from __future__ import annotations

import pytest
import torch
from opcheck import Input, check_op, strided

FLIPS = [((7,), [0]), ((3, 5), [1]), ((3, 5), [0, 1]), ((2, 3, 4), [-1, 0]), ((4, 1, 6), [1]), ((0, 3), [0]),
         ((2, 3, 4, 5), [3, 1]), ((3, 5), []), ((1,), [0]), ((257, 3), [0])]
ROLLS = [((7,), 2, 0), ((7,), -3, 0), ((3, 5), 7, 1), ((3, 5), (1, -2), (0, 1)), ((2, 3, 4), (1, 1), (2, 2)),
         ((2, 3, 4), 5, None), ((4, 1, 6), 1, 1), ((0, 3), 1, 0), ((3, 5), 0, 1), ((2, 3, 4, 5), (2, 1, 3), (3, 1, 0)),
         ((3, 5), -16, None)]


@pytest.mark.parametrize("shape,dims", FLIPS)
def test_flip(shape, dims):
    check_op(lambda v: torch.flip(v, dims), torch.randn(shape))


@pytest.mark.parametrize("shape,shifts,dims", ROLLS)
def test_roll(shape, shifts, dims):
    if dims is None:
        check_op(lambda v: torch.roll(v, shifts), torch.randn(shape))
    else:
        check_op(lambda v: torch.roll(v, shifts, dims), torch.randn(shape))


def test_flip_and_roll_of_strided_views_0d_and_other_dtypes():
    for view in (lambda v: v.t(), lambda v: v[::2, 1:]):
        check_op(lambda v: (torch.flip(view(v), [0]), torch.roll(view(v), (1, -1), (0, 1)), torch.roll(view(v), 3)),
                 torch.randn(6, 9))
    check_op(lambda v: torch.flip(v, [1, 2]), strided(torch.randn(3, 5, 10)))
    check_op(lambda v: torch.roll(v, 2, 2), Input(torch.randn(4, 6, 8), lambda v: v.transpose(0, 2)))
    check_op(lambda v: (torch.flip(v, []), torch.flip(v, [0]), torch.roll(v, 3)), torch.tensor(1.5))
    for dtype in (torch.int64, torch.bool, torch.float16, torch.uint8):
        x = (torch.randn(4, 7) * 9).to(dtype)
        check_op(lambda v: (torch.flip(v, [1]), torch.roll(v, (2, 3), (0, 1))), x)


def test_flip_and_roll_bad_input_raises(strict):
    x = torch.randn(3, 4, device="opencl")
    with pytest.raises(RuntimeError):
        torch.flip(x, [0, 0])
    with pytest.raises(IndexError):
        torch.flip(x, [2])
    with pytest.raises(RuntimeError):
        torch.roll(x, (1, 2), (0,))
    with pytest.raises(IndexError):
        torch.roll(torch.tensor(1.0, device="opencl"), 1, 0)
