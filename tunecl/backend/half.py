"""float16 through float32 plans: convert operands to float32 scratch, compute, round the results back.

The backend computes in float32 everywhere ("FP16 inputs with FP32 accumulation"). Families whose
kernels read strided operands with ``vload_half`` (pointwise, reduce) take float16 directly; the
others (GEMM, convolution, pooling, softmax, batch norm) keep a single float32 kernel and run half
operands through these helpers: each float16 input becomes a contiguous float32 copy (exact), the
float32 kernel or tuned plan runs unchanged (so GEMM and conv plans are looked up as the float32
problems they compute), and each float16 output is rounded once, to nearest even, when it is
copied back. GEMMs and convolutions first ask for a float16 plan (an algorithm that reads half operands
itself, such as the tensor-core families where the device's probe granted ``mma_f16``) and come here
only where none applies (:mod:`tunecl.backend.ops.linalg`, :mod:`tunecl.backend.ops.conv`). Any
other dtype raises :class:`Unsupported`, which routes the call to the counted CPU
fallback instead of computing something wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tunecl.backend import copies, memory
from tunecl.errors import Unsupported

COMPUTE = (torch.float32, torch.float16)


def check(*tensors: torch.Tensor | None) -> None:
    """Raise :class:`Unsupported` unless every given tensor is a float32 or float16 opencl tensor."""
    for t in tensors:
        if t is not None and (t.dtype not in COMPUTE or t.device.type != "opencl"):
            raise Unsupported(f"a {t.dtype} tensor on {t.device} (float32/float16 opencl tensors only)")


def to_float32(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` as a contiguous float32 device tensor: itself if it already is one, else a converted copy."""
    if t is None:
        return None
    check(t)
    if t.dtype == torch.float32:
        return copies.contiguous_on_device(t)
    out = memory.empty_contiguous(t.shape, torch.float32)
    copies.device_copy(out, t)
    return out


def float32_target(out: torch.Tensor, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Where a float32 kernel writes the result meant for ``out`` (resized to ``shape`` if given):
    ``out`` itself if it is contiguous float32, else a float32 scratch for :func:`write_back`."""
    check(out)
    if shape is not None and list(out.shape) != list(shape):
        out.resize_(shape)
    if out.dtype == torch.float32 and out.is_contiguous():
        return out
    return memory.empty_contiguous(out.shape, torch.float32)


def write_back(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """Copy (rounding to ``out``'s dtype) a float32 ``result`` from :func:`float32_target` into ``out``."""
    if result is not out:
        copies.device_copy(out, result)
    return out


def empty_like_float32(out_dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
    """A contiguous float32 tensor for a result of dtype ``out_dtype`` (check it first)."""
    if out_dtype not in COMPUTE:
        raise Unsupported(f"a {out_dtype} result (float32/float16 only)")
    return memory.empty_contiguous(shape, torch.float32)


def cast(result: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float32 ``result`` as a new contiguous tensor of ``dtype`` (itself when that is float32)."""
    if dtype == result.dtype:
        return result
    out = memory.empty_contiguous(result.shape, dtype)
    copies.device_copy(out, result)
    return out
