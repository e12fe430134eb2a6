"""``F.grid_sample`` on 4-d inputs (``grid_sampler_2d``), bilinear and nearest, with zeros, border and reflection
padding and either ``align_corners``, forward and backward, composed of device ops by torch's formulas
(``GridSampler.h``). Bicubic sampling and 5-d inputs run on the CPU fallback.

Each output position reads its source point ``(ix, iy)``: the grid's coordinates unnormalised to pixels, then
clipped or reflected into the image by the padding mode, as torch computes them, together with the derivative
of that map for the grid's gradient. Bilinear sampling gathers the four neighbours of each point and weighs
them; a neighbour outside the image contributes nothing. Nearest sampling reads the neighbour that the point
rounds to (half to even). The input's gradient adds each weighted output gradient into the neighbours read
(``scatter_add``), the grid's gradient is the weights' derivatives times the neighbours, summed over channels.
float16 computes in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.errors import Unsupported

_BILINEAR, _NEAREST = 0, 1
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _clip(coord: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's clip_coordinates_set_grad: the coordinate clamped into [0, size - 1], and its derivative."""
    inside = (coord > 0) & (coord < size - 1)
    return coord.clamp(0, size - 1), inside.to(coord.dtype)


def _reflect(coord: torch.Tensor, twice_low: int, twice_high: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's reflect_coordinates_set_grad: the coordinate reflected into [low, high], and its derivative."""
    if twice_low == twice_high:
        return torch.zeros_like(coord), torch.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    shifted = coord - low
    sign = torch.where(shifted < 0, -1.0, 1.0).to(coord.dtype)
    distance = shifted.abs()
    extra = torch.fmod(distance, span)
    even = torch.remainder(torch.floor(distance / span), 2) == 0
    return torch.where(even, extra + low, span - extra + low), torch.where(even, sign, -sign)


def _source(coord: torch.Tensor, size: int, padding: int, align_corners: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixel coordinate a grid coordinate reads, and d(pixel)/d(grid)."""
    if align_corners:
        pixel, scale = (coord + 1) / 2 * (size - 1), (size - 1) / 2
    else:
        pixel, scale = ((coord + 1) * size - 1) / 2, size / 2
    grad = torch.full_like(pixel, scale)
    if padding == _BORDER:
        pixel, clipped = _clip(pixel, size)
        grad = grad * clipped
    elif padding == _REFLECTION:
        pixel, reflected = (_reflect(pixel, 0, 2 * (size - 1)) if align_corners
                            else _reflect(pixel, -1, 2 * size - 1))
        pixel, clipped = _clip(pixel, size)
        grad = grad * reflected * clipped
    return pixel, grad


class _Points:
    """The source points of a grid on an (H, W) image: coordinates, derivatives, and the neighbours read."""

    def __init__(self, grid: torch.Tensor, height: int, width: int, interpolation: int, padding: int,
                 align_corners: bool):
        n = grid.shape[0]
        self.ix, self.gx = _source(grid[..., 0].reshape(n, -1), width, padding, align_corners)
        self.iy, self.gy = _source(grid[..., 1].reshape(n, -1), height, padding, align_corners)
        self.width, self.height = width, height
        if interpolation == _NEAREST:
            self.corners = [(torch.round(self.ix), torch.round(self.iy))]
        else:
            x0, y0 = torch.floor(self.ix), torch.floor(self.iy)
            x1, y1 = x0 + 1, y0 + 1
            self.x0, self.y0, self.x1, self.y1 = x0, y0, x1, y1
            self.corners = [(x0, y0), (x1, y0), (x0, y1), (x1, y1)]

    def weights(self) -> list[torch.Tensor]:
        """Each corner's bilinear weight (nw, ne, sw, se), as torch forms them."""
        ix, iy = self.ix, self.iy
        return [(self.x1 - ix) * (self.y1 - iy), (ix - self.x0) * (self.y1 - iy),
                (self.x1 - ix) * (iy - self.y0), (ix - self.x0) * (iy - self.y0)]

    def read(self, corner: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Whether the corner lies in the image (N, L), and its flat position there (0 where it does not)."""
        x, y = corner
        inside = (x >= 0) & (x < self.width) & (y >= 0) & (y < self.height)
        position = torch.where(inside, y * self.width + x, 0).to(torch.int64)
        return inside, position


def _check(input: torch.Tensor, interpolation: int) -> None:
    if interpolation not in (_BILINEAR, _NEAREST):
        raise Unsupported("bicubic grid_sample")
    if input.dtype not in (torch.float32, torch.float16):
        raise Unsupported(f"grid_sample of {input.dtype}")


def _gather(flat: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """flat (N, C, P) read at position (N, L) for every channel: (N, C, L)."""
    return torch.gather(flat, 2, position.unsqueeze(1).expand(-1, flat.shape[1], -1))


def grid_sampler_2d(input: torch.Tensor, grid: torch.Tensor, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> torch.Tensor:
    _check(input, interpolation_mode)
    n, c, h, w = input.shape
    out_h, out_w = grid.shape[1], grid.shape[2]
    if not input.numel() or not grid.numel():
        return torch.zeros((n, c, out_h, out_w), dtype=input.dtype, device=input.device)
    flat = input.float().reshape(n, c, h * w)
    points = _Points(grid.float(), h, w, interpolation_mode, padding_mode, align_corners)
    weights = points.weights() if interpolation_mode == _BILINEAR else [None]
    out = None
    for corner, weight in zip(points.corners, weights):
        inside, position = points.read(corner)
        factor = inside.to(flat.dtype) if weight is None else torch.where(inside, weight, 0)
        term = _gather(flat, position) * factor.unsqueeze(1)
        out = term if out is None else out + term
    return out.view(n, c, out_h, out_w).to(input.dtype)


def grid_sampler_2d_backward(grad_output: torch.Tensor, input: torch.Tensor, grid: torch.Tensor,
                             interpolation_mode: int, padding_mode: int, align_corners: bool,
                             output_mask: Sequence[bool]) -> tuple[torch.Tensor | None, torch.Tensor]:
    _check(input, interpolation_mode)
    n, c, h, w = input.shape
    grad_grid = torch.zeros(grid.shape, dtype=grid.dtype, device=grid.device)
    grad_input = torch.zeros(input.shape, dtype=input.dtype, device=input.device) if output_mask[0] else None
    if not input.numel() or not grid.numel():
        return grad_input, grad_grid
    points = _Points(grid.float(), h, w, interpolation_mode, padding_mode, align_corners)
    upstream = grad_output.float().reshape(n, c, -1)
    flat = input.float().reshape(n, c, h * w)
    weights = points.weights() if interpolation_mode == _BILINEAR else [None]
    reads = [points.read(corner) for corner in points.corners]
    if output_mask[0]:
        total = torch.zeros((n, c, h * w), dtype=torch.float32, device=input.device)
        for (inside, position), weight in zip(reads, weights):
            factor = inside.to(flat.dtype) if weight is None else torch.where(inside, weight, 0)
            total.scatter_add_(2, position.unsqueeze(1).expand(-1, c, -1), upstream * factor.unsqueeze(1))
        grad_input = total.view(input.shape).to(input.dtype)
    if interpolation_mode == _BILINEAR and (len(output_mask) < 2 or output_mask[1]):
        # sum over channels of each corner's value times the output gradient
        s = [(torch.where(inside.unsqueeze(1), _gather(flat, position), 0) * upstream).sum(1)
             for inside, position in reads]
        ix, iy = points.ix, points.iy
        below_y, above_y = points.y1 - iy, iy - points.y0
        below_x, above_x = points.x1 - ix, ix - points.x0
        gix = (s[1] - s[0]) * below_y + (s[3] - s[2]) * above_y
        giy = (s[2] - s[0]) * below_x + (s[3] - s[1]) * above_x
        grad_grid = torch.stack((gix * points.gx, giy * points.gy), -1).view(grid.shape).to(grid.dtype)
    return grad_input, grad_grid


KERNELS: dict[str, Callable[..., Any]] = {
    "grid_sampler_2d": grid_sampler_2d,
    "grid_sampler_2d_backward": grid_sampler_2d_backward,
}
