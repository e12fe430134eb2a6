"""A GEMM plan behind transposed copies of its operands.

Some kernels copy tiles into local memory only as the operand lies in global memory: ``gemm_tiled``
with cp.async wants A stored K x M and B stored K x N (MN-contiguous), ``gemm_wgmma_tf32`` wants A
stored M x K and B stored N x K (K-contiguous). For a problem stored the other way, the plan first
transposes each such operand into a packed workspace (``transpose.cl``; allocated with the plan), then
runs the kernel's plan for the layout it wants (:func:`with_layout`) on the copies.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyopencl as cl

from tunecl.kernels.base import Config
from tunecl.kernels.gemm.gemm_operands import operand_layouts
from tunecl.kernels.gemm.transpose import Transpose
from tunecl.problems import GemmProblem
from tunecl.runtime import Device


def with_layout(problem: GemmProblem, trans_a: bool, trans_b: bool) -> GemmProblem:
    """``problem`` with its operands stored as ``trans_a`` / ``trans_b`` say (same product)."""
    return dataclasses.replace(problem, trans_a=trans_a, trans_b=trans_b)


def workspace_words(problem: GemmProblem, inner: GemmProblem) -> tuple[int, int]:
    """Elements of the transposed copies of A and of B that running ``inner``'s layout on ``problem``
    needs (0 for an operand already stored that way)."""
    p = problem
    return (p.batch * p.m * p.k if p.trans_a != inner.trans_a else 0,
            p.batch * p.n * p.k if p.trans_b != inner.trans_b else 0)


def workspace_fits(problem: GemmProblem, inner: GemmProblem, max_alloc: int) -> bool:
    """Whether each transposed copy fits one device buffer of at most ``max_alloc`` bytes."""
    return 4 * max(workspace_words(problem, inner)) <= max_alloc


class PretransposedPlan:
    """``inner`` (a plan for ``problem`` stored in another layout) behind transposes of the operands
    whose layout differs. Same ``run`` as :class:`~tunecl.kernels.gemm.core.GemmPlan`; ``workspace_bytes``
    counts the copies and the inner plan's own workspace."""

    def __init__(self, problem: GemmProblem, inner: Any, config: Config, device: Device):
        self.problem = problem
        self.inner = inner
        self.algorithm = inner.algorithm
        self.precision = getattr(inner, "precision", "fp32")
        self.config = dict(config)
        self.device = device
        a_words, b_words = workspace_words(problem, inner.problem)
        self.workspace_bytes = 4 * (a_words + b_words) + inner.workspace_bytes
        self._transpose = Transpose(device)
        self._a_copy = device.alloc(4 * a_words) if a_words else None
        self._b_copy = device.alloc(4 * b_words) if b_words else None

    def run(self, a: cl.Buffer, b: cl.Buffer, c: cl.Buffer, *, alpha: float = 1.0, beta: float = 0.0,
            a_offset: int = 0, b_offset: int = 0, c_offset: int = 0,
            lda: int | None = None, ldb: int | None = None, ldc: int | None = None,
            stride_a: int | None = None, stride_b: int | None = None, stride_c: int | None = None,
            wait_for: list | None = None) -> list[cl.Event]:
        """As :meth:`GemmPlan.run`; returns the transposes' events, then the GEMM's. A broadcast operand
        (stride 0) is transposed once."""
        p = self.problem
        lda, stride_a, ldb, stride_b = operand_layouts(p, a, a_offset, lda, stride_a, b, b_offset, ldb, stride_b)
        events: list[cl.Event] = []
        if self._a_copy is not None:  # A stored rows x cols: (K x M) or (M x K); its copy the other way
            rows, cols = (p.k, p.m) if p.trans_a else (p.m, p.k)
            events.append(self._transpose.run(a, a_offset, lda, stride_a, rows, cols, p.batch if stride_a else 1,
                                              self._a_copy, wait_for=wait_for))
            a, a_offset, lda, stride_a = self._a_copy, 0, rows, p.m * p.k if stride_a else 0
        if self._b_copy is not None:  # B stored (N x K) or (K x N)
            rows, cols = (p.n, p.k) if p.trans_b else (p.k, p.n)
            events.append(self._transpose.run(b, b_offset, ldb, stride_b, rows, cols, p.batch if stride_b else 1,
                                              self._b_copy, wait_for=None if events else wait_for))
            b, b_offset, ldb, stride_b = self._b_copy, 0, rows, p.n * p.k if stride_b else 0
        return events + self.inner.run(a, b, c, alpha=alpha, beta=beta, a_offset=a_offset, b_offset=b_offset,
                                       c_offset=c_offset, lda=lda, ldb=ldb, ldc=ldc, stride_a=stride_a,
                                       stride_b=stride_b, stride_c=stride_c)
