"""The convolution harness: torch on the CPU in float64 as the independent reference.

The plan contract is the one of ``tunecl/kernels/conv_common.py``::

    plan.run(a, b, out, *, a_offset=0, b_offset=0, out_offset=0, bias=None, bias_offset=0, beta=0.0)

    fwd: a = x, b = w, out = y;  bwd_data: a = dy, b = w, out = dx;  bwd_weight: a = x, b = dy, out = dw

Two cases are checked: ``beta=0`` without bias (the timed case; ``out`` starts as NaN and must not be
read) and ``beta=0.5`` with a bias for the forward direction. The tolerance is
:func:`~tunecl.search.harness.reduction_tolerance` of the reduction length times the exact magnitude
of the terms (the same convolution of ``|a|`` and ``|b|``), plus ``|beta * out0|`` and ``|bias|``;
families whose transforms amplify rounding (Winograd) get a constant factor from
:data:`ERROR_FACTOR`. A plan whose ``precision`` is ``"tf32"`` (its inputs are rounded to TF32) also gets
:func:`~tunecl.search.harness.tf32_tolerance` of the exact 2-norm of each output's terms, the square
root of the same convolution of ``a**2`` and ``b**2``, as the GEMM harness does with its bound of it.

float16 problems (``dtype="float16"``): ``a``, ``b`` and ``out`` are half buffers (the inputs drawn as
above and rounded to half; the reference uses those half values), the bias is an fp32 buffer of
half-representable values (what the backend passes for a half bias), the NaN guards are half ones, and
the tolerance adds the one rounding of the output to half
(:func:`~tunecl.search.harness.half_output_tolerance`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from tunecl.kernels.base import Plan
from tunecl.kernels.conv_common import reduction_length
from tunecl.precision import FP32, TF32
from tunecl.problems import ConvProblem
from tunecl.runtime import Device
from tunecl.search.harness import (
    GUARD_ELEMENTS,
    compare_guarded,
    guarded,
    half_output_tolerance,
    reduction_tolerance,
    tf32_tolerance,
)

# algorithm name -> how much more rounding error than a plain sum it may have
ERROR_FACTOR = {"conv_winograd": 16.0}


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

    def _spread(self) -> np.ndarray:
        """``sqrt(sum of squared terms)`` of every output (for TF32 plans; computed on first use)."""
        data = self._prepare()
        if "spread" not in data:
            g, shapes = self.guard, operand_shapes(self.problem)
            a, b = (data[name][g:g + int(np.prod(shape))].reshape(shape).astype(np.float64)
                    for name, shape in (("a", shapes[0]), ("b", shapes[1])))
            data["spread"] = np.sqrt(reference(self.problem, a * a, b * b, None))
        return data["spread"]

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
        factor = ERROR_FACTOR.get(algorithm, 1.0)
        tolerance = factor * reduction_tolerance(reduction_length(self.problem)) * magnitude
        case = f"beta={beta:g}" + (", bias" if with_bias else "")
        if precision == TF32:
            tolerance = tolerance + tf32_tolerance(self._spread())
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
        for name, key, buffer in (("a", "a", self.a), ("b", "b", self.b), ("bias", "bias", self.bias)):
            if buffer is None:
                continue
            before = data[key]
            after = device.download(buffer, before.shape, before.dtype)
            if not np.array_equal(after.view(np.uint8), before.view(np.uint8)):   # bit for bit
                return f"the plan modified its input {name} (or the guards around it)"
        return None

    def release(self) -> None:
        for buffer in (self.a, self.b, self.out, self.bias):
            if buffer is not None:
                buffer.release()
