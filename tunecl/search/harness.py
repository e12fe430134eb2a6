"""Verification harnesses: fresh inputs, an independent reference, guarded buffers, a tolerant compare.

One :class:`Harness` per problem kind. It knows how to make seeded random inputs, compute the reference
on the CPU (numpy float64 for GEMM), and :meth:`~Harness.bind` a plan to *fresh* device buffers. The
returned :class:`Binding` launches the plan the way it is timed and checks it the way it is verified.
Evaluation (``evaluate.py``) only talks to these two protocols, so a new problem kind (convolution,
attention: torch CPU references, their own ``run`` signatures) plugs in by adding one class to
:data:`~tunecl.search.harness_registry.HARNESSES`. This module holds the protocols, the GEMM harness and
the guard and tolerance helpers that every harness uses.

Guard regions: every buffer holds its matrices at an element offset, between two guard regions filled
with a NaN bit pattern. After a run the output's guards must be bit-for-bit unchanged (an out-of-bounds
*write*) and the inputs must be unchanged (a write into an input); a kernel that *reads* outside its
matrices and lets the value reach the result turns it into NaN, which fails the compare.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Protocol

import numpy as np

from tunecl.kernels.base import Plan
from tunecl.precision import FP32, TF32, UNIT_ROUNDOFF
from tunecl.problems import GemmProblem
from tunecl.runtime import Device

# A quiet NaN with a recognizable payload: any write over it shows up in a bitwise compare.
GUARD_BITS = np.uint32(0x7FC0BAD5)
HALF_GUARD_BITS = np.uint16(0x7E5D)  # the same for float16 buffers
# buffer dtype -> (the unsigned integer type of its bits, its guard pattern)
_BITS = {np.dtype(np.float32): (np.uint32, GUARD_BITS), np.dtype(np.float16): (np.uint16, HALF_GUARD_BITS)}
GUARD_ELEMENTS = 64  # 256 bytes: keeps the matrices aligned for float4 loads and 128-byte transactions
EPS32 = UNIT_ROUNDOFF[FP32]  # unit roundoff of float32
HALF_UNIT_ROUNDOFF = 2.0**-11  # of float16 (10 explicit mantissa bits, to nearest)
HALF_SUBNORMAL_HALF_SPACING = 2.0**-25  # the largest rounding error of a float16 subnormal result
TF32_ROUNDING_FACTOR = 8.0  # see tf32_tolerance
TF32_TRUNCATION_FACTOR = 4.0  # see tf32_tolerance


class Binding(Protocol):
    """A plan bound to its own fresh device buffers."""

    def launch(self) -> list[Any]:
        """Enqueue the timed computation once (no wait); return its events (first and last are timed)."""
        ...

    def check(self) -> str | None:
        """Run the verification launches; ``None`` when correct, else what is wrong, in one line.

        Raises:
            pyopencl.Error: enqueueing or running the plan failed.
        """
        ...

    def release(self) -> None:
        """Free the device buffers now instead of waiting for the garbage collector."""
        ...


class Harness(Protocol):
    """Inputs, reference and buffers for one problem on one device (the reference is computed once)."""

    kind: ClassVar[str]

    def bind(self, plan: Plan) -> Binding: ...


def reduction_tolerance(k: int) -> float:
    """Relative tolerance of an fp32 sum of ``k`` products (a GEMM with inner dimension ``k``, a
    convolution with reduction length ``k``): ``u * (8 * sqrt(k) + 8)``.

    It multiplies the magnitude of the terms, ``|alpha| * sum_k |a_ik| |b_kj| + |beta| * |c_ij|`` for
    GEMM (see :class:`GemmHarness`). Why this formula: the worst-case bound for a sum of ``k`` products in any
    order is ``gamma_k = k*u / (1 - k*u)`` (Higham, *Accuracy and Stability of Numerical Algorithms*,
    §3.1), but it is attained only when every rounding error has the same sign; rounding errors of
    independent data behave like random variables with zero mean, so the error grows like
    ``sqrt(k) * u`` (Higham §3.6). Tiled kernels sum in blocks, which only shortens the chains. The
    factor 8 covers the tail of the maximum over millions of output elements and FMA/``mad``
    contraction; the ``+ 8`` covers the few roundings of the products and of ``alpha*acc + beta*c``
    when ``k`` is small. A real bug (a missing, repeated or misplaced term) moves an element by about
    ``|a b| ~ 0.25`` with inputs uniform in [-1, 1], far above ``8 * sqrt(4096) * u * 1400 ~ 0.04``.
    """
    return EPS32 * (8.0 * math.sqrt(k) + 8.0)


def tf32_tolerance(spread: np.ndarray | float, value: np.ndarray | float = 0.0) -> np.ndarray | float:
    """What reducing the inputs of a product to TF32 adds to the tolerance of an output:
    ``8 * u_tf32 * spread + 4 * u_tf32 * |value|`` with ``u_tf32 = 2**-11`` (TF32 keeps 10 explicit
    mantissa bits).

    ``spread`` bounds ``sqrt(sum_k (a_ik b_kj)**2)``, the 2-norm of the output's terms (for GEMM
    ``min(max_k |a_ik| * ||b_j||_2, ||a_i||_2 * max_k |b_kj|)``, which holds for any data and is within
    ~1.7x of the 2-norm for the harness's uniform inputs); ``value`` is the exact sum of the terms,
    ``sum_k a_ik b_kj`` (0 where the caller knows the inputs are rounded to nearest).

    Why: reducing ``a`` and ``b`` to TF32 multiplies the term ``a b`` by ``(1 + d_a)(1 + d_b)``; products
    of two TF32 values are exact in fp32, so the output moves by ``sum_k a_k b_k (d_ak + d_bk)``.

    - Rounded to nearest (``cvt.rna``, the mma kernels): ``|d| <= u_tf32`` with zero mean and a
      standard deviation of at most ``u_tf32 / sqrt(3)``, so the sum has a standard deviation of at most
      ``0.82 u_tf32 * spread`` (Higham §3.6, as for fp32): the factor 8 is ~10 standard deviations, far
      beyond the largest of millions of outputs (~5.5).
    - Truncated (the wgmma kernels hand the fp32 bits to the tensor cores, which ignore the 13 low
      mantissa bits): ``d`` lies in ``(-2 u_tf32, 0]``, so besides a spread of the same size the errors have
      a mean ``mu`` of the same sign for every term, ``|mu| <= 2 u_tf32`` per input (about ``0.7 u_tf32``
      for generic data). Their sum is ``2 mu * sum_k a_k b_k``: an error proportional to the output
      itself, which no ``sqrt(k)`` law bounds. The second term, ``4 u_tf32 |value|``, is that bias at its
      worst. (Found on the H200: a 1x1 convolution of 512 channels came out 43.506 where 43.539 was
      expected, 0.033 off, just over the spread term alone; the emulation reproduces that exact value.)

    The first term alone is also a rigorous bound for ``k <= 16`` rounded and ``k <= 4`` truncated: the
    worst case ``c sum_k |a_k b_k|`` (``c = 2 u_tf32 + u_tf32**2`` rounded, ``4 u_tf32 + 4 u_tf32**2``
    truncated) is at most ``c sqrt(k) * spread``. What it still catches: an A or B element
    paired with the wrong partner (a transposed or misplaced fragment) changes an output by about
    ``|a b|`` per wrong term — for inputs uniform in [-1, 1] at K = 4096 the whole output (~21) against
    a TF32 tolerance of ~0.14 + 0.04; a term lost or counted twice moves it by ~0.25; with K = 64 the
    tolerance is ~0.018 + 0.005. The fp32 accumulation in the tensor cores keeps the fp32 tolerance on
    top.
    """
    u = UNIT_ROUNDOFF[TF32]
    return TF32_ROUNDING_FACTOR * u * spread + TF32_TRUNCATION_FACTOR * u * np.abs(value)


def half_output_tolerance(expected: np.ndarray, tolerance: np.ndarray) -> np.ndarray:
    """The tolerance of a result computed within ``tolerance`` of ``expected`` and then rounded once to
    float16, to nearest even: ``tolerance + u_h * (|expected| + tolerance) + 2**-25``.

    Why: rounding ``y`` to half moves it by at most ``u_h * |y|`` (``u_h = 2**-11``) in the normal
    range and by at most half the subnormal spacing, ``2**-25``, below it; ``|y| <= |expected| +
    tolerance``. Half inputs need no term of their own: they are the exact inputs of the reference
    (the data is half already), and a product of two halves is exact in fp32, so the fp32 ``tolerance``
    (:func:`reduction_tolerance`) covers the accumulation. What it still catches: a misplaced or lost
    term moves an output by about ``|a b|`` (~0.25 for inputs uniform in [-1, 1]) against a half
    rounding of at most ``2**-11 * |C|`` (~0.01 at K = 4096).
    """
    return tolerance + HALF_UNIT_ROUNDOFF * (np.abs(expected) + tolerance) + HALF_SUBNORMAL_HALF_SPACING


def gemm_spread(op_a: np.ndarray, op_b: np.ndarray) -> np.ndarray:
    """``min(max_k |a_ik| * ||b_j||_2, ||a_i||_2 * max_k |b_kj|)`` per output of batched
    ``op_a @ op_b`` (batch x M x K times batch x K x N): an upper bound of ``sqrt(sum_k (a_ik b_kj)**2)``
    in O(MK + KN + MN)."""
    return _spread_from(*_row_stats(op_a, 2), *_row_stats(op_b, 1))


def _row_stats(op: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(max |x|, 2-norm) along the reduction ``axis`` of a batched operand."""
    return np.abs(op).max(axis=axis, initial=0.0), np.linalg.norm(op, axis=axis)


