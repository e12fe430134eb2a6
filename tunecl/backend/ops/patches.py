"""Sliding local blocks: ``im2col`` and ``col2im`` (``F.unfold`` / ``nn.Unfold``, ``F.fold`` / ``nn.Fold``),
batched and unbatched, on the device. Each is the other's gradient, so autograd runs them both ways.

Both are gathers by an index map over the flattened spatial positions, built once per geometry on the CPU
and kept on the device. The source gets one zero slot appended after its last position; a map entry that
falls into the padding reads that slot.

- ``im2col``: column ``(ki, kj)`` at block ``l`` reads input position ``(oh*sh + ki*dh - ph, ow*sw + kj*dw - pw)``.
  One ``index_select`` of ``(N, C, H*W + 1)`` by a map of ``kh*kw*L`` entries gives ``(N, C*kh*kw, L)``.
- ``col2im``: output position ``(y, x)`` is the sum of the ``kh*kw`` columns that read it. One ``index_select``
  of ``(N, C, kh*kw*L + 1)`` by a map of ``H*W*kh*kw`` entries (a position that fewer columns read points
  its spare entries at the zero slot), then a sum over the last dim. The sum runs in a fixed order, so the
  result is the same run to run, with no atomics.

float16 is gathered in float32, which is exact, and col2im sums in float32 and rounds once. torch's checks
and errors come from its meta kernels on the operands' shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import copies
from tunecl.backend.ops.device_tables import DeviceTables
from tunecl.backend.ops.indexing import index_select

_aten = torch.ops.aten
_maps = DeviceTables(256)   # (kind, geometry) -> the index map


def _blocks(size: Sequence[int], kernel: Sequence[int], dilation: Sequence[int], padding: Sequence[int],
            stride: Sequence[int]) -> list[int]:
    return [(size[d] + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1) // stride[d] + 1 for d in range(2)]


def _read_positions(size: Sequence[int], kernel: Sequence[int], dilation: Sequence[int], padding: Sequence[int],
                    stride: Sequence[int]) -> torch.Tensor:
    """(kh*kw, L): the flat input position each column reads, or H*W (the zero slot) in the padding."""
    (h, w), (kh, kw) = size, kernel
    oh, ow = _blocks(size, kernel, dilation, padding, stride)
    rows = (torch.arange(kh).view(kh, 1, 1, 1) * dilation[0] + torch.arange(oh).view(1, 1, oh, 1) * stride[0]
            - padding[0])
    cols = (torch.arange(kw).view(1, kw, 1, 1) * dilation[1] + torch.arange(ow).view(1, 1, 1, ow) * stride[1]
            - padding[1])
    inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
    return torch.where(inside, rows * w + cols, h * w).reshape(kh * kw, oh * ow)


def _index_map(kind: str, size: Sequence[int], kernel: Sequence[int], dilation: Sequence[int],
               padding: Sequence[int], stride: Sequence[int], device: torch.device) -> torch.Tensor:
    def make() -> torch.Tensor:
        reads = _read_positions(size, kernel, dilation, padding, stride)
        if kind == "im2col":
            return reads.reshape(-1).to(torch.int64)
        # for each output position, the columns that read it; the rest point past the last column
        positions = size[0] * size[1]
        spare = reads.numel()
        inside = reads < positions
        column = torch.arange(spare).view(reads.shape)[inside]
        target = reads[inside]
        order = torch.argsort(target * spare + column)   # by position, then column: a fixed sum order
        target, column = target[order], column[order]
        rank = torch.arange(target.numel()) - torch.searchsorted(target, target)
        width = max(int(rank.max()) + 1 if rank.numel() else 1, 1)
        table = torch.full((positions, width), spare, dtype=torch.int64)
        table[target, rank] = column
        return table.reshape(-1)
    return _maps.get((kind, *size, *kernel, *dilation, *padding, *stride), device, make)


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _with_zero_slot(flat: torch.Tensor) -> torch.Tensor:
    """(N, C, P) -> (N, C, P + 1), the last entry zero; float16 becomes float32."""
    dtype = torch.float32 if flat.dtype == torch.float16 else flat.dtype
    out = torch.zeros((*flat.shape[:-1], flat.shape[-1] + 1), dtype=dtype, device=flat.device)
    out[..., :-1] = flat
    return out


def im2col(self: torch.Tensor, kernel_size: Sequence[int], dilation: Sequence[int], padding: Sequence[int],
           stride: Sequence[int]) -> torch.Tensor:
    shape = _aten.im2col.default(_meta(self), kernel_size, dilation, padding, stride).shape
    batched = self.dim() == 4
    x = self if batched else self.unsqueeze(0)
    n, c, h, w = x.shape
    if not x.numel() or not shape.numel():
        return torch.zeros(shape, dtype=self.dtype, device=self.device)
    index = _index_map("im2col", (h, w), kernel_size, dilation, padding, stride, self.device)
    cols = index_select(_with_zero_slot(x.reshape(n, c, h * w)), 2, index)
    return cols.to(self.dtype).view(shape)


def col2im(self: torch.Tensor, output_size: Sequence[int], kernel_size: Sequence[int], dilation: Sequence[int],
           padding: Sequence[int], stride: Sequence[int]) -> torch.Tensor:
    shape = _aten.col2im.default(_meta(self), output_size, kernel_size, dilation, padding, stride).shape
    batched = self.dim() == 3
    cols = self if batched else self.unsqueeze(0)
    n, c = cols.shape[0], shape[-3]
    if not cols.numel() or not shape.numel():
        return torch.zeros(shape, dtype=self.dtype, device=self.device)
    h, w = output_size
    index = _index_map("col2im", (h, w), kernel_size, dilation, padding, stride, self.device)
    reads = index_select(_with_zero_slot(cols.reshape(n, c, -1)), 2, index)
    out = reads.view(n, c, h * w, -1).sum(-1)
    return out.to(self.dtype).view(shape)


KERNELS: dict[str, Callable[..., Any]] = {
    "im2col": im2col,
    "im2col.out": copies.out_overload(im2col),
    "col2im": col2im,
    "col2im.out": copies.out_overload(col2im),
}
