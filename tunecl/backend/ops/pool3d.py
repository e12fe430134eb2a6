"""3-d max and average pooling (``F.max_pool3d``, ``F.avg_pool3d``, their modules; ``nn.LocalResponseNorm``
pools through ``avg_pool3d``) by the 2-d pooling kernels, forward and backward.

A window's depth taps are pooled one at a time: for tap ``k`` the input depths that the output depths read
through it (``d * stride + k * dilation - padding``; a padding slice where that falls outside the input) are
gathered into one batch of planes and pooled in 2-d.

- Max: the taps' maxima are combined in depth order as torch's CPU kernel scans a window: a later value
  replaces the maximum where it is larger or NaN, ties keep the first, and a padding tap is never taken. The
  index is the flat (depth, row, column) position in the input plane. The backward adds each output gradient
  into the position its index names (``scatter_add``).
- Average: the taps' 2-d window sums are added and divided by torch's divisor for each output position
  (``count_include_pad``, ``ceil_mode`` and ``divisor_override`` as torch applies them), read off torch's own
  CPU kernel run once per geometry on a tensor of ones. The backward divides the output gradient by the same
  divisors and sends each tap's 2-d window-sum gradient back into the depths it read (``index_add``).

float16 pools in float32 and rounds once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import copies
from tunecl.backend.ops.conv3d import depth_reads
from tunecl.backend.ops.device_tables import DeviceTables
from tunecl.backend.ops.nn import max_pool_backward, pooled_size, triple

_aten = torch.ops.aten
_tables = DeviceTables(256)   # depth maps and divisors, by geometry


class _Geometry:
    """A 3-d pooling call's window, and its input as planes of (D, H, W)."""

    def __init__(self, input: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool):
        self.kernel = triple(kernel_size)
        self.stride = triple(stride, self.kernel)
        self.padding, self.dilation = triple(padding), triple(dilation)
        self.ceil_mode = ceil_mode
        self.lead = list(input.shape[:-3])
        self.depth, self.height, self.width = input.shape[-3:]
        self.planes = 1
        for n in self.lead:
            self.planes *= n
        self.out_depth = pooled_size(self.depth, self.kernel[0], self.padding[0], self.stride[0], self.dilation[0],
                                      ceil_mode)
        self.device = input.device

    def maps(self) -> torch.Tensor:
        """(taps, D_out) int64 on the device: the input depth each output depth reads through each tap, or D
        (the padding slice) outside the input (:func:`~tunecl.backend.ops.conv3d.depth_reads`)."""
        geometry = (self.depth, self.kernel[0], self.stride[0], self.padding[0], self.dilation[0], self.out_depth)
        return _tables.get(("maps", *geometry), self.device, lambda: depth_reads(*geometry))

    def padded(self, input: torch.Tensor, fill: float) -> torch.Tensor:
        """(planes, D + 1, H, W) float32, the last depth filled with ``fill``."""
        out = torch.full((self.planes, self.depth + 1, self.height, self.width), fill, dtype=torch.float32,
                         device=input.device)
        out[:, :self.depth] = input.reshape(self.planes, self.depth, self.height, self.width)
        return out

    def tap(self, padded: torch.Tensor, maps: torch.Tensor, k: int) -> torch.Tensor:
        """The planes tap ``k`` reads: (planes * D_out, H, W)."""
        return padded.index_select(1, maps[k]).view(-1, self.height, self.width)

    def window_2d(self) -> tuple[tuple[int, int], ...]:
        return self.kernel[1:], self.stride[1:], self.padding[1:], self.dilation[1:]

    def output_shape(self, out_h: int, out_w: int) -> list[int]:
        return [*self.lead, self.out_depth, out_h, out_w]


def max_pool3d_with_indices(self: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
                            padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,),
                            ceil_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    meta = torch.empty(self.shape, dtype=self.dtype, device="meta")
    shape = _aten.max_pool3d_with_indices.default(meta, kernel_size, stride, padding, dilation, ceil_mode)[0].shape
    if not self.numel() or not shape.numel():
        return (torch.empty(shape, dtype=self.dtype, device=self.device),
                torch.empty(shape, dtype=torch.int64, device=self.device))
    g = _Geometry(self, kernel_size, stride, padding, dilation, ceil_mode)
    maps = g.maps()
    padded = g.padded(self, float("-inf"))
    kernel, stride2, padding2, dilation2 = g.window_2d()
    best = index = seen = None
    for k in range(g.kernel[0]):
        value, position = _aten.max_pool2d_with_indices.default(g.tap(padded, maps, k), kernel, stride2, padding2,
                                                                 dilation2, ceil_mode)
        value = value.view(g.planes, g.out_depth, -1)
        position = position.view(g.planes, g.out_depth, -1) + (maps[k] * (g.height * g.width)).view(1, -1, 1)
        inside = (maps[k] < g.depth).view(1, -1, 1)
        if best is None:
            best, index, seen = value, position, inside
            continue
        take = inside & (~seen | (value > best) | torch.isnan(value))
        best, index, seen = torch.where(take, value, best), torch.where(take, position, index), seen | inside
    out_shape = g.output_shape(*shape[-2:])
    return best.view(out_shape).to(self.dtype), index.view(out_shape)


