"""The convolution harness: torch on the CPU in float64 as the independent reference.

The plan contract is the one of ``tunecl/kernels/conv/conv_common.py``::

    plan.run(a, b, out, *, a_offset=0, b_offset=0, out_offset=0, bias=None, bias_offset=0, beta=0.0)

    fwd: a = x, b = w, out = y;  bwd_data: a = dy, b = w, out = dx;  bwd_weight: a = x, b = dy, out = dw

Two cases are checked: ``beta=0`` without bias (the timed case; ``out`` starts as NaN and must not be
read) and ``beta=0.5`` with a bias for the forward direction. The tolerance is
:func:`~tunecl.search.harness.reduction_tolerance` of the reduction length times the exact magnitude
of the terms (the same convolution of ``|a|`` and ``|b|``), plus ``|beta * out0|`` and ``|bias|``;
families whose transforms amplify rounding (Winograd) get a constant factor from
:data:`ERROR_FACTOR`. A plan whose ``precision`` is ``"tf32"`` (its inputs are rounded to TF32) also gets
:func:`~tunecl.search.harness.tf32_tolerance` of the exact 2-norm of each output's terms, the square
root of the same convolution of ``a**2`` and ``b**2``, as the GEMM harness does with its bound of it, and of
the exact result (what truncating the inputs to TF32 biases); for a Winograd family the terms and sums are
those of its transformed values (:func:`winograd_spread`, :func:`winograd_value`).

float16 problems (``dtype="float16"``): ``a``, ``b`` and ``out`` are half buffers (the inputs drawn as
above and rounded to half; the reference uses those half values), the bias is an fp32 buffer of
half-representable values (what the backend passes for a half bias), the NaN guards are half ones, and
the tolerance adds the one rounding of the output to half
(:func:`~tunecl.search.harness.half_output_tolerance`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from tunecl.kernels.base import Plan
from tunecl.kernels.conv.conv_common import reduction_length
from tunecl.kernels.conv.conv_winograd import MATRICES
from tunecl.precision import FP32, TF32
from tunecl.problems import ConvProblem
from tunecl.runtime import Device
from tunecl.search.harness import (
    GUARD_ELEMENTS,
    compare_guarded,
    guarded,
    half_output_tolerance,
    modified_input,
    reduction_tolerance,
    tf32_tolerance,
)

# algorithm name -> how much more rounding error than a plain sum it may have (a TF32 variant
# ``NAME_mma_tf32`` or ``NAME_wgmma_tf32`` has NAME's)
ERROR_FACTOR = {"conv_winograd": 16.0}
TF32_SUFFIXES = ("_mma_tf32", "_wgmma_tf32")
# Winograd families -> m of F(m×m,3×3): their TF32 rounding is of transformed values (winograd_spread)
WINOGRAD = {"conv_winograd": 2, "conv_winograd_f4": 4}


def fp32_twin(algorithm: str) -> str:
    """The fp32 family a TF32 variant computes with tensor cores (``conv_winograd_f4_wgmma_tf32`` ->
    ``conv_winograd_f4``); any other name as it is."""
    for suffix in TF32_SUFFIXES:
        if algorithm.endswith(suffix):
            return algorithm.removesuffix(suffix)
    return algorithm


def operand_shapes(p: ConvProblem) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Shapes of (a, b, out) in the plan contract."""
    return {"fwd": (p.input_shape, p.weight_shape, p.output_shape),
            "bwd_data": (p.output_shape, p.weight_shape, p.input_shape),
            "bwd_weight": (p.input_shape, p.output_shape, p.weight_shape)}[p.direction]


