"""Adaptive max pooling, 2-d and 3-d (``F.adaptive_max_pool2d`` / ``3d``, their modules), forward and backward.

Output cell ``i`` of a dim of size ``n`` pooled to ``m`` covers input positions ``floor(i * n / m)`` up to
``ceil((i + 1) * n / m)``, torch's windows. One index map per geometry, built on the CPU and kept on the
device, lists each cell's input positions in scan order (depth, row, column), padded to the largest window
by a slot that holds -inf. The forward gathers every cell's window from the planes with that slot appended
and takes the maximum over it: the first maximal position, as torch's CPU kernel keeps on ties (the padding
slot, listed last, never wins), or the window's last NaN, as that kernel keeps it. The index is the
position's flat offset in its plane. The backward adds each output gradient into the position its index
names (``scatter_add``). float16 pools in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import copies
from tunecl.backend.ops.device_tables import DeviceTables
from tunecl.backend.ops.nn import max_pool_backward

_aten = torch.ops.aten
_maps = DeviceTables(128)   # (input sizes, output sizes) -> the index map


def _windows(size: int, cells: int) -> list[range]:
    return [range(i * size // cells, -(-(i + 1) * size // cells)) for i in range(cells)]


def _index_map(sizes: Sequence[int], cells: Sequence[int], device: torch.device) -> torch.Tensor:
    """(cells..., widest window) int64: each cell's flat input positions, then the slot (the plane's size)."""
    def make() -> torch.Tensor:
        per_dim = [_windows(n, m) for n, m in zip(sizes, cells)]
        strides = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]
        widest = math.prod(max(len(w) for w in windows) for windows in per_dim)
        slot = math.prod(sizes)
        rows = []
        for cell in _cells(per_dim):
            positions = [sum(p * s for p, s in zip(point, strides)) for point in _points(cell)]
            rows.append(positions + [slot] * (widest - len(positions)))
        return torch.tensor(rows, dtype=torch.int64)
    return _maps.get((tuple(sizes), tuple(cells)), device, make)


def _cells(per_dim: list[list[range]]) -> list[tuple[range, ...]]:
    out: list[tuple[range, ...]] = [()]
    for windows in per_dim:
        out = [cell + (w,) for cell in out for w in windows]
    return out


def _points(cell: tuple[range, ...]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for window in cell:
        out = [point + (p,) for point in out for p in window]
    return out


def _forward(dims: int) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    check = getattr(_aten, f"adaptive_max_pool{dims}d").default

    def kernel(self: torch.Tensor, output_size: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        meta = check(torch.empty(self.shape, dtype=self.dtype, device="meta"), output_size)[0]
        if not meta.numel():
            return (torch.empty(meta.shape, dtype=self.dtype, device=self.device),
                    torch.empty(meta.shape, dtype=torch.int64, device=self.device))
        sizes = list(self.shape[-dims:])
        cells = list(meta.shape[-dims:])
        index = _index_map(sizes, cells, self.device)
        planes = self.reshape(-1, math.prod(sizes))
        source = torch.full((planes.shape[0], planes.shape[1] + 1), float("-inf"), dtype=torch.float32,
                            device=self.device)
        source[:, :-1] = planes
        windows = source.index_select(1, index.view(-1)).view(planes.shape[0], *index.shape)
        values, picked = torch.max(windows, -1)
        # torch's kernel keeps the last NaN of a window, max the first
        last = windows.shape[-1] - 1 - torch.max(torch.isnan(windows).flip(-1).float(), -1).indices
        picked = torch.where(torch.isnan(values), last, picked)
        positions = torch.gather(index.expand(planes.shape[0], *index.shape), 2, picked.unsqueeze(-1)).squeeze(-1)
        return values.view(meta.shape).to(self.dtype), positions.view(meta.shape)
    return kernel


def _backward_of(dims: int) -> Callable[..., torch.Tensor]:
    def kernel(grad_output: torch.Tensor, self: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return max_pool_backward(grad_output, self, indices, dims)
    return kernel


KERNELS: dict[str, Callable[..., Any]] = {}
for _dims in (2, 3):
    KERNELS[f"adaptive_max_pool{_dims}d.out"] = copies.out_overload(_forward(_dims), "out", "indices")
    KERNELS[f"adaptive_max_pool{_dims}d_backward.grad_input"] = copies.out_overload(_backward_of(_dims), "grad_input")
