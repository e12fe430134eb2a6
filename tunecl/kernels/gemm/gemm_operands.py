"""A GEMM's operand layouts (leading dimensions, batch strides, offsets) checked against their buffers.

Shared by the plans that run a GEMM on caller buffers: :class:`~tunecl.kernels.gemm.core.GemmPlan` and
:class:`~tunecl.kernels.gemm.gemm_pretrans.PretransposedPlan`.
"""

from __future__ import annotations

import pyopencl as cl

from tunecl.problems import DTYPES, GemmProblem

INT32_MAX = 2**31 - 1  # the kernels index a matrix with 32-bit ints


def check_operand(name: str, buffer: cl.Buffer, offset: int, ld: int | None, stride: int | None,
                  rows: int, cols: int, batch: int, itemsize: int = 4) -> tuple[int, int]:
    """Check one operand's layout against its buffer (``itemsize`` bytes per element); return
    (ld, stride) with defaults filled in."""
    if ld is None:
        ld = cols
    elif ld < cols:
        raise ValueError(f"ld{name}={ld} is smaller than the row length {cols} of {name}")
    if stride is None:
        stride = rows * ld
    elif stride < 0:
        raise ValueError(f"stride_{name}={stride} is negative")
    if offset < 0:
        raise ValueError(f"{name}_offset={offset} is negative")
    extent = (rows - 1) * ld + cols
    if extent > INT32_MAX:
        raise ValueError(f"{name} spans {extent} elements; the kernels index matrices with 32 bits")
    needed = offset + (batch - 1) * stride + extent
    if needed * itemsize > buffer.size:
        raise ValueError(f"buffer {name} holds {buffer.size // itemsize} elements, the layout needs {needed}")
    return ld, stride


def operand_layouts(problem: GemmProblem, a: cl.Buffer, a_offset: int, lda: int | None, stride_a: int | None,
                    b: cl.Buffer, b_offset: int, ldb: int | None,
                    stride_b: int | None) -> tuple[int, int, int, int]:
    """(lda, stride_a, ldb, stride_b) of op(A) and op(B) checked against their buffers (see
    :func:`check_operand`)."""
    p, size = problem, DTYPES[problem.dtype]
    lda, stride_a = check_operand("a", a, a_offset, lda, stride_a, p.k if p.trans_a else p.m,
                                  p.m if p.trans_a else p.k, p.batch, size)
    ldb, stride_b = check_operand("b", b, b_offset, ldb, stride_b, p.n if p.trans_b else p.k,
                                  p.k if p.trans_b else p.n, p.batch, size)
    return lda, stride_a, ldb, stride_b