def _spread_from(a_max: np.ndarray, a_norm: np.ndarray, b_max: np.ndarray, b_norm: np.ndarray) -> np.ndarray:
    return np.minimum(a_max[:, :, None] * b_norm[:, None, :], a_norm[:, :, None] * b_max[:, None, :])


def compare_guarded(out: np.ndarray, guard: int, expected: np.ndarray, tolerance: np.ndarray,
                    case: str) -> str | None:
    """Check a downloaded guarded output buffer: guards untouched, every element within tolerance.

    Args:
        out: the whole buffer (guard, values, guard) as float32 (or float16).
        guard: guard elements on each side.
        expected: the float64 reference, shaped as the output.
        tolerance: per-element absolute tolerance, same shape.
        case: what was run, for the message (``alpha=1, beta=0``).

    Returns:
        None when correct, else one line saying what is wrong and where.
    """
    unsigned, pattern = _BITS[out.dtype]
    bits = out.view(unsigned)
    for name, region in (("before", bits[:guard]), ("after", bits[out.size - guard:])):
        touched = int(np.count_nonzero(region != pattern))
        if touched:
            return f"wrote {touched} element(s) into the guard region {name} the output ({case})"
    got = out[guard:out.size - guard].reshape(expected.shape).astype(np.float64)
    error = np.abs(got - expected)
    bad = ~(error <= tolerance)  # NaN compares false, so NaN/Inf outputs count as wrong
    count = int(np.count_nonzero(bad))
    if not count:
        return None
    worst = np.unravel_index(int(np.argmax(np.where(bad, np.nan_to_num(error, nan=np.inf), -1.0))),
                             bad.shape)
    return (f"{count} of {bad.size} elements wrong ({case}); worst at index {tuple(int(i) for i in worst)}: "
            f"got {got[worst]:.6g}, expected {expected[worst]:.6g}, tolerance {tolerance[worst]:.2g}")


