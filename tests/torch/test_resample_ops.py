"""Bicubic and antialiased resampling (``F.interpolate(mode="bicubic")``, ``antialias=True``) against CPU torch,
forward and backward: up and down, sizes and scale factors, align_corners either way, float16, channels-last
inputs, and torch's errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op

MODES = [("bicubic", False), ("bicubic", True), ("bilinear", True)]
SIZES = [{"scale_factor": 2}, {"size": (5, 7)}, {"size": (3, 4)}, {"scale_factor": 0.5}, {"scale_factor": 1.7},
         {"size": (8, 1)}, {"scale_factor": (1.5, 0.75), "recompute_scale_factor": False}]


@pytest.mark.parametrize("mode, antialias", MODES)
@pytest.mark.parametrize("kwargs", SIZES)
@pytest.mark.parametrize("align_corners", [False, True])
def test_resampling_matches_cpu(strict, mode, antialias, kwargs, align_corners):
    check_op(lambda x: F.interpolate(x, mode=mode, antialias=antialias, align_corners=align_corners, **kwargs),
             Input(torch.randn(2, 3, 8, 9)), atol=3e-5, grad_atol=3e-5)


@pytest.mark.parametrize("mode, antialias", MODES)
def test_resampling_of_float16_and_channels_last_inputs(strict, mode, antialias):
    x = torch.randn(1, 2, 5, 7)
    if antialias:   # (CPU torch has no float16 antialiased kernels: against its float32 result)
        got = F.interpolate(x.half().to("opencl"), size=(6, 11), mode=mode, antialias=True)
        assert got.dtype == torch.float16
        torch.testing.assert_close(got.cpu().float(), F.interpolate(x, size=(6, 11), mode=mode, antialias=True),
                                   atol=4e-3, rtol=4e-3)
    else:
        check_op(lambda x: F.interpolate(x.half(), size=(6, 11), mode=mode), Input(x), atol=2e-3, rtol=2e-3,
                 grad_atol=2e-3)
    check_op(lambda x: F.interpolate(x.contiguous(memory_format=torch.channels_last), scale_factor=1.5, mode=mode,
                                     antialias=antialias), Input(torch.randn(2, 4, 6, 6)), atol=3e-5)


def test_a_position_embedding_resize_as_timm_does(strict):
    """A 14 x 14 grid of 768-wide position embeddings resized to 16 x 16 (a ViT at a new image size)."""
    grid = Input(torch.randn(1, 14, 14, 768))
    check_op(lambda g: F.interpolate(g.permute(0, 3, 1, 2), size=(16, 16), mode="bicubic", antialias=True,
                                     align_corners=False).permute(0, 2, 3, 1), grid, atol=3e-5, grad_atol=1e-4)


def test_bad_sizes_raise_torch_errors(strict):
    for device in ("cpu", "opencl"):
        with pytest.raises((RuntimeError, ValueError)):
            F.interpolate(torch.randn(1, 1, 4, 4, device=device), size=(0, 3), mode="bicubic")
        with pytest.raises((RuntimeError, ValueError)):
            torch.ops.aten.upsample_bicubic2d(torch.randn(1, 4, 4, device=device), [8, 8], False)
