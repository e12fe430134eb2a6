"""Indexing along one dim: gather, scatter (src and value) and index_select."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import memory, state
from tunecl.backend.operands import operand
from tunecl.backend.ops.pointwise import run
from tunecl.errors import Unsupported


def _with_dim_zeroed(strides: tuple[int, ...], dim: int) -> tuple[int, ...]:
    return tuple(0 if d == dim else s for d, s in enumerate(strides))


def gather_out(self: torch.Tensor, dim: int, index: torch.Tensor, *, sparse_grad: bool = False,
               out: torch.Tensor) -> torch.Tensor:
    dim = dim % max(self.dim(), 1)
    if out.shape != index.shape:
        out.resize_(index.shape)
    if self.dim() != index.dim():
        raise Unsupported("gather with an index of another rank")
    src = operand(self)
    src = src._replace(strides=_with_dim_zeroed(src.strides, dim))
    state.get().index(False, tuple(index.shape), operand(out), operand(index), src,
                      self.shape[dim] if self.dim() else 1, self.stride(dim) if self.dim() else 0)
    return out


def scatter_out(self: torch.Tensor, dim: int, index: torch.Tensor, src: Any, *, out: torch.Tensor) -> torch.Tensor:
    """``scatter`` (src tensor or value): out = self, then out[index along dim] = src. The index
    may be smaller than self in every dim; coordinates are shared, so strides apply unchanged."""
    if index.numel() and self.dim() != index.dim():
        raise Unsupported("scatter with an index of another rank")
    dim = dim % max(self.dim(), 1)
    if not (out.untyped_storage().data_ptr() == self.untyped_storage().data_ptr()
            and out.stride() == self.stride() and out.storage_offset() == self.storage_offset()):
        run("copy", out, (self,))
    target = operand(out)
    target = target._replace(strides=_with_dim_zeroed(target.strides, dim))
    source = operand(src) if isinstance(src, torch.Tensor) else src
    state.get().index(True, tuple(index.shape), target, operand(index), source,
                      out.shape[dim] if out.dim() else 1, out.stride(dim) if out.dim() else 0)
    return out


def index_select_out(self: torch.Tensor, dim: int, index: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    if index.dim() > 1:
        raise Unsupported("index_select with a multi-dim index")
    dim = dim % max(self.dim(), 1)
    shape = list(self.shape)
    if self.dim():
        shape[dim] = index.numel()
    if list(out.shape) != shape:
        out.resize_(shape)
    src = operand(self)
    src = src._replace(strides=_with_dim_zeroed(src.strides, dim))
    idx = operand(index)
    idx = idx._replace(strides=tuple(idx.strides[0] if index.dim() and d == dim else 0 for d in range(len(shape))))
    state.get().index(False, tuple(shape), operand(out), idx, src, self.shape[dim] if self.dim() else 1,
                      self.stride(dim) if self.dim() else 0)
    return out


def index_select(self: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    shape = list(self.shape)
    if self.dim():
        shape[dim % self.dim()] = index.numel()
    return index_select_out(self, dim, index, out=memory.empty_contiguous(shape, self.dtype))


KERNELS: dict[str, Callable[..., Any]] = {
    "index_select": index_select,
    "gather.out": gather_out,
    "scatter.src_out": scatter_out,
    "scatter.value_out": scatter_out,
    "index_select.out": index_select_out,
}
