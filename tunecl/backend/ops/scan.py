"""Prefix sums and products: ``cumsum`` and ``cumprod`` along any dim (their in-place and functional forms
reach ``cumsum.out`` / ``cumprod.out``; cumprod's backward is torch's formula over device ops).

As torch does, the input is first converted to the result's dtype; float32 accumulates in float32,
integers in int64 (wrapping into narrower results as torch's do); float16 results go through float32."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import copies, memory, state
from tunecl.backend.operands import operand
from tunecl.errors import Unsupported
from tunecl.kernels.strided import Operand, merge_dims

_INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def split_lines(shape: list[int], dim: int, strides: list[tuple[int, ...]]) -> tuple[list[int], list[list[int]]] | None:
    """The dims other than ``dim`` merged into (A, B) for every stride set, or None where they do not merge."""
    rest = [n for d, n in enumerate(shape) if d != dim]
    merged, sets = merge_dims(rest, [[s for d, s in enumerate(st) if d != dim] for st in strides])
    if len(merged) > 2:
        return None
    if len(merged) == 1:
        merged, sets = [1, merged[0]], [[0, s[0]] for s in sets]
    return merged, sets


def _scan(op: str, length: int, dim: int, dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst = cumsum(src, dim)`` or ``cumprod`` (``op`` "sum" or "product") for same-dtype tensors (float32 or
    integers), any strides."""
    shape = list(src.shape)
    found = split_lines(shape, dim, [src.stride(), dst.stride()])
    target = dst
    if found is None:   # batch dims that do not merge: through contiguous copies
        src = copies.contiguous_on_device(src)
        target = memory.empty_contiguous(shape, dst.dtype)
        found = split_lines(shape, dim, [src.stride(), target.stride()])
    lines, (src_ab, dst_ab) = found
    s, d = operand(src), operand(target)
    state.get().scan.scan(op, length, (lines[0], lines[1]),
                          Operand(d.buffer, d.offset, (target.stride(dim), *dst_ab), d.dtype),
                          Operand(s.buffer, s.offset, (src.stride(dim), *src_ab), s.dtype))
    if target is not dst:
        copies.device_copy(dst, target)


def _cumulative(op: str, self: torch.Tensor, dim: int, dtype: torch.dtype | None, out: torch.Tensor) -> torch.Tensor:
    name = "cumsum" if op == "sum" else "cumprod"
    result_dtype = dtype or (torch.int64 if not self.is_floating_point() and not self.is_complex() else self.dtype)
    if out.dtype != result_dtype:
        raise RuntimeError(f"{name}: out has dtype {out.dtype}, expected {result_dtype}")
    if result_dtype not in (torch.float32, torch.float16, *_INTEGERS) or self.dtype not in memory_dtypes():
        raise Unsupported(f"{name} of {self.dtype} into {result_dtype}")
    rank = max(self.dim(), 1)
    if not -rank <= dim < rank:
        raise IndexError(f"{name}: dim {dim} is out of range for a {self.dim()}-d tensor")
    if list(out.shape) != list(self.shape):
        out.resize_(self.shape)
    if self.numel() == 0:
        return out
    if self.dim() == 0:
        copies.device_copy(out, self)
        return out
    dim %= self.dim()
    compute = torch.float32 if result_dtype.is_floating_point else result_dtype
    src = self
    if src.dtype != compute:
        src = memory.empty_contiguous(self.shape, compute)
        copies.device_copy(src, self)
    dst = out if out.dtype == compute else memory.empty_contiguous(self.shape, compute)
    _scan(op, self.shape[dim], dim, dst, src)
    if dst is not out:
        copies.device_copy(out, dst)
    return out


def cumsum_out(self: torch.Tensor, dim: int, dtype: torch.dtype | None = None, *, out: torch.Tensor) -> torch.Tensor:
    return _cumulative("sum", self, dim, dtype, out)


def cumprod_out(self: torch.Tensor, dim: int, dtype: torch.dtype | None = None, *, out: torch.Tensor) -> torch.Tensor:
    return _cumulative("product", self, dim, dtype, out)


def memory_dtypes() -> tuple[torch.dtype, ...]:
    return (torch.float32, torch.float16, torch.bool, *_INTEGERS)


KERNELS: dict[str, Callable[..., Any]] = {
    "cumsum.out": cumsum_out,
    "cumprod.out": cumprod_out,
}