def modified_input(device: Device, inputs: Any) -> str | None:
    """The message for the first of ``inputs`` ((name, buffer, contents before the run) triples; a None
    buffer is skipped) whose buffer, guards included, no longer holds its contents bit for bit; else None."""
    for name, buffer, before in inputs:
        if buffer is None:
            continue
        after = device.download(buffer, before.shape, before.dtype)
        if not np.array_equal(after.view(np.uint8), before.view(np.uint8)):
            return f"the plan modified its input {name} (or the guards around it)"
    return None


def guarded(values: np.ndarray, guard: int, dtype: Any = np.float32) -> np.ndarray:
    """``values`` flattened between two guard regions of ``guard`` NaN elements (float32 or float16)."""
    out = np.empty(values.size + 2 * guard, dtype=dtype)
    unsigned, pattern = _BITS[out.dtype]
    out.view(unsigned)[:guard] = pattern
    out.view(unsigned)[guard + values.size:] = pattern
    out[guard:guard + values.size] = values.ravel()
    return out


class GemmHarness:
    """Verification of GEMM plans (``C = alpha * op(A) @ op(B) + beta * C``) against numpy float64.

    Inputs are uniform in [-1, 1] from ``numpy.random.default_rng(seed)``; the reference is computed in
    float64 from the very float32 inputs the device sees, so the only differences are the device's
    rounding errors. Two cases are checked on fresh output contents: ``alpha=1, beta=0`` (the timed case;
    C holds NaN, which must not be read) and ``alpha=-0.75, beta=0.5`` (the epilogue).

    The per-element tolerance is ``reduction_tolerance(k) * (|alpha| * bound_ij + |beta| * |c_ij|)`` where
    ``bound_ij = ||row i of op(A)||_2 * ||column j of op(B)||_2`` is the Cauchy-Schwarz upper bound of
    ``sum_k |a_ik| |b_kj|``: rigorous, within ~4/3 of the exact sum for such inputs, and computed in
    O(MK + KN + MN) instead of a second float64 matrix product. A plan whose ``precision`` is
    ``"tf32"`` is checked with :func:`tf32_tolerance` of :func:`gemm_spread` and the product added (its
    inputs are rounded or truncated to TF32); plans without one are strict fp32.

    float16 problems (``dtype="float16"``): A, B and C are half buffers (the inputs drawn as above and
    rounded to half; the reference uses those half values), and the tolerance adds the one rounding of
    the output to half (:func:`half_output_tolerance`).
    """

    kind: ClassVar[str] = "gemm"
    CASES: ClassVar[tuple[tuple[float, float], ...]] = ((1.0, 0.0), (-0.75, 0.5))

    def __init__(self, problem: GemmProblem, device: Device, seed: int = 0, guard: int = GUARD_ELEMENTS):
        self.problem = problem
        self.device = device
        self.seed = seed
        self.guard = guard
        self._data: dict[str, np.ndarray] | None = None

    def _prepare(self) -> dict[str, np.ndarray]:
        """Inputs (guarded, float32) and the float64 reference, made on first use and then kept."""
        if self._data is None:
            p = self.problem
            rng = np.random.default_rng(self.seed)
            dtype = np.dtype(p.dtype)
            a_shape = (p.batch, p.k, p.m) if p.trans_a else (p.batch, p.m, p.k)
            b_shape = (p.batch, p.n, p.k) if p.trans_b else (p.batch, p.k, p.n)
            a = rng.uniform(-1.0, 1.0, a_shape).astype(dtype)
            b = rng.uniform(-1.0, 1.0, b_shape).astype(dtype)
            c = rng.uniform(-1.0, 1.0, (p.batch, p.m, p.n)).astype(dtype)
            op_a = a.astype(np.float64)
            op_b = b.astype(np.float64)
            if p.trans_a:
                op_a = op_a.transpose(0, 2, 1)
            if p.trans_b:
                op_b = op_b.transpose(0, 2, 1)
            product = np.matmul(op_a, op_b)
            bound = (np.linalg.norm(op_a, axis=2)[:, :, None] * np.linalg.norm(op_b, axis=1)[:, None, :])
            g = self.guard
            self._data = {"a": guarded(a, g, dtype), "b": guarded(b, g, dtype), "c": guarded(c, g, dtype),
                          "c_nan": guarded(np.full_like(c, np.nan), g, dtype),
                          "c0": c.astype(np.float64), "product": product, "bound": bound,
                          "row_stats": (*_row_stats(op_a, 2), *_row_stats(op_b, 1))}
        return self._data

    def _spread(self) -> np.ndarray:
        """:func:`gemm_spread` of the inputs (for TF32 plans; computed on first use, then kept)."""
        data = self._prepare()
        if "spread" not in data:
            data["spread"] = _spread_from(*data["row_stats"])
        return data["spread"]

    def bind(self, plan: Plan) -> GemmBinding:
        data = self._prepare()
        device = self.device
        return GemmBinding(self, plan, device.upload(data["a"]), device.upload(data["b"]),
                           device.upload(data["c"]))

    def compare(self, out: np.ndarray, alpha: float, beta: float, precision: str = FP32) -> str | None:
        """Check a downloaded guarded C buffer for one (alpha, beta) case of a plan computing at
        ``precision`` (``"fp32"`` or ``"tf32"``); ``None`` when correct."""
        data = self._prepare()
        p = self.problem
        expected = alpha * data["product"] + beta * data["c0"]
        tol = reduction_tolerance(p.k) * (abs(alpha) * data["bound"] + abs(beta) * np.abs(data["c0"]))
        case = f"alpha={alpha:g}, beta={beta:g}"
        if precision == TF32:
            tol = tol + abs(alpha) * tf32_tolerance(self._spread(), data["product"])
            case += ", tf32"
        elif precision != FP32:
            raise ValueError(f"no GEMM tolerance for precision {precision!r}")
        if p.dtype == "float16":
            tol = half_output_tolerance(expected, tol)
            case += ", float16"
        return compare_guarded(out, self.guard, expected, tol, case)


