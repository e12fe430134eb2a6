"""Transformer ops: the triangle masks (tril/triu, causal attention masks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import copies, memory, state
from tunecl.backend.operands import operand
from tunecl.kernels.strided import Operand, Unsupported, merge_dims


def _tri(lower: bool, self: torch.Tensor, diagonal: int, out: torch.Tensor) -> torch.Tensor:
    """``tril``/``triu`` of ``self`` into ``out`` (``out`` may be ``self``: the in-place forms). Batch dims
    are merged into one; where they cannot be (a view with gaps between matrices), a contiguous copy of
    ``self`` is masked into a contiguous temporary that is copied into ``out``."""
    if self.dim() < 2:
        raise Unsupported(f"tril/triu of a {self.dim()}-d tensor")
    if out.dtype != self.dtype:
        raise Unsupported(f"tril/triu of {self.dtype} into {out.dtype}")
    if list(out.shape) != list(self.shape):
        out.resize_(self.shape)
    if self.numel() == 0:
        return out
    lead = list(self.shape[:-2])
    merged, (src_lead, out_lead) = merge_dims(lead, [self.stride()[:-2], out.stride()[:-2]])
    target = out
    if len(merged) > 1:
        self = copies.contiguous_on_device(self)
        target = out if out.is_contiguous() else memory.empty_contiguous(out.shape, out.dtype)
        merged, (src_lead, out_lead) = merge_dims(lead, [self.stride()[:-2], target.stride()[:-2]])
    src, dst = operand(self), operand(target)
    state.get().transformer.tri(lower, merged[0], self.shape[-2], self.shape[-1], diagonal,
                                Operand(dst.buffer, dst.offset, (out_lead[0], *dst.strides[-2:]), dst.dtype),
                                Operand(src.buffer, src.offset, (src_lead[0], *src.strides[-2:]), src.dtype))
    if target is not out:
        copies.device_copy(out, target)
    return out


def tril_out(self: torch.Tensor, diagonal: int = 0, *, out: torch.Tensor) -> torch.Tensor:
    return _tri(True, self, diagonal, out)


def triu_out(self: torch.Tensor, diagonal: int = 0, *, out: torch.Tensor) -> torch.Tensor:
    return _tri(False, self, diagonal, out)


KERNELS: dict[str, Callable[..., Any]] = {
    "tril.out": tril_out,
    "triu.out": triu_out,
}
