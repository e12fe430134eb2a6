"""``torch.searchsorted`` and ``torch.bucketize`` on the device: one binary search per value, by torch's CPU
comparisons (``right`` / ``side``, ``sorter``, ``out_int32``, one boundary row shared or one per leading
index, NaN where torch's kernel puts it).

As torch does, values and boundaries are compared in their common dtype: here float32 for floating types
(float16 converts exactly) and int64 for integers. torch's shape checks come from its meta kernel; a sorter
is checked to hold positions within its row, as torch's is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import copies, memory, state
from tunecl.backend.operands import operand
from tunecl.errors import Unsupported

_aten = torch.ops.aten
_SEARCHABLE = (torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _meta(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")


def _keys(t: torch.Tensor, key: torch.dtype) -> torch.Tensor:
    """``t`` flattened into a contiguous tensor of the comparison dtype."""
    flat = memory.empty_contiguous([t.numel()], key)
    copies.device_copy(flat, t.reshape(-1))
    return flat


def _search(sorted_sequence: torch.Tensor, values: torch.Tensor, out_int32: bool, right: bool,
            sorter: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    common = torch.result_type(sorted_sequence, values)
    if common not in _SEARCHABLE or sorted_sequence.dtype not in _SEARCHABLE or values.dtype not in _SEARCHABLE:
        raise Unsupported(f"searchsorted of {values.dtype} in {sorted_sequence.dtype}")
    if list(out.shape) != list(values.shape):
        out.resize_(values.shape)
    n = sorted_sequence.shape[-1] if sorted_sequence.dim() else 1
    if sorter is not None and sorter.numel():
        low, high = (int(v) for v in torch.aminmax(sorter))
        if low < 0 or high >= n:
            raise RuntimeError("torch.searchsorted(): sorter index out of range")
    if values.numel() == 0:
        return out
    key = torch.float32 if common.is_floating_point else torch.int64
    rows = sorted_sequence.dim() > 1
    inner = values.shape[-1] if values.dim() else 1
    target = out if out.is_contiguous() else memory.empty_contiguous(list(out.shape), out.dtype)
    # (the key tensors stay referenced until the launch is enqueued: a freed one's memory is reused at once)
    value_keys, boundary_keys = _keys(values, key), _keys(sorted_sequence, key)
    positions = None if sorter is None else _keys(sorter, torch.int64)
    state.get().sort.search_sorted(values.numel(), operand(value_keys), inner, operand(boundary_keys), n, rows,
                                   None if positions is None else operand(positions), right, operand(target))
    if target is not out:
        copies.device_copy(out, target)
    return out


def _right(right: bool, side: str | None) -> bool:
    return side == "right" if side is not None else right


def searchsorted_tensor_out(sorted_sequence: torch.Tensor, self: torch.Tensor, *, out_int32: bool = False,
                            right: bool = False, side: str | None = None, sorter: torch.Tensor | None = None,
                            out: torch.Tensor) -> torch.Tensor:
    expected = _aten.searchsorted.Tensor(_meta(sorted_sequence), _meta(self), out_int32=out_int32, right=right,
                                         side=side, sorter=_meta(sorter))
    if out.dtype != expected.dtype:
        raise RuntimeError(f"torch.searchsorted(): output tensor's dtype is wrong, it can only be Int(int32) or "
                           f"Long(int64) depending on whether out_int32 flag is True, but we got output tensor's "
                           f"dtype {out.dtype} and out_int32 flag is {out_int32}")
    return _search(sorted_sequence, self, out_int32, _right(right, side), sorter, out)


def searchsorted_tensor(sorted_sequence: torch.Tensor, self: torch.Tensor, *, out_int32: bool = False,
                        right: bool = False, side: str | None = None,
                        sorter: torch.Tensor | None = None) -> torch.Tensor:
    out = memory.empty_contiguous(list(self.shape), torch.int32 if out_int32 else torch.int64)
    return searchsorted_tensor_out(sorted_sequence, self, out_int32=out_int32, right=right, side=side,
                                   sorter=sorter, out=out)


def searchsorted_scalar(sorted_sequence: torch.Tensor, self: Any, *, out_int32: bool = False, right: bool = False,
                        side: str | None = None, sorter: torch.Tensor | None = None) -> torch.Tensor:
    if sorted_sequence.dim() != 1:
        raise RuntimeError(f"torch.searchsorted(): input value can be a scalar only when boundaries tensor "
                           f"dimension is 1, but we got boundaries tensor dim({sorted_sequence.dim()}) and input "
                           f"value's dim(0) numel(1)")
    value = copies.upload(torch.tensor(self, dtype=torch.result_type(sorted_sequence, self)))
    return searchsorted_tensor(sorted_sequence, value, out_int32=out_int32, right=right, side=side, sorter=sorter)


def searchsorted_scalar_out(sorted_sequence: torch.Tensor, self: Any, *, out_int32: bool = False,
                            right: bool = False, side: str | None = None, sorter: torch.Tensor | None = None,
                            out: torch.Tensor) -> torch.Tensor:
    return copies.copy_from_and_resize(searchsorted_scalar(sorted_sequence, self, out_int32=out_int32, right=right,
                                                           side=side, sorter=sorter), out)


def _check_boundaries(boundaries: torch.Tensor) -> None:
    if boundaries.dim() != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.dim()})")


def bucketize_tensor_out(self: torch.Tensor, boundaries: torch.Tensor, *, out_int32: bool = False,
                         right: bool = False, out: torch.Tensor) -> torch.Tensor:
    _check_boundaries(boundaries)
    return searchsorted_tensor_out(boundaries, self, out_int32=out_int32, right=right, out=out)


def bucketize_tensor(self: torch.Tensor, boundaries: torch.Tensor, *, out_int32: bool = False,
                     right: bool = False) -> torch.Tensor:
    _check_boundaries(boundaries)
    return searchsorted_tensor(boundaries, self, out_int32=out_int32, right=right)


def bucketize_scalar(self: Any, boundaries: torch.Tensor, *, out_int32: bool = False,
                     right: bool = False) -> torch.Tensor:
    _check_boundaries(boundaries)
    return searchsorted_scalar(boundaries, self, out_int32=out_int32, right=right)


KERNELS: dict[str, Callable[..., Any]] = {
    "searchsorted.Tensor": searchsorted_tensor,
    "searchsorted.Tensor_out": searchsorted_tensor_out,
    "searchsorted.Scalar": searchsorted_scalar,
    "searchsorted.Scalar_out": searchsorted_scalar_out,
    "bucketize.Tensor": bucketize_tensor,
    "bucketize.Tensor_out": bucketize_tensor_out,
    "bucketize.Scalar": bucketize_scalar,
}
