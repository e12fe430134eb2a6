"""``F.unfold`` / ``F.fold`` (im2col / col2im) on the device against CPU torch, forward and backward: kernels,
dilation, padding and stride in each dim, unbatched inputs, blocks that overlap and blocks that skip
positions, views, float16, empty inputs, the modules, and torch's errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op

# (input shape, kernel, dilation, padding, stride)
GEOMETRIES = [
    ((2, 3, 5, 6), (2, 3), (1, 1), (1, 0), (2, 1)),
    ((1, 2, 7, 7), (3, 3), (2, 2), (2, 1), (1, 2)),
    ((2, 4, 9, 8), (3, 2), (1, 3), (0, 2), (3, 3)),   # stride past the kernel: positions no block reads
    ((3, 4, 4), (2, 2), (1, 1), (0, 0), (1, 1)),       # unbatched
    ((2, 1, 1, 1), (1, 1), (1, 1), (0, 0), (1, 1)),
    ((1, 3, 4, 5), (4, 5), (1, 1), (0, 0), (1, 1)),    # one block: the whole image
]


def _random(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64).float()


@pytest.mark.parametrize("shape, kernel, dilation, padding, stride", GEOMETRIES)
def test_unfold(strict, shape, kernel, dilation, padding, stride):
    check_op(lambda x: F.unfold(x, kernel, dilation, padding, stride), Input(_random(shape)))


@pytest.mark.parametrize("shape, kernel, dilation, padding, stride", GEOMETRIES)
def test_fold(strict, shape, kernel, dilation, padding, stride):
    blocks = F.unfold(torch.zeros(shape), kernel, dilation, padding, stride).shape
    check_op(lambda c: F.fold(c, shape[-2:], kernel, dilation, padding, stride), Input(_random(blocks)))


def test_fold_sums_overlapping_blocks_and_unfold_round_trips(strict):
    x = _random((2, 3, 6, 6))
    check_op(lambda x: F.fold(F.unfold(x, 3, padding=1), (6, 6), 3, padding=1), Input(x))
    ones = F.fold(F.unfold(torch.ones(1, 1, 4, 4, device="opencl"), 2), (4, 4), 2)
    assert ones.cpu().tolist() == [[[[1.0, 2.0, 2.0, 1.0], [2.0, 4.0, 4.0, 2.0],
                                     [2.0, 4.0, 4.0, 2.0], [1.0, 2.0, 2.0, 1.0]]]]


def test_views_modules_and_float16(strict):
    x = _random((2, 8, 6, 3))
    check_op(lambda v: F.unfold(v, 2, stride=(1, 2)), Input(x, lambda v: v.permute(0, 3, 1, 2)))
    check_op(lambda v: F.unfold(v, (3, 1), padding=(1, 0)), Input(_random((2, 3, 5, 12)), lambda v: v[..., ::2]))
    cols = _random((2, 6 * 4, 9))
    check_op(lambda c: F.fold(c, (4, 4), 2), Input(cols, lambda c: c.transpose(1, 2).contiguous().transpose(1, 2)))
    check_op(lambda c: F.fold(c, (4, 4), 2), Input(_random((9, 24)), lambda c: c.t()))   # unbatched, transposed
    check_op(lambda x: torch.nn.Unfold(2, padding=1)(x), Input(_random((2, 3, 4, 4))))
    check_op(lambda c: torch.nn.Fold((5, 5), 3, padding=1, stride=2)(c), Input(_random((1, 18, 9))))
    half = _random((2, 3, 5, 5)).half()
    check_op(lambda x: F.unfold(x, 2, dilation=2), Input(half, grad=False), grad=False)
    check_op(lambda c: F.fold(c, (5, 5), 2), Input(F.unfold(half.float(), 2).half(), grad=False), grad=False,
             atol=1e-3)


def test_empty_inputs(strict):
    check_op(lambda x: F.unfold(x, 2), Input(torch.empty(0, 3, 4, 4)))
    check_op(lambda c: F.fold(c, (4, 4), 2), Input(torch.empty(0, 12, 9)))


@pytest.mark.parametrize("call, message", [
    (lambda d: F.unfold(torch.randn(1, 2, 2, 2, device=d), 3), "must be at least one"),
    (lambda d: F.unfold(torch.randn(1, 2, 5, 5, device=d), 2, stride=0), "stride"),
    (lambda d: F.fold(torch.randn(1, 7, 9, device=d), (4, 4), 2), "divisible"),
    (lambda d: F.fold(torch.randn(1, 8, 7, device=d), (4, 4), 2), r"input\.size\(.*7"),
])
def test_bad_calls_raise_torch_errors(strict, call, message):
    for device in ("cpu", "opencl"):
        with pytest.raises(RuntimeError, match=message):
            call(device)
