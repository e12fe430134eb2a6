"""``F.grid_sample`` on 4-d inputs on the device against CPU torch, forward and backward (input and grid):
bilinear and nearest, every padding mode, both ``align_corners``, points far outside the image, on its edges
and on pixel centres, views, float16, empty inputs, and the route of bicubic sampling to the CPU fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op

from tunecl import config


def _random(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, dtype=torch.float64) * scale).float()


def _grid(*shape: int, reach: float = 1.3) -> torch.Tensor:
    """Coordinates in [-reach, reach]: reach > 1 puts points outside the image."""
    return ((torch.rand(shape, dtype=torch.float64) * 2 - 1) * reach).float()


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample(strict, mode, padding_mode, align_corners):
    def sample(x, g):
        return F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    check_op(sample, Input(_random(2, 3, 5, 7)), Input(_grid(2, 4, 6, 2)), atol=2e-6, grad_atol=2e-5)
    check_op(sample, Input(_random(1, 2, 4, 4)), Input(_grid(1, 3, 3, 2, reach=4.5)), atol=2e-6, grad_atol=2e-5)
    check_op(sample, Input(_random(1, 1, 1, 3)), Input(_grid(1, 2, 5, 2)), atol=2e-6, grad_atol=2e-5)   # height 1


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_points_on_edges_and_pixel_centres(strict, padding_mode, align_corners):
    # -1, 1 and the pixel centres: where clipping and reflection switch, and floor lands exactly
    w = 4
    centres = [(2 * k + 1) / w - 1 for k in range(w)] if not align_corners else [2 * k / (w - 1) - 1 for k in range(w)]
    values = torch.tensor([-1.0, 1.0, 0.0, *centres, -1.5, 1.5, 3.0])
    grid = torch.stack(torch.meshgrid(values, values.flip(0), indexing="xy"), -1).unsqueeze(0)
    check_op(lambda x, g: F.grid_sample(x, g, padding_mode=padding_mode, align_corners=align_corners),
             Input(_random(1, 2, w, w)), Input(grid), atol=2e-6, grad_atol=2e-5)


@pytest.mark.parametrize("align_corners, size, halves", [(False, 4, [-0.5, 0.0, 0.5]), (True, 5, [-0.75, -0.25, 0.25])])
def test_nearest_rounds_half_pixels_to_even(strict, align_corners, size, halves):
    # the points unnormalise to 0.5, 1.5 and 2.5 exactly: torch rounds them to 0, 2 and 2
    values = torch.tensor(halves)
    grid = torch.stack(torch.meshgrid(values, values, indexing="xy"), -1).unsqueeze(0)
    check_op(lambda x, g: F.grid_sample(x, g, mode="nearest", align_corners=align_corners),
             Input(_random(1, 2, size, size)), Input(grid))


def test_views_float16_and_empty(strict):
    x = _random(2, 6, 5, 3)
    g = _grid(2, 3, 4, 2)
    check_op(lambda x, g: F.grid_sample(x, g, align_corners=False), Input(x, lambda v: v.permute(0, 3, 2, 1)),
             Input(_grid(2, 4, 3, 2), lambda v: v.transpose(1, 2)), atol=2e-6, grad_atol=2e-5)
    check_op(lambda x, g: F.grid_sample(x, g[..., ::2, :], align_corners=True), Input(_random(2, 3, 5, 5)),
             Input(_grid(2, 3, 8, 2)), atol=2e-6, grad_atol=2e-5)
    # float16: CPU torch computes in float16, here in float32 rounded once
    half = check_op(lambda x, g: F.grid_sample(x, g, align_corners=False), Input(x.half()), Input(g.half()),
                    grad=False, atol=5e-3, rtol=5e-3)
    exact = F.grid_sample(x.half().float(), g.half().float(), align_corners=False).half()
    torch.testing.assert_close(half.cpu(), exact, atol=1e-3, rtol=1e-3)
    check_op(lambda x, g: F.grid_sample(x, g, align_corners=False), Input(torch.empty(0, 3, 4, 4)),
             Input(torch.empty(0, 2, 2, 2)))
    check_op(lambda x, g: F.grid_sample(x, g, align_corners=False), Input(_random(2, 3, 4, 4)),
             Input(torch.empty(2, 0, 5, 2)))


def test_bicubic_runs_on_the_counted_cpu_fallback(fresh_stats):
    x, g = _random(1, 2, 4, 4), _grid(1, 3, 3, 2)
    with config.override(fallback="silent"):   # (warn mode warns once per process: another test may have)
        actual = F.grid_sample(x.to("opencl"), g.to("opencl"), mode="bicubic", align_corners=False)
    torch.testing.assert_close(actual.cpu(), F.grid_sample(x, g, mode="bicubic", align_corners=False))
    assert list(fresh_stats()["fallback_ops"]) == ["aten::grid_sampler_2d"]
