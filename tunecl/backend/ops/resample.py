"""Bicubic and antialiased 2-d resampling (``F.interpolate(mode="bicubic")``, ``antialias=True`` with bilinear
or bicubic: timm's position-embedding resize, torchvision's tensor ``Resize``), forward and backward.

Each is a separable linear map: output = Wh @ input @ Ww^T over the last two dims, with Wh (out_h x in_h) and
Ww (out_w x in_w) the interpolation weights. They are read off CPU torch's own kernel run on the identity
(input i holds row e_i in two equal columns; the columns map 2 -> 2 unchanged, so an output column is the i-th
column of Wh; the antialiased kernels mishandle a width of 1), so every boundary, align_corners and scale rule
is torch's, and cached per size. The two
products run on the device's GEMM plans; the backward is Wh^T @ grad @ Ww. float16 is computed in float32
and rounded once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import copies
from tunecl.backend.ops.device_tables import DeviceTables

_aten = torch.ops.aten
_matrices = DeviceTables(128)   # (op, size_in, size_out, align_corners, scale) -> the weights


def _weights(op: Any, size_in: int, size_out: int, align_corners: bool, scale: float | None,
             device: torch.device) -> torch.Tensor:
    """The (size_out x size_in) float32 weights of ``op`` along one dim, on the device."""
    def make() -> torch.Tensor:
        basis = torch.eye(size_in, dtype=torch.float32).view(size_in, 1, size_in, 1).expand(size_in, 1, size_in, 2)
        rows = op(basis.contiguous(), [size_out, 2], align_corners, scale, None)
        return rows[:, 0, :, 0].t().contiguous()
    return _matrices.get((op, size_in, size_out, align_corners, scale), device, make)


def _forward(op: Any) -> Callable[..., torch.Tensor]:
    def kernel(self: torch.Tensor, output_size: Sequence[int], align_corners: bool, scales_h: float | None = None,
               scales_w: float | None = None, *, out: torch.Tensor) -> torch.Tensor:
        op(torch.empty(self.shape, dtype=self.dtype, device="meta"), output_size, align_corners, scales_h,
           scales_w)   # torch's checks and errors
        x = self if self.dtype == torch.float32 else self.float()
        rows = _weights(op, self.shape[2], output_size[0], align_corners, scales_h, self.device)
        columns = _weights(op, self.shape[3], output_size[1], align_corners, scales_w, self.device)
        result = torch.matmul(torch.matmul(rows, x), columns.t())
        return copies.copy_from_and_resize(result, out)
    return kernel


def _backward(op: Any, backward: Any) -> Callable[..., torch.Tensor]:
    def kernel(grad_output: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int], align_corners: bool,
               scales_h: float | None = None, scales_w: float | None = None, *,
               grad_input: torch.Tensor) -> torch.Tensor:
        backward(torch.empty(grad_output.shape, dtype=grad_output.dtype, device="meta"), output_size, input_size,
                 align_corners, scales_h, scales_w)
        g = grad_output if grad_output.dtype == torch.float32 else grad_output.float()
        rows = _weights(op, input_size[2], output_size[0], align_corners, scales_h, g.device)
        columns = _weights(op, input_size[3], output_size[1], align_corners, scales_w, g.device)
        result = torch.matmul(torch.matmul(rows.t(), g), columns)
        return copies.copy_from_and_resize(result, grad_input)
    return kernel


KERNELS: dict[str, Callable[..., Any]] = {}
for _name in ("upsample_bicubic2d", "_upsample_bicubic2d_aa", "_upsample_bilinear2d_aa"):
    _op = getattr(_aten, _name).default
    KERNELS[f"{_name}.out"] = _forward(_op)
    KERNELS[f"{_name}_backward.grad_input"] = _backward(_op, getattr(_aten, f"{_name}_backward").default)
