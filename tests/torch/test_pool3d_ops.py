"""3-d max and average pooling on the device against CPU torch, forward and backward: kernel, stride, padding
and dilation per dim, ``ceil_mode``, ``count_include_pad``, ``divisor_override``, unbatched inputs, ties, NaN
and -inf in windows (the indices as torch's CPU kernel picks them), views, float16, empty inputs,
``nn.LocalResponseNorm`` (which pools through ``avg_pool3d``), and torch's errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op

NAN, INF = float("nan"), float("inf")

WINDOWS = [
    ((2, 3, 5, 6, 7), dict(kernel_size=2)),
    ((1, 2, 7, 6, 5), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 4, 5, 5), dict(kernel_size=(3, 2, 2), stride=(1, 2, 1), padding=(1, 1, 0), ceil_mode=True)),   # unbatched
    ((1, 2, 5, 7, 6), dict(kernel_size=(2, 3, 3), stride=(2, 2, 3), ceil_mode=True)),
    ((1, 1, 1, 1, 1), dict(kernel_size=1)),
]


def _random(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64).float()


@pytest.mark.parametrize("shape, options", WINDOWS)
def test_max_pool3d(strict, shape, options):
    check_op(lambda x: F.max_pool3d(x, return_indices=True, **options), Input(_random(*shape)))
    check_op(lambda x: F.max_pool3d(x, dilation=(2, 1, 1), **options), Input(_random(*shape[:-3], 7, 6, 6)))


@pytest.mark.parametrize("divisor_override", [None, 3])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("shape, options", WINDOWS)
def test_avg_pool3d(strict, shape, options, count_include_pad, divisor_override):
    check_op(lambda x: F.avg_pool3d(x, count_include_pad=count_include_pad, divisor_override=divisor_override,
                                    **options), Input(_random(*shape)), atol=2e-6)


def test_max_pool3d_ties_nan_and_infinities(strict):
    x = torch.zeros(1, 1, 4, 4, 4)   # all ties: the first position of each window
    check_op(lambda v: F.max_pool3d(v, 2, return_indices=True), Input(x))
    y = _random(1, 2, 4, 4, 4)
    y[0, 0, 1, 1, 1] = NAN   # NaN wins its window
    y[0, 0, 2, 3, 2] = NAN
    y[0, 0, 3, 2, 3] = NAN   # two NaNs in a window: the later one
    y[0, 1, :2, :2, :2] = -INF   # a window of -inf only
    check_op(lambda v: F.max_pool3d(v, 2, return_indices=True), Input(y, grad=False), grad=False)
    check_op(lambda v: F.max_pool3d(v, 3, stride=1, padding=1, return_indices=True), Input(y, grad=False),
             grad=False)
    check_op(lambda v: F.max_pool3d(v, 2, padding=1, return_indices=True),
             Input(torch.full((1, 1, 3, 3, 3), -INF), grad=False), grad=False)   # -inf next to padding


def test_views_modules_float16_and_empty(strict):
    check_op(lambda x: F.max_pool3d(x, 2), Input(_random(2, 6, 4, 4, 3), lambda v: v.permute(0, 4, 1, 2, 3)))
    check_op(lambda x: F.avg_pool3d(x, (1, 2, 2)), Input(_random(2, 3, 4, 8, 8), lambda v: v[..., ::2]))
    check_op(lambda x: torch.nn.MaxPool3d(3, 2, 1)(x), Input(_random(1, 2, 5, 5, 5)))
    check_op(lambda x: torch.nn.AvgPool3d(2)(x), Input(_random(1, 2, 4, 4, 4)))
    check_op(lambda x: torch.nn.LocalResponseNorm(3)(x), Input(_random(2, 6, 5, 5)), atol=1e-6)
    check_op(lambda x: torch.nn.LocalResponseNorm(2, k=2.0)(x), Input(_random(2, 5, 3, 3, 2)), atol=1e-6)
    half = _random(1, 2, 4, 4, 4).half()
    check_op(lambda x: F.max_pool3d(x, 2, return_indices=True), Input(half), atol=1e-3)
    actual = F.avg_pool3d(half.to("opencl"), 2)   # (CPU torch has no float16 avg_pool3d)
    assert actual.dtype == torch.float16
    torch.testing.assert_close(actual.cpu(), F.avg_pool3d(half.float(), 2).half())
    check_op(lambda x: F.max_pool3d(x, 2), Input(torch.empty(0, 2, 4, 4, 4)))
    check_op(lambda x: F.avg_pool3d(x, 2), Input(torch.empty(0, 2, 4, 4, 4)))


@pytest.mark.parametrize("call", [
    lambda d: F.max_pool3d(torch.randn(1, 1, 2, 2, 2, device=d), 3),
    lambda d: F.avg_pool3d(torch.randn(1, 1, 4, 4, 4, device=d), 2, padding=2),
    lambda d: F.max_pool3d(torch.randn(1, 4, 4, device=d), 2),
])
def test_bad_calls_raise_torch_errors(strict, call):
    for device in ("cpu", "opencl"):
        with pytest.raises(RuntimeError):
            call(device)
