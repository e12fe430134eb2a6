"""Tensors as the kernel layer sees them, plus small layout helpers shared by the op adapters."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tunecl.backend.dtypes import KERNEL_NAMES
from tunecl.backend.allocator import buffers as _buffers
from tunecl.errors import Unsupported
from tunecl.kernels.strided import Operand


def wrapped_dim(dim: int, ndim: int) -> int:
    """``dim`` of a tensor with ``ndim`` dims (0-dim tensors take 0 and -1), counted from the front; torch's
    IndexError when it is out of range."""
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})")
    return dim % rank


def is_device(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "opencl"


def kernel_dtype(t: torch.Tensor) -> str:
    try:
        return KERNEL_NAMES[t.dtype]
    except KeyError:
        raise Unsupported(f"no kernels for {t.dtype}") from None


def layout_key(t: torch.Tensor | None) -> tuple | None:
    """What a recorded launch fixed of an operand (``kernels.launches.RecordedRun``): its shape, strides,
    storage offset and dtype; None for an absent one. Part of a pre-built call's signature."""
    return None if t is None else (t.shape, t.stride(), t.storage_offset(), t.dtype)


def buffers_of(tensors: Sequence[torch.Tensor | None]) -> tuple:
    """The ``cl.Buffer`` of each tensor (None for an absent one): a pre-built call's buffers by role."""
    return tuple(None if t is None else _buffers[t.untyped_storage().data_ptr()] for t in tensors)


def operand(t: torch.Tensor) -> Operand:
    """``t`` with its own strides (the iteration shape is ``t.shape``)."""
    try:
        buffer = _buffers[t.untyped_storage().data_ptr()]
    except KeyError:  # not one of our storages: a CPU (or meta, ...) tensor
        raise Unsupported(f"a {t.device.type} tensor among opencl operands") from None
    return Operand(buffer, t.storage_offset(), t.stride(), kernel_dtype(t))


def broadcast_strides(size: Sequence[int], stride: Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    """Strides that read a tensor of ``size``/``stride`` broadcast to ``shape`` (0 where broadcast)."""
    lead = len(shape) - len(size)
    if lead < 0:
        raise Unsupported(f"cannot broadcast {tuple(size)} to {tuple(shape)}")
    out = [0] * len(shape)
    for i, (n, s) in enumerate(zip(size, stride)):
        if n != 1:
            out[lead + i] = s
    return tuple(out)


def broadcast_operand(t: torch.Tensor, shape: Sequence[int]) -> Operand:
    """``t`` read as if expanded to ``shape``."""
    if t.shape == shape:
        return operand(t)
    base = operand(t)
    return base._replace(strides=broadcast_strides(t.shape, base.strides, shape))


def scalar_or_operand(x: object, shape: Sequence[int]) -> Operand | float | int | bool:
    """A pointwise input: device tensors become operands; Python numbers and 0-dim CPU tensors
    (wrapped numbers such as the 2 in ``x * 2``) become kernel scalar arguments."""
    if isinstance(x, torch.Tensor):
        if x.is_cpu and x.dim() == 0:
            return x.item()
        return broadcast_operand(x, shape)
    if isinstance(x, (bool, int, float)):
        return x
    raise Unsupported(f"operand of type {type(x).__name__}")


def is_dense(size: Sequence[int], stride: Sequence[int]) -> bool:
    """True when the elements exactly fill their span without overlap (any dim order)."""
    if 0 in size:
        return True
    dims = sorted((s, n) for n, s in zip(size, stride) if n != 1)
    expected = 1
    for s, n in dims:
        if s != expected:
            return False
        expected *= n
    return True


def dense_strides_like(t: torch.Tensor) -> list[int]:
    """``t``'s strides if it is dense (preserve_format), else contiguous strides."""
    from tunecl.backend.memory import contiguous_strides

    if t.is_contiguous():
        return contiguous_strides(t.shape)
    if is_dense(t.shape, t.stride()):
        return list(t.stride())
    return contiguous_strides(t.shape)


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
