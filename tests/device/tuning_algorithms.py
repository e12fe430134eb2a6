"""Test-only GEMM algorithms for the tuner tests: a correct naive one, a wrong one, a broken one.

``gemm_algorithms()`` is what end-to-end tests tune: the registered GEMM family when it exists, else
the naive stand-in (so the tuner can be developed and tested before the family lands).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyopencl as cl

from tunecl.kernels import algorithms
from tunecl.kernels.base import Constraint, Space
from tunecl.problems import GemmProblem
from tunecl.runtime import Device

NAIVE_SOURCE = r"""
// One work-item per element of C; the full plan contract (transposes, ld, strides, offsets, batch).
#ifndef BROKEN
  #define BROKEN 0   // 1: fail to compile (tests that compile errors do not stop a run)
#endif
#if BROKEN
  #error deliberately broken configuration
#endif
__kernel void naive_gemm(const int M, const int N, const int K, const int ta, const int tb,
                         const float alpha, const float beta,
                         __global const float *agm, const int a_off, const int lda, const int sa,
                         __global const float *bgm, const int b_off, const int ldb, const int sb,
                         __global float *cgm, const int c_off, const int ldc, const int sc) {
  const int j = get_global_id(0), i = get_global_id(1), z = get_global_id(2);
  if (i >= M || j >= N) return;
  agm += a_off + z * sa; bgm += b_off + z * sb; cgm += c_off + z * sc;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) {
    const float av = ta ? agm[k * lda + i] : agm[i * lda + k];
    const float bv = tb ? bgm[j * ldb + k] : bgm[k * ldb + j];
    acc = fma(av, bv, acc);
  }
  float r = alpha * acc;
  if (beta != 0.0f) r += beta * cgm[i * ldc + j];
  cgm[i * ldc + j] = r;
}
"""

_SCALARS = [np.int32] * 5 + [np.float32] * 2 + [None, np.int32, np.int32, np.int32] * 3


@dataclasses.dataclass
class NaivePlan:
    algorithm: str
    config: dict[str, int]
    problem: GemmProblem
    device: Device
    kernel: cl.Kernel
    workspace_bytes: int = 0

    def run(self, a, b, c, *, alpha=1.0, beta=0.0, a_offset=0, b_offset=0, c_offset=0, lda=None, ldb=None,
            ldc=None, stride_a=None, stride_b=None, stride_c=None, wait_for=None):
        p = self.problem
        lda = lda or (p.m if p.trans_a else p.k)
        ldb = ldb or (p.k if p.trans_b else p.n)
        ldc = ldc or p.n
        stride_a = stride_a or p.m * p.k
        stride_b = stride_b or p.k * p.n
        stride_c = stride_c or p.m * p.n
        wx, wy = self.config["WX"], self.config["WY"]
        size = (-(-p.n // wx) * wx, -(-p.m // wy) * wy, p.batch)
        return [self.device.launch(
            self.kernel, size, (wx, wy, 1), p.m, p.n, p.k, int(p.trans_a), int(p.trans_b), alpha, beta,
            a, a_offset, lda, stride_a, b, b_offset, ldb, stride_b, c, c_offset, ldc, stride_c,
            wait_for=wait_for)]


class NaiveGemm:
    """A correct, slow GEMM whose only tunables are the work-group sides (16 valid configs)."""

    name = "test_naive_gemm"
    version = 1
    kind = "gemm"

    def applies(self, problem, device) -> bool:
        return isinstance(problem, GemmProblem) and problem.dtype == "float32"

    def space(self, problem, device) -> Space:
        return Space({"WX": (1, 2, 4, 8, 16), "WY": (1, 2, 4, 8, 16)},
                     [Constraint("group_size<=64", lambda c: c["WX"] * c["WY"] <= 64)])

    def default(self, problem, device) -> dict[str, int]:
        return {"WX": 4, "WY": 4}

    def _build(self, problem, device, config, broken: int = 0) -> NaivePlan:
        program = device.build(NAIVE_SOURCE, [f"-DBROKEN={broken}"])
        return NaivePlan(self.name, dict(config), problem, device,
                         device.kernel(program, "naive_gemm", _SCALARS))

    def build(self, problem, device, config) -> NaivePlan:
        return self._build(problem, device, config)


@dataclasses.dataclass
class ZeroFillPlan:
    """Wrong on purpose, and faster than anything correct: fills C with zeros instead of computing."""

    algorithm: str
    config: dict[str, int]
    problem: GemmProblem
    device: Device
    workspace_bytes: int = 0

    def run(self, a, b, c, *, c_offset=0, wait_for=None, **_ignored):
        p = self.problem
        nbytes = p.batch * p.m * p.n * 4
        return [cl.enqueue_fill_buffer(self.device.queue, c, np.float32(0), c_offset * 4, nbytes,
                                       wait_for=wait_for)]


class WrongGemm:
    """A test-only algorithm that wraps a real one but never computes the product."""

    version = 1
    kind = "gemm"

    def __init__(self, base) -> None:
        self.base = base
        self.name = f"test_wrong_{base.name}"

    def applies(self, problem, device) -> bool:
        return self.base.applies(problem, device)

    def space(self, problem, device) -> Space:
        return Space({"FAKE": (1, 2)})

    def default(self, problem, device) -> dict[str, int]:
        return {"FAKE": 1}

    def build(self, problem, device, config) -> ZeroFillPlan:
        return ZeroFillPlan(self.name, dict(config), problem, device)


class SometimesBrokenGemm(NaiveGemm):
    """The naive GEMM with a ``BROKEN`` parameter: ``BROKEN=1`` fails to compile."""

    name = "test_broken_gemm"

    def space(self, problem, device) -> Space:
        return Space({"WX": (4, 8), "WY": (4,), "BROKEN": (0, 1)})

    def default(self, problem, device) -> dict[str, int]:
        return {"WX": 4, "WY": 4, "BROKEN": 0}

    def build(self, problem, device, config) -> NaivePlan:
        return self._build(problem, device, {k: v for k, v in config.items()}, broken=config["BROKEN"])


def gemm_algorithms() -> list:
    """The registered GEMM family if it is there, else the naive stand-in."""
    return list(algorithms("gemm")) or [NaiveGemm()]