def max_pool3d_with_indices_backward(grad_output: torch.Tensor, self: torch.Tensor, kernel_size: Sequence[int],
                                     stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                                     ceil_mode: bool, indices: torch.Tensor) -> torch.Tensor:
    return max_pool_backward(grad_output, self, indices, 3)


def _divisors(g: _Geometry, count_include_pad: bool, divisor_override: int | None, out_h: int,
              out_w: int) -> torch.Tensor:
    """(D_out, H_out, W_out) float32 on the device: torch's divisor of each output position."""
    key = ("divisors", g.depth, g.height, g.width, g.kernel, g.stride, g.padding, g.ceil_mode, count_include_pad,
           divisor_override)

    def make() -> torch.Tensor:
        ones = torch.ones((1, 1, g.depth, g.height, g.width), dtype=torch.float64)
        counted = _aten.avg_pool3d.default(ones, g.kernel, g.stride, g.padding, g.ceil_mode, True, 1)
        averaged = _aten.avg_pool3d.default(ones, g.kernel, g.stride, g.padding, g.ceil_mode, count_include_pad,
                                            divisor_override)
        return (counted / averaged).round().view(g.out_depth, out_h, out_w).float()
    return _tables.get(key, g.device, make)


def avg_pool3d(self: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> torch.Tensor:
    meta = torch.empty(self.shape, dtype=self.dtype, device="meta")
    shape = _aten.avg_pool3d.default(meta, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                     divisor_override).shape
    if not self.numel() or not shape.numel():
        return torch.empty(shape, dtype=self.dtype, device=self.device)
    g = _Geometry(self, kernel_size, stride, padding, 1, ceil_mode)
    maps = g.maps()
    padded = g.padded(self, 0.0)
    kernel, stride2, padding2, _ = g.window_2d()
    total = None
    for k in range(g.kernel[0]):
        sums = _aten.avg_pool2d.default(g.tap(padded, maps, k), kernel, stride2, padding2, ceil_mode, True, 1)
        total = sums if total is None else total.add_(sums)
    out_h, out_w = shape[-2:]
    total = total.view(g.planes, g.out_depth, out_h, out_w) / _divisors(g, count_include_pad, divisor_override,
                                                                         out_h, out_w)
    return total.view(shape).to(self.dtype)


def avg_pool3d_backward(grad_output: torch.Tensor, self: torch.Tensor, kernel_size: Sequence[int],
                        stride: Sequence[int], padding: Sequence[int], ceil_mode: bool, count_include_pad: bool,
                        divisor_override: int | None) -> torch.Tensor:
    if not self.numel() or not grad_output.numel():
        return torch.zeros(self.shape, dtype=self.dtype, device=self.device)
    g = _Geometry(self, kernel_size, stride, padding, 1, ceil_mode)
    maps = g.maps()
    kernel, stride2, padding2, _ = g.window_2d()
    out_h, out_w = grad_output.shape[-2:]
    grad = (grad_output.float().reshape(g.planes, g.out_depth, out_h, out_w)
            / _divisors(g, count_include_pad, divisor_override, out_h, out_w)).view(-1, out_h, out_w)
    shape_2d = torch.empty((grad.shape[0], g.height, g.width), dtype=torch.float32, device=self.device)
    total = torch.zeros((g.planes, g.depth + 1, g.height, g.width), dtype=torch.float32, device=self.device)
    for k in range(g.kernel[0]):
        tap = _aten.avg_pool2d_backward.default(grad, shape_2d, kernel, stride2, padding2, ceil_mode, True, 1)
        total.index_add_(1, maps[k], tap.view(g.planes, g.out_depth, g.height, g.width))
    return total[:, :g.depth].reshape(self.shape).to(self.dtype)


KERNELS: dict[str, Callable[..., Any]] = {
    "max_pool3d_with_indices": max_pool3d_with_indices,
    "max_pool3d_with_indices.out": copies.out_overload(max_pool3d_with_indices, "out", "indices"),
    "max_pool3d_with_indices_backward": max_pool3d_with_indices_backward,
    "max_pool3d_with_indices_backward.grad_input": copies.out_overload(max_pool3d_with_indices_backward, "grad_input"),
    "avg_pool3d.out": copies.out_overload(avg_pool3d, "out"),
    "avg_pool3d_backward.grad_input": copies.out_overload(avg_pool3d_backward, "grad_input"),
}
