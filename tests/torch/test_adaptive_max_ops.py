"""Adaptive max pooling, 2-d and 3-d, on the device against CPU torch, forward (values and indices) and
backward: windows that overlap, output sizes that do not divide the input or exceed it, unbatched inputs,
ties, NaN (the window's last, as torch keeps it) and -inf, views, float16, empty inputs and torch's errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op

NAN, INF = float("nan"), float("inf")


def _random(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64).float()


@pytest.mark.parametrize("shape, size", [((2, 3, 7, 9), (3, 4)), ((3, 5, 5), (1, 1)), ((1, 2, 6, 6), (4, 6)),
                                         ((1, 3, 3, 3), (5, 5)), ((2, 1, 10, 1), (3, None))])
def test_adaptive_max_pool2d(strict, shape, size):
    check_op(lambda x: F.adaptive_max_pool2d(x, size, return_indices=True), Input(_random(*shape)))


@pytest.mark.parametrize("shape, size", [((2, 2, 5, 6, 7), (2, 3, 4)), ((3, 4, 4, 4), 1), ((1, 1, 2, 3, 4), (3, 3, 3))])
def test_adaptive_max_pool3d(strict, shape, size):
    check_op(lambda x: F.adaptive_max_pool3d(x, size, return_indices=True), Input(_random(*shape)))


def test_ties_nan_and_infinities(strict):
    check_op(lambda x: F.adaptive_max_pool2d(x, (2, 3), return_indices=True), Input(torch.zeros(1, 2, 5, 7)))
    x = _random(1, 2, 4, 4)
    x[0, 0, 0, 1] = NAN
    x[0, 0, 1, 0] = NAN   # two NaNs in one window: the later one
    x[0, 1] = -INF        # windows of -inf only
    check_op(lambda v: F.adaptive_max_pool2d(v, 2, return_indices=True), Input(x, grad=False), grad=False)
    check_op(lambda v: F.adaptive_max_pool3d(v, (1, 2, 1), return_indices=True), Input(x.unsqueeze(0), grad=False),
             grad=False)


def test_views_modules_float16_and_empty(strict):
    check_op(lambda x: F.adaptive_max_pool2d(x, 3), Input(_random(2, 8, 7, 3), lambda v: v.permute(0, 3, 1, 2)))
    check_op(lambda x: torch.nn.AdaptiveMaxPool2d((2, 2))(x), Input(_random(2, 3, 9, 8), lambda v: v[..., ::2]))
    check_op(lambda x: torch.nn.AdaptiveMaxPool3d(2)(x), Input(_random(1, 2, 4, 5, 6)))
    check_op(lambda x: F.adaptive_max_pool2d(x, 2, return_indices=True), Input(_random(1, 2, 5, 5).half()),
             atol=1e-3)
    check_op(lambda x: F.adaptive_max_pool2d(x, 2), Input(torch.empty(0, 3, 4, 4)))


def test_bad_calls_raise_torch_errors(strict):
    for device in ("cpu", "opencl"):
        with pytest.raises(RuntimeError):
            F.adaptive_max_pool2d(torch.randn(1, 2, 0, 4, device=device), 2)
        with pytest.raises(RuntimeError):
            F.adaptive_max_pool2d(torch.randn(4, 4, device=device), 2)
