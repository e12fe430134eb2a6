"""Copies that reorder elements along dims: ``flip`` and ``roll``, as strided copies of the pointwise
family (no kernel of their own). flip reads its input through negative strides from the far end of each
flipped dim; roll copies the two pieces of each rolled dim to their places (2^k copies for k dims)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import memory, state
from tunecl.backend.operands import dense_strides_like, operand
from tunecl.errors import Unsupported
from tunecl.kernels.strided import INT32_MAX, Operand


def _like(self: torch.Tensor) -> torch.Tensor:
    return memory.empty(list(self.shape), dense_strides_like(self), self.dtype)


def _dims(dims: Sequence[int], rank: int, what: str) -> list[int]:
    wrapped = []
    for d in dims:
        if not -max(rank, 1) <= d < max(rank, 1):
            raise IndexError(f"{what}: dim {d} is out of range for a {rank}-d tensor")
        wrapped.append(d % max(rank, 1))
    return wrapped


def flip(self: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    dims = _dims(dims, self.dim(), "flip")
    if len(set(dims)) != len(dims):
        raise RuntimeError(f"flip: dims {list(dims)} has a dim more than once")
    out = _like(self)
    if self.numel() == 0:
        return out
    src = operand(self)
    offset, strides = src.offset, list(src.strides)
    for d in set(dims) if self.dim() else ():
        offset += (self.shape[d] - 1) * strides[d]
        strides[d] = -strides[d]
    if offset > INT32_MAX:   # the pointwise family sizes its index type by the reach past the offset
        raise Unsupported("flip of a view starting past 2^31 elements")
    state.get().pointwise("copy", tuple(self.shape), operand(out),
                          [Operand(src.buffer, offset, tuple(strides), src.dtype)])
    return out


def roll(self: torch.Tensor, shifts: Sequence[int], dims: Sequence[int] = ()) -> torch.Tensor:
    if not dims:
        if len(shifts) != 1:
            raise RuntimeError(f"roll: {len(shifts)} shifts without dims (one shift rolls the flattened tensor)")
        return roll(self.reshape(-1), shifts, [0]).view(self.shape)
    if len(shifts) != len(dims):
        raise RuntimeError(f"roll: shifts and dims must align, got {len(shifts)} shifts and {len(dims)} dims")
    if self.dim() == 0:
        raise IndexError(f"roll: dims {list(dims)} of a 0-d tensor (roll it without dims)")
    dims = _dims(dims, self.dim(), "roll")
    out = _like(self)
    if self.numel() == 0:
        return out
    shift = [0] * max(self.dim(), 1)
    for d, s in zip(dims, shifts):
        shift[d] = (shift[d] + s) % self.shape[d]
    src, dst = operand(self), operand(out)
    rolled = [d for d in range(self.dim()) if shift[d]]
    pointwise = state.get().pointwise
    # out[..., (i + s) % n, ...] = self[..., i, ...]: along each rolled dim the first n - s inputs land at s,
    # the last s at 0; every combination of those pieces is one copy
    for pieces in itertools.product((0, 1), repeat=len(rolled)):
        shape = list(self.shape)
        src_offset, dst_offset = src.offset, dst.offset
        for d, piece in zip(rolled, pieces):
            n, s = self.shape[d], shift[d]
            if piece == 0:
                shape[d] = n - s
                dst_offset += s * dst.strides[d]
            else:
                shape[d] = s
                src_offset += (n - s) * src.strides[d]
        pointwise("copy", tuple(shape), dst._replace(offset=dst_offset), [src._replace(offset=src_offset)])
    return out


KERNELS: dict[str, Callable[..., Any]] = {
    "flip": flip,
    "roll": roll,
}