def reference(p: ConvProblem, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The direction's result in float64: torch ``conv2d``, and its autograd for the backward ones."""
    import torch

    kw = {"stride": p.stride, "padding": p.padding, "dilation": p.dilation, "groups": p.groups}
    ta, tb = torch.from_numpy(a).double(), torch.from_numpy(b).double()
    if p.direction == "fwd":
        tbias = None if bias is None else torch.from_numpy(bias).double()
        return torch.nn.functional.conv2d(ta, tb, tbias, **kw).numpy()
    if p.direction == "bwd_data":
        x = torch.zeros(p.input_shape, dtype=torch.float64, requires_grad=True)
        torch.nn.functional.conv2d(x, tb, **kw).backward(ta)
        return x.grad.numpy()
    w = torch.zeros(p.weight_shape, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.conv2d(ta, w, **kw).backward(tb)
    return w.grad.numpy()


def winograd(p: ConvProblem, a: np.ndarray, b: np.ndarray, m: int, squared: bool = False,
             rounding: Callable[[np.ndarray], np.ndarray] | None = None, absolute: bool = False) -> np.ndarray:
    """The fwd or bwd_data result of Winograd F(m×m,3×3) in float64, computed as the kernels do
    (bwd_data: the forward convolution of dy with the filters transposed per group and rotated 180°, padding
    2 − pad): ``out = Aᵀ·Z·A`` with ``Z[ξ] = Σ_ci U[ξ]·V[ξ]``, ``U = G·f·Gᵀ``, ``V = Bᵀ·d·B`` per tile.

    ``squared``: the same with ``A``, ``U`` and ``V`` replaced by their element-wise squares, i.e. for every
    output ``Σ_ξ A_ξ² Σ_ci U[ξ]² V[ξ]²``, the squared 2-norm of the terms that rounding U and V to TF32
    perturbs (:func:`winograd_spread`). ``rounding`` (a model of the TF32 kernels) is applied to U and V
    before their products. ``absolute``: ``Σ_ξ |A_ξ| |Z[ξ]|`` instead, what a bias of every ``Z[ξ]`` in
    proportion to itself (TF32 truncation) can move an output by (:func:`winograd_value`)."""
    g_mat, bt, at = (np.asarray(x, np.float64) for x in MATRICES[m])
    g = p.groups
    if p.direction == "fwd":
        d, f, pad, ho, wo = a, b, p.padding, p.p, p.q
    elif p.direction == "bwd_data":
        k, cg = b.shape[:2]
        f = b.reshape(g, k // g, cg, 3, 3).transpose(0, 2, 1, 3, 4).reshape(g * cg, k // g, 3, 3)[:, :, ::-1, ::-1]
        d, pad, ho, wo = a, (2 - p.padding[0], 2 - p.padding[1]), p.h, p.w
    else:
        raise ValueError("Winograd computes fwd and bwd_data only")
    n, ci, hi, wi = d.shape
    co, cig = f.shape[:2]
    cog, alpha = co // g, m + 2
    th, tw = -(-ho // m), -(-wo // m)
    padded = np.zeros((n, ci, th * m + 2, tw * m + 2))
    rows, cols = min(hi, th * m + 2 - pad[0]), min(wi, tw * m + 2 - pad[1])   # (what the tiles reach)
    r0, c0 = max(0, -pad[0]), max(0, -pad[1])                                  # (negative padding crops)
    padded[:, :, max(0, pad[0]):max(0, pad[0]) + rows - r0, max(0, pad[1]):max(0, pad[1]) + cols - c0] = \
        d[:, :, r0:rows, c0:cols]
    tiles = np.lib.stride_tricks.sliding_window_view(padded, (alpha, alpha), axis=(2, 3))[:, :, ::m, ::m]
    v = bt @ tiles @ bt.T                                  # (n, ci, th, tw, alpha, alpha)
    u = g_mat @ f @ g_mat.T                                # (co, cig, alpha, alpha)
    if rounding is not None:
        u, v = rounding(u), rounding(v)
    if squared:
        u, v, at = u * u, v * v, at * at
    if absolute:
        at = np.abs(at)
    # Z per group and transform position: (g * alpha², cog, cig) @ (g * alpha², cig, n * th * tw)
    u = u.reshape(g, cog, cig, alpha * alpha).transpose(0, 3, 1, 2).reshape(g * alpha * alpha, cog, cig)
    v = v.reshape(n, g, cig, th * tw, alpha * alpha).transpose(1, 4, 2, 0, 3).reshape(g * alpha * alpha, cig, -1)
    z = (u @ v).reshape(g, alpha, alpha, cog, n, th, tw)
    if absolute:
        z = np.abs(z)
    out = np.einsum("px,gxyonij,qy->ngoipjq", at, z, at, optimize=True)
    return out.reshape(n, co, th * m, tw * m)[:, :, :ho, :wo]


def winograd_spread(p: ConvProblem, a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """The TF32 spread of Winograd F(m×m,3×3): per output, ``sqrt(Σ_ξ A_ξ² Σ_ci U[ξ]² V[ξ]²)``.

    Why: rounding U and V to TF32 moves ``Z[ξ]`` by ``Σ_ci U V (d_U + d_V)``, whose standard deviation is at
    most ``0.82 u_tf32 sqrt(Σ_ci U² V²)`` (as for a GEMM, :func:`~tunecl.search.harness.tf32_tolerance`);
    the output transform sums the ξ with coefficients ``A_ξ``, independent errors adding in squares. The
    transforms themselves run in fp32 (the fp32 part of the tolerance). For the harness's inputs this is
    ~2x (F(2×2)) and ~10x (F(4×4)) the direct convolution's spread: the TF32 error of Winograd is that much
    larger than that of a direct TF32 convolution (``tests/unit/test_winograd_tf32.py``)."""
    return np.sqrt(winograd(p, a, b, m, squared=True))


def winograd_value(p: ConvProblem, a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """The TF32 value of Winograd F(m×m,3×3) (the ``value`` of
    :func:`~tunecl.search.harness.tf32_tolerance`): per output, ``Σ_ξ |A_ξ| |Z[ξ]|``.

    Why: truncating U and V to TF32 biases every ``Z[ξ] = Σ_ci U V`` by up to ``4 u_tf32 |Z[ξ]|`` in its own
    direction; the output transform sums the ξ with coefficients ``A_ξ``, and the biases of different ξ need
    not cancel."""
    return winograd(p, a, b, m, absolute=True)


class ConvHarness:
    """Inputs, torch reference and guarded buffers for one convolution problem."""

    kind: ClassVar[str] = "conv"
    BETA: ClassVar[float] = 0.5

    def __init__(self, problem: ConvProblem, device: Device, seed: int = 0, guard: int = GUARD_ELEMENTS):
        self.problem = problem
        self.device = device
        self.seed = seed
        self.guard = guard
        self._data: dict[str, Any] | None = None

    def _prepare(self) -> dict[str, Any]:
        if self._data is None:
            p = self.problem
            rng = np.random.default_rng(self.seed)
            a_shape, b_shape, out_shape = operand_shapes(p)
            dtype = np.dtype(p.dtype)   # of a, b and out (float32 or float16); the bias stays float32
            a = rng.uniform(-1, 1, a_shape).astype(dtype)
            b = rng.uniform(-1, 1, b_shape).astype(dtype)
            out0 = rng.uniform(-1, 1, out_shape).astype(dtype)
            bias = (rng.uniform(-1, 1, p.k).astype(dtype).astype(np.float32) if p.direction == "fwd"
                    else None)
            plain = reference(p, a, b, None)
            magnitude = reference(p, np.abs(a), np.abs(b), None)
            g = self.guard
            self._data = {
                "a": guarded(a, g, dtype), "b": guarded(b, g, dtype), "out0": guarded(out0, g, dtype),
                "out_nan": guarded(np.full_like(out0, np.nan), g, dtype),
                "bias": None if bias is None else guarded(bias, g), "plain": plain,
                "magnitude": magnitude, "out0_f64": out0.astype(np.float64),
                "bias_f64": None if bias is None else bias.astype(np.float64)}
        return self._data

    def _spread(self, algorithm: str = "") -> np.ndarray:
        """``sqrt(sum of squared terms)`` of every output (for TF32 plans; computed on first use): of the
        convolution, or of the transformed values a Winograd family multiplies (:func:`winograd_spread`)."""
        data = self._prepare()
        m = WINOGRAD.get(fp32_twin(algorithm))
        key = "spread" if m is None else f"spread_winograd{m}"
        if key not in data:
            a, b = self._inputs64()
            data[key] = (np.sqrt(reference(self.problem, a * a, b * b, None)) if m is None
                         else winograd_spread(self.problem, a, b, m))
        return data[key]

    def _tf32_value(self, algorithm: str = "") -> np.ndarray:
        """The exact sum of the terms whose TF32 truncation biases each output (for TF32 plans): the
        convolution's result itself, or for a Winograd family :func:`winograd_value` (computed on first use)."""
        data = self._prepare()
        m = WINOGRAD.get(fp32_twin(algorithm))
        if m is None:
            return data["plain"]
        key = f"value_winograd{m}"
        if key not in data:
            data[key] = winograd_value(self.problem, *self._inputs64(), m)
        return data[key]

    def _inputs64(self) -> tuple[np.ndarray, np.ndarray]:
        """``a`` and ``b`` as the device sees them (their guarded buffers without the guards), in float64."""
        data, g, shapes = self._prepare(), self.guard, operand_shapes(self.problem)
        return tuple(data[name][g:g + int(np.prod(shape))].reshape(shape).astype(np.float64)
                     for name, shape in (("a", shapes[0]), ("b", shapes[1])))

    def bind(self, plan: Plan) -> ConvBinding:
        data = self._prepare()
        up = self.device.upload
        bias = None if data["bias"] is None else up(data["bias"])
        return ConvBinding(self, plan, up(data["a"]), up(data["b"]), up(data["out_nan"]), bias)

    def compare(self, out: np.ndarray, beta: float, with_bias: bool, algorithm: str,
                precision: str = FP32) -> str | None:
        """Check a downloaded guarded output buffer for one case of a plan computing at ``precision``
        (``"fp32"`` or ``"tf32"``; float16 problems: a half buffer, one more rounding); ``None`` when
        correct."""
        data = self._prepare()
        expected, magnitude = data["plain"], data["magnitude"]
        if beta:
            expected = expected + beta * data["out0_f64"]
            magnitude = magnitude + abs(beta) * np.abs(data["out0_f64"])
        if with_bias:
            shape = (1, -1, 1, 1)
            expected = expected + data["bias_f64"].reshape(shape)
            magnitude = magnitude + np.abs(data["bias_f64"]).reshape(shape)
        factor = ERROR_FACTOR.get(fp32_twin(algorithm), 1.0)
        tolerance = factor * reduction_tolerance(reduction_length(self.problem)) * magnitude
        case = f"beta={beta:g}" + (", bias" if with_bias else "")
        if precision == TF32:
            tolerance = tolerance + tf32_tolerance(self._spread(algorithm), self._tf32_value(algorithm))
            case += ", tf32"
        elif precision != FP32:
            raise ValueError(f"no convolution tolerance for precision {precision!r}")
        if self.problem.dtype == "float16":
            tolerance = half_output_tolerance(expected, tolerance)
            case += ", float16"
        return compare_guarded(out, self.guard, expected, tolerance, case)


class ConvBinding:
    """A convolution plan on its own guarded buffers."""

    def __init__(self, harness: ConvHarness, plan: Plan, a: Any, b: Any, out: Any, bias: Any | None):
        self.harness = harness
        self.plan = plan
        self.a, self.b, self.out, self.bias = a, b, out, bias

    def _run(self, beta: float, with_bias: bool) -> list[Any]:
        g = self.harness.guard
        bias = self.bias if with_bias else None
        return self.plan.run(self.a, self.b, self.out, a_offset=g, b_offset=g, out_offset=g,
                             bias=bias, bias_offset=g if bias is not None else 0, beta=beta)

    def launch(self) -> list[Any]:
        return self._run(0.0, False)

    def check(self) -> str | None:
        h = self.harness
        data = h._prepare()
        device = h.device
        for beta, with_bias in ((0.0, False), (h.BETA, self.bias is not None)):
            device.copyin(self.out, data["out0"] if beta else data["out_nan"])
            self._run(beta, with_bias)
            device.synchronize()
            out = device.download(self.out, data["out0"].shape, data["out0"].dtype)
            message = h.compare(out, beta, with_bias, getattr(self.plan, "algorithm", ""),
                                getattr(self.plan, "precision", FP32))
            if message:
                return message
        return modified_input(device, ((name, buffer, data.get(name)) for name, buffer in
                                       (("a", self.a), ("b", self.b), ("bias", self.bias))))

    def release(self) -> None:
        for buffer in (self.a, self.b, self.out, self.bias):
            if buffer is not None:
                buffer.release()