class GemmBinding:
    """A GEMM plan on its own guarded buffers (see :class:`GemmHarness`)."""

    def __init__(self, harness: GemmHarness, plan: Plan, a: Any, b: Any, c: Any):
        self.harness = harness
        self.plan = plan
        self.a, self.b, self.c = a, b, c

    def _run(self, alpha: float, beta: float) -> list[Any]:
        g = self.harness.guard
        return self.plan.run(self.a, self.b, self.c, alpha=alpha, beta=beta,
                             a_offset=g, b_offset=g, c_offset=g)

    def launch(self) -> list[Any]:
        return self._run(1.0, 0.0)

    def check(self) -> str | None:
        h = self.harness
        data = h._prepare()
        device = h.device
        precision = getattr(self.plan, "precision", FP32)
        for alpha, beta in h.CASES:
            # fresh C (and guards) for every case; NaN when beta == 0: C must then not be read at all
            # (the backend hands in uninitialized memory, and 0 * NaN is NaN)
            device.copyin(self.c, data["c"] if beta else data["c_nan"])
            events = self._run(alpha, beta)
            if events:
                events[-1].wait()
            device.synchronize()
            message = h.compare(device.download(self.c, data["c"].shape, data["c"].dtype), alpha, beta,
                                precision)
            if message:
                return message
        return modified_input(device, (("A", self.a, data["a"]), ("B", self.b, data["b"])))

    def release(self) -> None:
        for buffer in (self.a, self.b, self.c):
            buffer.release()
