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
from tunecl.backend.ops import COMPOSITE_KEYS
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
        call = _calls.keep(key, _prebuild(a, b, out, alpha, beta) if _calls.prebuilds else None,
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
    """out = beta * self + alpha * a @ b (self broadcast; ignored when beta == 0) for operands on the device
    whose shapes fit (see :func:`_product_out`)."""
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


def _product_out(self: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, beta: float, alpha: float,
                 out: torch.Tensor) -> torch.Tensor:
    """:func:`_product` for the ``out=`` overloads, with the checks torch's structured wrapper leaves to the
    kernel: every operand on the device and ``self`` broadcasting to the product (torch's errors)."""
    for x in (a, b, out) if self is None else (self, a, b, out):
        if x.is_cpu:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{a.device if not a.is_cpu else b.device} and cpu!")
    if self is not None:
        shape = (*a.shape[:-1], b.shape[-1])
        if not _broadcasts_to(self, shape):
            self.expand(shape)   # (raises torch's error)
    return _product(self, a, b, beta, alpha, out)


# -- functional forms ----------------------------------------------------------------------------------
# ``mm(a, b)`` and the others without ``out=`` reach the backend through torch's structured wrapper (its
# shape and dtype checks in C++, then ``aten::empty`` through the dispatcher into Python for the result, then
# the ``.out`` kernel): ~16 µs of the wrapper's allocation per call. They are registered as themselves here:
# for operands of one floating dtype on one device whose shapes fit, the result is allocated directly and
# the ``.out`` route runs; every other call (a mismatch, another rank or dtype: torch's errors) goes to the
# wrapper unchanged, reached by redispatching to a backend key without kernels of its own (PrivateUse3).
_PRODUCT_DTYPES = frozenset({torch.float32, torch.float16})
_aten = torch.ops.aten


def _same_kind(*tensors: torch.Tensor) -> bool:
    """One product dtype and one opencl device for every tensor."""
    first = tensors[0]
    dtype, device = first.dtype, first.device
    return dtype in _PRODUCT_DTYPES and device.type == "opencl" and all(
        t.dtype is dtype and t.device == device for t in tensors[1:])


def _broadcasts_to(t: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """Whether ``t``'s shape broadcasts to ``shape`` (right-aligned, without adding leading dims to it)."""
    return t.dim() <= len(shape) and all(n == 1 or n == m for n, m in zip(reversed(t.shape), reversed(shape)))


def mm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    if self.dim() == 2 and mat2.dim() == 2 and self.shape[1] == mat2.shape[0] and _same_kind(self, mat2):
        out = memory.empty_contiguous((self.shape[0], mat2.shape[1]), self.dtype)
        return _product(None, self, mat2, 0.0, 1.0, out)
    return _aten.mm.default.redispatch(COMPOSITE_KEYS, self, mat2)


def bmm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    if (self.dim() == 3 and mat2.dim() == 3 and self.shape[0] == mat2.shape[0] and self.shape[2] == mat2.shape[1]
            and _same_kind(self, mat2)):
        out = memory.empty_contiguous((self.shape[0], self.shape[1], mat2.shape[2]), self.dtype)
        return _product(None, self, mat2, 0.0, 1.0, out)
    return _aten.bmm.default.redispatch(COMPOSITE_KEYS, self, mat2)


def addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    if mat1.dim() == 2 and mat2.dim() == 2 and mat1.shape[1] == mat2.shape[0]:
        shape = (mat1.shape[0], mat2.shape[1])
        if _broadcasts_to(self, shape) and _same_kind(mat1, mat2, self) and _real(beta) and _real(alpha):
            return _product(self, mat1, mat2, beta, alpha, memory.empty_contiguous(shape, mat1.dtype))
    return _aten.addmm.default.redispatch(COMPOSITE_KEYS, self, mat1, mat2, beta=beta, alpha=alpha)


def baddbmm(self: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: Any = 1,
            alpha: Any = 1) -> torch.Tensor:
    if (batch1.dim() == 3 and batch2.dim() == 3 and batch1.shape[0] == batch2.shape[0]
            and batch1.shape[2] == batch2.shape[1]):
        shape = (batch1.shape[0], batch1.shape[1], batch2.shape[2])
        if _broadcasts_to(self, shape) and _same_kind(batch1, batch2, self) and _real(beta) and _real(alpha):
            return _product(self, batch1, batch2, beta, alpha, memory.empty_contiguous(shape, batch1.dtype))
    return _aten.baddbmm.default.redispatch(COMPOSITE_KEYS, self, batch1, batch2, beta=beta, alpha=alpha)


def _real(number: Any) -> bool:
    """A Python int or float (not a bool or complex: the wrapper checks those against the dtype)."""
    return type(number) is float or type(number) is int


def addmv_out(self: torch.Tensor, mat: torch.Tensor, vec: torch.Tensor, *, beta: Any = 1, alpha: Any = 1,
              out: torch.Tensor) -> torch.Tensor:
    """beta * self + alpha * mat @ vec (``torch.mv`` too) as a product with one column (torch's checks from its
    meta kernel)."""
    meta = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (self, mat, vec)]
    shape = _aten.addmv.default(*meta, beta=beta, alpha=alpha).shape
    column = self.unsqueeze(-1) if self.dim() == 1 else self
    result = _aten.addmm.default(column, mat, vec.unsqueeze(1), beta=beta, alpha=alpha)
    return copies.copy_from_and_resize(result.view(shape), out)


_NEXT = (1, 2, 0)
_AFTER_NEXT = (2, 0, 1)


def linalg_cross_out(self: torch.Tensor, other: torch.Tensor, *, dim: int = -1, out: torch.Tensor) -> torch.Tensor:
    """The cross product of 3-vectors along ``dim``: a[i+1] * b[i+2] - a[i+2] * b[i+1] on the operands broadcast
    (torch's checks from its meta kernel)."""
    meta = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (self, other)]
    shape = _aten.linalg_cross.default(*meta, dim=dim).shape
    a, b = torch.broadcast_tensors(self, other)
    rank = a.dim()
    dim %= rank
    turn = {order: torch.tensor(order, device=a.device) for order in (_NEXT, _AFTER_NEXT)}
    result = (a.index_select(dim, turn[_NEXT]) * b.index_select(dim, turn[_AFTER_NEXT])
              - a.index_select(dim, turn[_AFTER_NEXT]) * b.index_select(dim, turn[_NEXT]))
    return copies.copy_from_and_resize(result.view(shape), out)


KERNELS: dict[str, Callable[..., Any]] = {
    "linalg_cross.out": linalg_cross_out,
    "addmv.out": addmv_out,
    "mm": mm,
    "bmm": bmm,
    "addmm": addmm,
    "baddbmm": baddbmm,
    "mm.out": lambda self, mat2, *, out: _product_out(None, self, mat2, 0.0, 1.0, out),
    "addmm.out": lambda self, mat1, mat2, *, beta=1, alpha=1, out: _product_out(self, mat1, mat2, beta, alpha, out),
    "bmm.out": lambda self, mat2, *, out: _product_out(None, self, mat2, 0.0, 1.0, out),
    "baddbmm.out": lambda self, b1, b2, *, beta=1, alpha=1, out: _product_out(self, b1, b2, beta, alpha, out),
}
