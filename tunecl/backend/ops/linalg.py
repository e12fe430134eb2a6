"""Matrix products (mm, addmm, bmm, baddbmm) through the GEMM family's plans.

Each call becomes a :class:`~tunecl.problems.GemmProblem` (row-major; a transposed view is passed as
``trans_a``/``trans_b`` with its leading dimension instead of being copied) and runs the cached plan
from :mod:`tunecl.backend.plans`. Without a registered GEMM algorithm these ops take the CPU fallback.
float16 products run a float16 plan where an algorithm computes float16 GEMMs on the device
(``gemm_mma_f16`` on tensor cores, where the probe granted ``mma_f16``: half operands read as they
are, fp32 accumulation, one rounding of the result), else the float32 plan of the same shape on
converted operands (the same numerics; :mod:`tunecl.backend.half`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import copies, counters, half, memory, plans, state
from tunecl.backend.memory import buffer_of
from tunecl.backend.operands import kernel_dtype, operand
from tunecl.backend.ops.pointwise import run
from tunecl.errors import Unsupported
from tunecl.kernels import launches
from tunecl.problems import DTYPES, GemmProblem


def _layout(t: torch.Tensor) -> tuple[torch.Tensor, bool, int]:
    """(tensor, transposed, leading dim) reading the last two dims of ``t`` as a row-major matrix
    or the transpose of one; copies to contiguous when neither fits."""
    rows, cols = t.shape[-2], t.shape[-1]
    s_row, s_col = t.stride()[-2], t.stride()[-1]
    if (s_col == 1 or cols == 1) and (rows == 1 or s_row >= max(cols, 1)):
        return t, False, s_row if rows > 1 else max(cols, 1)
    if (s_row == 1 or rows == 1) and (cols == 1 or s_col >= max(rows, 1)):
        return t, True, s_col if cols > 1 else max(rows, 1)
    t = copies.contiguous_on_device(t)
    return t, False, max(cols, 1)


def _batch_stride(t: torch.Tensor) -> int | None:
    """Elements between the matrices of a batch (0 broadcasts one matrix; None: a single matrix)."""
    if t.dim() < 3 or t.shape[0] == 1:
        return None
    return t.stride(0)


# -- pre-built calls ---------------------------------------------------------------------------------
# As convolutions' (tunecl.backend.ops.conv): a float32 product's signature (each operand's shape, strides
# and storage offset, alpha, beta, and the precisions torch's flags accept) fixes its problem, plan and
# launches; the first call records them, later calls bind the three buffers and enqueue (no GemmProblem,
# plan lookup, layout checks or kernel arguments set one by one). Operands that need a copy first and a
# result that is not row-major take the general route.
MAX_CALLS = 1024
_calls = plans.SignatureCalls()      # signature -> _Call, or None: the general route
_FLOAT32 = torch.float32


class _Call:
    __slots__ = ("args", "plan", "run", "source")

    def __init__(self, entry: Any, args: dict[str, Any]) -> None:
        self.plan, self.source, self.args = entry.plan, entry.source, args
        self.run = launches.RecordedRun()


def _fast_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alpha: float, beta: float) -> bool:
    """``_gemm`` by a pre-built call; False (nothing done) where the general route serves the call."""
    if a.dtype is not _FLOAT32 or b.dtype is not _FLOAT32 or out.dtype is not _FLOAT32:
        return False
    key = (a.shape, a.stride(), a.storage_offset(), b.shape, b.stride(), b.storage_offset(), out.shape,
           out.stride(), out.storage_offset(), alpha, beta, plans.accepted_precisions("gemm"))
    call = _calls.lookup(key)
    if call is _calls:
        call = _calls.keep(key, _prebuild(a, b, out, alpha, beta) if _calls.owner.plan is plans.plan else None,
                           MAX_CALLS)
    if call is None:
        return False
    ba, bb, bc = buffer_of(a), buffer_of(b), buffer_of(out)
    counters.plan_sources[call.source] += 1
    plan, args = call.plan, call.args
    call.run(_calls.owner.device, (ba, bb, bc), lambda: plan.run(ba, bb, bc, **args))
    return True


def _prebuild(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alpha: float, beta: float) -> _Call | None:
    """The pre-built call of this signature, or None for the general route (a layout that needs a copy, a
    result that is not row-major, an empty or float16 problem)."""
    batch = a.shape[0] if a.dim() == 3 else 1
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    la, trans_a, lda = _layout(a)
    lb, trans_b, ldb = _layout(b)
    if la is not a or lb is not b or not m * n * k * batch or not _row_major(out, m, n, batch):
        return None
    entry = plans.plan_entry(GemmProblem(m, n, k, trans_a, trans_b, batch, "float32"), count=False)
    return _Call(entry, dict(alpha=float(alpha), beta=float(beta), a_offset=a.storage_offset(),
                             b_offset=b.storage_offset(), c_offset=out.storage_offset(), lda=lda, ldb=ldb,
                             ldc=out.stride()[-2] if m > 1 else n, stride_a=_batch_stride(a),
                             stride_b=_batch_stride(b), stride_c=_batch_stride(out)))


def _row_major(out: torch.Tensor, m: int, n: int, batch: int) -> bool:
    return out.stride()[-1] == 1 and (m == 1 or out.stride()[-2] >= n) and (batch == 1 or out.is_contiguous())


def _gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alpha: float, beta: float) -> None:
    """out = alpha * a @ b + beta * out for 2-d or batched 3-d device tensors (out already sized)."""
    if _fast_gemm(a, b, out, alpha, beta):
        return
    if a.dtype != b.dtype or a.dtype != out.dtype or kernel_dtype(a) not in DTYPES:
        raise Unsupported(f"matrix product of {a.dtype} and {b.dtype} into {out.dtype}")
    batch = a.shape[0] if a.dim() == 3 else 1
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a, trans_a, lda = _layout(a)
    b, trans_b, ldb = _layout(b)
    problem = GemmProblem(m, n, k, trans_a, trans_b, batch, kernel_dtype(a))
    plan = plans.served_plan(problem) if a.dtype == torch.float16 else state.get().plan(problem)
    if plan is None:  # float16: the float32 plan on converted operands, rounded once at the end
        c = half.to_float32(out) if beta != 0 else half.empty_like_float32(out.dtype, out.shape)
        _gemm(half.to_float32(a), half.to_float32(b), c, alpha, beta)
        copies.device_copy(out, c)
        return
    row_major = _row_major(out, m, n, batch)
    c = out if row_major else memory.empty_contiguous(out.shape, out.dtype)
    if not row_major and beta != 0:
        copies.device_copy(c, out)
    plan.run(buffer_of(a), buffer_of(b), buffer_of(c), alpha=float(alpha), beta=float(beta),
             a_offset=a.storage_offset(), b_offset=b.storage_offset(), c_offset=c.storage_offset(),
             lda=lda, ldb=ldb, ldc=c.stride()[-2] if m > 1 else n,
             stride_a=_batch_stride(a), stride_b=_batch_stride(b), stride_c=_batch_stride(c))
    if c is not out:
        copies.device_copy(out, c)


def _product(self: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, beta: float, alpha: float,
             out: torch.Tensor) -> torch.Tensor:
    """out = beta * self + alpha * a @ b (self broadcast; ignored when beta == 0)."""
    shape = [*a.shape[:-1], b.shape[-1]]
    if list(out.shape) != shape:
        out.resize_(shape)
    if out.numel() == 0:
        return out
    if self is None or beta == 0:
        beta = 0.0
    elif not (self is out or (self.shape == out.shape and copies.same_storage(self, out)
                              and self.stride() == out.stride() and self.storage_offset() == out.storage_offset())):
        run("copy", out, (self,))
    if a.shape[-1] == 0:  # empty inner dim: the product is zero
        if beta:
            return run("mul", out, (out, beta))
        state.get().pointwise("fill", out.shape, operand(out), (), (0,))
        return out
    _gemm(a, b, out, alpha, beta)
    return out


KERNELS: dict[str, Callable[..., Any]] = {
    "mm.out": lambda self, mat2, *, out: _product(None, self, mat2, 0.0, 1.0, out),
    "addmm.out": lambda self, mat1, mat2, *, beta=1, alpha=1, out: _product(self, mat1, mat2, beta, alpha, out),
    "bmm.out": lambda self, mat2, *, out: _product(None, self, mat2, 0.0, 1.0, out),
    "baddbmm.out": lambda self, b1, b2, *, beta=1, alpha=1, out: _product(self, b1, b2, beta, alpha, out),
}
