"""The pointwise family: one ``pointwise.cl`` template, one C expression per op (``EXPRESSIONS``).

:class:`Pointwise` compiles the template once per op signature (op, dtypes, merged rank, index
type) with the expression passed as ``-DOP(a,b,c)=...`` and launches it over strided, broadcast
operands. It is not tunable; the backend uses it for every elementwise op, copies and fills.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyopencl as cl

from tunecl import profiling
from tunecl.kernels import launches

from tunecl.errors import Unsupported
from tunecl.kernels.base import read_source
from tunecl.kernels.strided import (CTYPES, FLOATING, INT32_MAX, Operand, StridedFamily,
                                    merge_dims, meta_dtype, pack_meta, pad_front, rank_bucket, relu_tag)
from tunecl.kernels.sizes import round_up
from tunecl.runtime import Device


class Expr(NamedTuple):
    """One op: ``nin`` inputs (a, b, c), ``nparams`` parameters (s0..), its C expression for
    floating compute, and for integer compute (``None``: the op only exists for floats). ``special``: the
    expression calls a function of ``special.cl``, compiled in front of ``pointwise.cl`` for its kernels only
    (the fused and multi-tensor kernels, which compile without it, refuse such ops)."""

    nin: int
    nparams: int
    code: str
    int_code: str | None
    special: bool = False


def _same(nin: int, nparams: int, code: str) -> Expr:
    return Expr(nin, nparams, code, code)


def _float(nin: int, nparams: int, code: str) -> Expr:
    return Expr(nin, nparams, code, None)


# Helpers to keep the table readable; each expands to an expression without whitespace (build
# options are split at whitespace). Ternaries mirror std::max/min so NaN propagates like torch.
_MAXIMUM = "((a>b||a!=a)?a:b)"
_MINIMUM = "((a<b||a!=a)?a:b)"
_CLAMP = "((a<s0?s0:a)>s1?s1:(a<s0?s0:a))"
_HSIG = "((6.0f<((a+3.0f)<0.0f?0.0f:(a+3.0f)))?6.0f:((a+3.0f)<0.0f?0.0f:(a+3.0f)))/6.0f"
_SIG_B = "(1.0f/(1.0f+exp(-b)))"
_SIG_C = "(1.0f/(1.0f+exp(-c)))"
_TANH_B = "tanh(0.79788456080286536f*(b+0.044715f*b*b*b))"

EXPRESSIONS: dict[str, Expr] = {
    # creation and copies
    "copy": _same(1, 0, "a"),
    "fill": _same(0, 1, "s0"),
    "arange": _same(0, 2, "s0+(TC)i*s1"),
    # linspace from both ends, as torch computes it (s0 start, s1 step, s2 half the count, s3 end)
    "linspace": _float(0, 4, "((TC)i<s2?s0+(TC)i*s1:s3-(TC)(COUNT-1-i)*s1)"),
    "eye": _same(0, 1, "(TC)((i/(IDX)s0)==(i%(IDX)s0))"),  # over an (n, m) output, s0 = m
    # arithmetic
    "add": _same(2, 1, "a+s0*b"),
    "add_relu": _float(2, 1, "((a+s0*b)<0?(TC)0:(a+s0*b))"),   # add's relu twin (see RELU_TWINS)
    "sub": _same(2, 1, "a-s0*b"),
    "mul": _same(2, 0, "a*b"),
    "div": _float(2, 0, "a/b"),
    # integer division rounds as torch's does (floor: towards -inf; remainder: the divisor's sign); a zero
    # divisor gives 0 (the backend refuses it before launching where it can; a divisor of -1 is spelled out,
    # as the lowest value divided by it overflows)
    "div_trunc": Expr(2, 0, "trunc(a/b)", "(b==0?(TC)0:(b==-1?-a:a/b))"),
    "div_floor": Expr(2, 0, "floor(a/b)", "(b==0?(TC)0:(b==-1?-a:a/b-(TC)((a%b!=0)&&((a<0)!=(b<0)))))"),
    "remainder": Expr(2, 0, "(a-floor(a/b)*b)", "((b==0||b==-1)?(TC)0:a%b+(((a%b!=0)&&((a%b<0)!=(b<0)))?b:(TC)0))"),
    "atan2": _float(2, 0, "atan2(a,b)"),
    "neg": _same(1, 0, "-a"),
    "abs": Expr(1, 0, "fabs(a)", "(a<0?-a:a)"),
    "sign": _same(1, 0, "(a!=a?a:(TC)((a>0)-(a<0)))"),
    "reciprocal": _float(1, 0, "1.0f/a"),
    "pow": _float(2, 0, "pow(a,b)"),
    "maximum": _same(2, 0, _MAXIMUM),
    "minimum": _same(2, 0, _MINIMUM),
    "clamp": _same(1, 2, _CLAMP),
    "clamp_min": _same(1, 1, "(a<s0?s0:a)"),
    "clamp_max": _same(1, 1, "(a>s0?s0:a)"),
    "clamp_tensor": _same(3, 0, "((X<c||X!=X)?X:c)".replace("X", _MAXIMUM)),
    "addcmul": _same(3, 1, "a+s0*b*c"),
    "addcdiv": _float(3, 1, "a+s0*b/c"),
    "lerp": _float(2, 1, "(s0<0.5f?a+s0*(b-a):b-(b-a)*(1.0f-s0))"),
    "lerp_tensor": _float(3, 0, "(c<0.5f?a+c*(b-a):b-(b-a)*(1.0f-c))"),
    "scale_mask": _float(2, 1, "a*b*s0"),  # dropout and its backward: x * mask * scale
    # math
    "exp": _float(1, 0, "exp(a)"),
    "exp2": _float(1, 0, "exp2(a)"),
    "log": _float(1, 0, "log(a)"),
    "log1p": _float(1, 0, "log1p(a)"),
    "expm1": _float(1, 0, "expm1(a)"),
    "sqrt": _float(1, 0, "sqrt(a)"),
    "rsqrt": _float(1, 0, "rsqrt(a)"),
    "sin": _float(1, 0, "sin(a)"),
    "cos": _float(1, 0, "cos(a)"),
    "erf": _float(1, 0, "erf(a)"),
    "erfc": _float(1, 0, "erfc(a)"),
    "tan": _float(1, 0, "tan(a)"),
    "asin": _float(1, 0, "asin(a)"),
    "acos": _float(1, 0, "acos(a)"),
    "atan": _float(1, 0, "atan(a)"),
    "sinh": _float(1, 0, "sinh(a)"),
    "cosh": _float(1, 0, "cosh(a)"),
    "asinh": _float(1, 0, "asinh(a)"),
    "acosh": _float(1, 0, "acosh(a)"),
    "atanh": _float(1, 0, "atanh(a)"),
    "log2": _float(1, 0, "log2(a)"),
    "log10": _float(1, 0, "log10(a)"),
    "lgamma": _float(1, 0, "lgamma(a)"),
    "erfinv": Expr(1, 0, "tcl_erfinv(a)", None, special=True),
    "digamma": Expr(1, 0, "tcl_digamma(a)", None, special=True),
    "trigamma": Expr(1, 0, "tcl_trigamma(a)", None, special=True),
    "frac": _float(1, 0, "(a-trunc(a))"),
    "fmod": Expr(2, 0, "fmod(a,b)", "((b==0||b==-1)?(TC)0:a%b)"),
    "hypot": _float(2, 0, "hypot(a,b)"),
    "copysign": _float(2, 0, "copysign(a,b)"),
    # log(exp(a) + exp(b)) and log2(2^a + 2^b) as torch's kernels compute them (equal infinities stay)
    "logaddexp": _float(2, 0, f"((isinf(a)&&a==b)?a:({_MAXIMUM}+log1p(exp(-fabs(a-b)))))"),
    "logaddexp2": _float(2, 0, f"((isinf(a)&&a==b)?a:({_MAXIMUM}+log1p(exp2(-fabs(a-b)))*1.4426950408889634f))"),
    # s0 for NaN, s1 for +inf, s2 for -inf
    "nan_to_num": _float(1, 3, "(a!=a?s0:(isinf(a)?(a>0?s1:s2):a))"),
    "floor": _same(1, 0, "floor(a)"),
    "ceil": _same(1, 0, "ceil(a)"),
    "trunc": _same(1, 0, "trunc(a)"),
    "round": _same(1, 0, "rint(a)"),  # rint rounds half to even, like torch.round
    # comparisons and selection (the output is bool or the selected dtype)
    "eq": _same(2, 0, "a==b"),
    "ne": _same(2, 0, "a!=b"),
    "lt": _same(2, 0, "a<b"),
    "le": _same(2, 0, "a<=b"),
    "gt": _same(2, 0, "a>b"),
    "ge": _same(2, 0, "a>=b"),
    "logical_not": _same(1, 0, "a==0"),
    "logical_and": _same(2, 0, "(a!=0)&&(b!=0)"),
    "logical_or": _same(2, 0, "(a!=0)||(b!=0)"),
    "logical_xor": _same(2, 0, "(a!=0)!=(b!=0)"),
    "bitwise_and": Expr(2, 0, "", "a&b"),
    "bitwise_or": Expr(2, 0, "", "a|b"),
    "bitwise_xor": Expr(2, 0, "", "a^b"),
    "isnan": _same(1, 0, "a!=a"),
    "isinf": _float(1, 0, "isinf(a)"),
    "isposinf": _float(1, 0, "(isinf(a)&&a>0)"),
    "isneginf": _float(1, 0, "(isinf(a)&&a<0)"),
    "isfinite": _float(1, 0, "isfinite(a)"),
    "bitwise_not": Expr(1, 0, "", "~a"),
    "where": _same(3, 0, "(a!=0?b:c)"),
    "masked_fill": _same(2, 1, "(b!=0?s0:a)"),
    "masked_fill_tensor": _same(3, 0, "(b!=0?c:a)"),
    # activations (forward: a = input; backward: a = grad_output, b = input or output)
    "relu": _same(1, 0, "(a<0?(TC)0:a)"),
    "hardtanh": _same(1, 2, _CLAMP),
    "hardtanh_backward": _float(2, 2, "((b<=s0||b>=s1)?0.0f:a)"),
    "threshold": _same(1, 2, "(a<=s0?s1:a)"),
    "threshold_backward": _same(2, 1, "(b<=s0?(TC)0:a)"),
    "sigmoid": _float(1, 0, "1.0f/(1.0f+exp(-a))"),
    "sigmoid_backward": _float(2, 0, "a*(1.0f-b)*b"),
    "tanh": _float(1, 0, "tanh(a)"),
    "tanh_backward": _float(2, 0, "a*(1.0f-b*b)"),
    "silu": _float(1, 0, "a/(1.0f+exp(-a))"),
    "silu_backward": _float(2, 0, f"a*{_SIG_B}*(1.0f+b*(1.0f-{_SIG_B}))"),
    "gelu": _float(1, 0, "0.5f*a*(1.0f+erf(a*0.70710678118654752f))"),
    "gelu_tanh": _float(1, 0, "0.5f*a*(1.0f+tanh(0.79788456080286536f*(a+0.044715f*a*a*a)))"),
    "gelu_backward": _float(2, 0, "a*(0.5f*(1.0f+erf(b*0.70710678118654752f))"
                                  "+b*0.39894228040143268f*exp(-0.5f*b*b))"),
    "gelu_tanh_backward": _float(2, 0, f"a*(0.5f*(1.0f+{_TANH_B})+0.5f*b*(1.0f-{_TANH_B}*{_TANH_B})"
                                       "*0.79788456080286536f*(1.0f+0.134145f*b*b))"),
    "hardswish": _float(1, 0, f"a*{_HSIG}"),
    "hardswish_backward": _float(2, 0, "(b<-3.0f?0.0f:(b<=3.0f?a*(b/3.0f+0.5f):a))"),
    "hardsigmoid": _float(1, 0, _HSIG),
    "hardsigmoid_backward": _float(2, 0, "((b>-3.0f&&b<3.0f)?a/6.0f:0.0f)"),
    "softplus": _float(1, 2, "(a*s0>s1?a:log1p(exp(a*s0))/s0)"),  # s0 beta, s1 threshold
    "softplus_backward": _float(2, 2, "(b*s0>s1?a:a*exp(b*s0)/(exp(b*s0)+1.0f))"),
    "elu": _float(1, 3, "(a>0?a*s1:(exp(a*s2)-1.0f)*s0*s1)"),  # s0 alpha, s1 scale, s2 input_scale
    "elu_backward": _float(2, 3, "(b>0?a*s1:a*s2*s0*s1*exp(b*s2))"),           # b = input
    "elu_backward_result": _float(2, 3, "(b>0?a*s1:a*s2*(b+s0*s1))"),          # b = output
    "squared_difference": _float(2, 0, "(a-b)*(a-b)"),
    "mse_backward": _float(3, 1, "s0*(a-b)*c"),  # (input, target, grad_output): s0 = 2 / N or 2
    "leaky_relu": _float(1, 1, "(a>0?a:a*s0)"),
    "hardshrink": _float(1, 1, "((a>=-s0&&a<=s0)?0.0f:a)"),
    "hardshrink_backward": _float(2, 1, "((b>=-s0&&b<=s0)?0.0f:a)"),
    "softshrink": _float(1, 1, "(a>s0?a-s0:(a<-s0?a+s0:0.0f))"),
    "softshrink_backward": _float(2, 1, "((b>=-s0&&b<=s0)?0.0f:a)"),
    "leaky_relu_backward": _float(2, 1, "(b>0?a:a*s0)"),
    "log_sigmoid": _float(1, 0, "((a<0.0f?a:0.0f)-log1p(exp(-fabs(a))))"),
    "log_sigmoid_backward": _float(2, 0, "a*((b<0.0f?1.0f:0.0f)-(b<0.0f?1.0f:-1.0f)*exp(-fabs(b))/(1.0f+exp(-fabs(b))))"),
    "mish": _float(1, 0, "a*tanh(log1p(exp(a)))"),
    "glu": _float(2, 0, f"a*{_SIG_B}"),                                   # a: the first half, b: the gate
    "glu_backward_gate": _float(3, 0, f"a*b*{_SIG_C}*(1.0f-{_SIG_C})"),   # a: grad, b: the first half, c: the gate
    "prelu": _float(2, 0, "(a>0.0f?a:b*a)"),                              # b: the weight
    "prelu_backward_input": _float(3, 0, "(b>0.0f?a:c*a)"),               # a: grad, b: input, c: weight
    "prelu_backward_weight": _float(2, 0, "(b>0.0f?0.0f:b*a)"),           # a: grad, b: input
    "logit": _float(1, 0, "log(a/(1.0f-a))"),
    # s0 eps, s1 1 - eps, clamped as torch's kernel does (an eps above 0.5 reverses the bounds)
    "logit_eps": _float(1, 2, "log(X/(1.0f-X))".replace("X", "(a<s0?s0:(a>s1?s1:a))")),
    "logit_backward": _float(2, 0, "((b<0.0f||b>1.0f)?NAN:a/(b*(1.0f-b)))"),
    "logit_backward_eps": _float(2, 2, "((b<s0||b>s1)?0.0f:a/(b*(1.0f-b)))"),
    "xlogy": _float(2, 0, "(b!=b?b:(a==0.0f?0.0f:a*log(b)))"),
    # losses (a = input, b = target; backward: c = grad_output, s1 the reduction's 1/N or 1), as torch's
    # CPU kernels compute them
    "smooth_l1": _float(2, 1, "(fabs(a-b)<s0?0.5f*(a-b)*(a-b)/s0:fabs(a-b)-0.5f*s0)"),          # s0 beta
    "smooth_l1_backward": _float(3, 2, "((a-b)<=-s0?-s1*c:((a-b)>=s0?s1*c:s1*(a-b)*c/s0))"),
    "huber": _float(2, 1, "(fabs(a-b)<s0?0.5f*(a-b)*(a-b):s0*(fabs(a-b)-0.5f*s0))"),            # s0 delta
    "huber_backward": _float(3, 2, "((a-b)<=-s0?-s1*s0*c:((a-b)>=s0?s1*s0*c:s1*(a-b)*c))"),
    "binary_cross_entropy": _float(2, 0, "((b-1.0f)*(log1p(-a)<-100.0f?-100.0f:log1p(-a))"
                                         "-b*(log(a)<-100.0f?-100.0f:log(a)))"),
    "binary_cross_entropy_backward": _float(3, 1, "c*(a-b)/((1.0f-a)*a<1e-12f?1e-12f:(1.0f-a)*a)*s0"),
    # mixed precision (torch.amp.GradScaler), as torch's CUDA kernels compute them
    "amp_found_inf": _float(2, 0, "(isfinite(b)?a:1.0f)"),  # a = found_inf, b = max |grad| (NaN/inf if any is)
    # a = scale, b = growth tracker, c = found_inf; s0 growth factor, s1 backoff factor, s2 growth interval
    "amp_scale": _float(3, 3, "(c!=0?a*s1:((b+1==s2&&isfinite(a*s0))?a*s0:a))"),
    "amp_growth_tracker": _float(2, 1, "(b!=0?0:(a+1==s0?0:a+1))"),  # a = tracker, b = found_inf; s0 interval
}

for _name, _expr in EXPRESSIONS.items():  # a whitespace would split the -DOP option
    assert not any(ch.isspace() for ch in _expr.code + (_expr.int_code or "")), _name

Input = Operand | float | int | bool


@functools.cache
def _special_source() -> str:
    return read_source(__package__, "special.cl")


def compute_type(out_dtype: str, inputs: Sequence[Input]) -> str:
    """The C type an op computes in: float if any operand is floating, else long/int."""
    if out_dtype in FLOATING:
        return "float"
    wide = out_dtype == "int64"
    for x in inputs:
        if isinstance(x, Operand):
            if x.dtype in FLOATING:
                return "float"
            wide = wide or x.dtype == "int64"
        elif isinstance(x, float):
            return "float"
    return "long" if wide else "int"


def _out_kind(dtype: str, tc: str) -> int:
    if dtype == "float16":
        return 1
    if dtype == "bool":
        return 2
    if dtype not in FLOATING and tc == "float":
        return 3
    return 0


VEC = 4  # elements per work-item of the float4 variant (dense float32 operands)
# ops whose launch waits, held, when they write a contiguous float32 output: an in-place relu of exactly that
# output right after runs inside them, as the twin expression (see relu_tag)
RELU_TWINS = {"add": "add_relu"}



def _dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether ``strides`` lay ``shape`` out contiguously (row-major, no gaps)."""
    step = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if stride != step:
            return False
        step *= size
    return True


class _Plan(NamedTuple):
    """What one op signature needs per launch: the kernel and the shape part of ``meta``."""

    kernel: cl.Kernel
    prefix: list[int]         # count, sizes, strides of every operand (scalars: zeros)
    extents: tuple[int, ...]  # per operand: the largest element offset it reaches past its own offset
    cast: type                # Python type of scalar arguments (float or int)
    global_size: tuple[int]
    local_size: tuple[int]
    wide: bool                # compiled with 64-bit indices
    meta: bytes               # the packed ``meta`` when every offset is 0 (the common case)
    scalar_args: tuple[int, ...]  # positions in the argument list of scalar inputs
    signature: tuple          # (op, shape, out, inputs) without buffers: rebuilds the plan 64-bit wide
    vec: bool                 # the float4 variant: every element offset must be a multiple of 4
    unaligned: list           # a vec plan's scalar twin, built the first time offsets need it
    relu_twin: list           # RELU_TWINS: [] when the launch may wait for a relu (built when one comes), else None
    bound: list               # [] until first launched at zero offsets, then [its _Bound, or None: cannot be]


_PACKERS = {np.dtype(np.float32): struct.Struct("=f").pack, np.dtype(np.int32): struct.Struct("=i").pack,
            np.dtype(np.int64): struct.Struct("=q").pack}


class _Bound(launches.Bound):
    """A plan's launch at offsets 0, pre-built: its buffers bound and its scalars packed per launch."""

    __slots__ = ("buffer_args", "cast", "packed", "packers", "param_args", "scalar_args", "twin")

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.buffer_args = self.positions
        self.twin: launches.Twin | None = None
        self.packed: dict[tuple, tuple] = {}   # scalar and parameter values -> their scalars()

    def scalars(self, args: Sequence, params: Sequence) -> tuple:
        """The flat (position, packed bytes, ...) tuple of a launch's scalar inputs and parameters, kept for
        the values it was packed for (an add's alpha of 1, a relu backward's threshold of 0): values that
        compare equal pack alike, but for the sign of a float zero (-0.0 == 0.0 == 0), so values with one
        are packed each time, never looked up."""
        scalar_args = self.scalar_args
        values = (*map(args.__getitem__, scalar_args), *params) if scalar_args else tuple(params)
        keep = 0 not in values or not any(isinstance(v, float) and v == 0 for v in values)
        packed = self.packed.get(values) if keep else None
        if packed is None:
            cast, packers, flat = self.cast, self.packers, []
            for i, value in zip(scalar_args + self.param_args, values):
                flat += (i, packers[i](cast(value)))
            packed = tuple(flat)
            if keep:
                if len(self.packed) >= 16:
                    self.packed.clear()
                self.packed[values] = packed
        return packed


class Pointwise(StridedFamily):
    """Launches ``EXPRESSIONS`` ops on one device; compiles each op signature once.

    The hot path is a dict lookup keyed by the op's signature (op, shape, dtypes, strides, scalar
    kinds): dim merging, compute type and ``meta`` layout are worked out once per signature. Callers
    that can key the signature more cheaply themselves keep the :meth:`prepare` result and call
    :meth:`launch` per op.
    """

    MAX_PLANS = 8192  # a safety valve for programs with ever-changing shapes

    source_file = "pointwise.cl"

    def __init__(self, device: Device):
        super().__init__(device)
        self._plans: dict[tuple, _Plan] = {}
        # The backend's per-call launch cache (tunecl.backend.ops.pointwise.run: its own signature key ->
        # (plan, input kinds)). It lives here, not in a module global, because its plans hold this
        # instance's kernels: a new family (another context, or the coverage dry run's stubbed one)
        # must never launch another instance's kernels.
        self.launches: dict[tuple, tuple[_Plan, tuple[str, ...]]] = {}

    def __call__(self, op: str, shape: Sequence[int], out: Operand, inputs: Sequence[Input] = (),
                 params: Sequence[float | int | bool] = ()) -> cl.Event | None:
        """Enqueue ``out = op(inputs, params)`` over ``shape`` (out's shape). Never waits.

        Args:
            op: a key of :data:`EXPRESSIONS`.
            shape: the iteration shape (a tuple); every operand's strides are given for it.
            out: the output operand (may alias an input element-for-element, as in-place ops do).
            inputs: operands or Python scalars (a scalar becomes a kernel argument).
            params: the op's parameters s0.. (alpha, clamp bounds, ...).

        Raises:
            Unsupported: a dtype or rank this family does not handle.
        """
        plan = self.prepare(op, shape, out, inputs)
        if plan is None:
            return None
        args = [out.buffer]
        offsets = [out.offset]
        for x in inputs:
            if isinstance(x, Operand):
                args.append(x.buffer)
                offsets.append(x.offset)
            else:
                args.append(x)
                offsets.append(0)
        return self.launch(plan, args, params, offsets)

    def prepare(self, op: str, shape: Sequence[int], out: Operand, inputs: Sequence[Input]) -> _Plan | None:
        """The plan of this op signature (only strides, dtypes and scalar kinds matter, not buffers or
        offsets); None when ``shape`` has no elements.

        Raises:
            Unsupported: a dtype or rank this family does not handle.
        """
        key = (op, shape, out.dtype, out.strides,
               *[(x.dtype, x.strides) if isinstance(x, Operand) else type(x) for x in inputs])
        plan = self._plans.get(key)
        if plan is None:
            if 0 in shape:
                return None
            plan = self._plan(key, op, shape, out, inputs, wide=False)
        return plan

    @property
    def queue(self) -> cl.CommandQueue:
        return self.device.queue

    def launch(self, plan: _Plan, args: list, params: Sequence[float | int | bool],
               offsets: Sequence[int], defer: bool = False, held: tuple[object, object] | None = None
               ) -> cl.Event | None:
        """Enqueue ``plan`` on ``args`` (out's buffer, then each input's buffer or scalar) with element
        ``offsets`` (out's, then each input's: 0 for scalars). ``args`` is extended in place. With
        ``defer``, by way of :meth:`Device.defer` (no event: the launch may be enqueued later, in
        order, with the next use of the queue); with ``held`` too, a (tag, payload) pair, by way of
        :meth:`Device.hold` under that tag, so that the next op may do its work instead (:meth:`Device.take_held`).

        A deferred launch at offsets 0 (the common case) goes by the plan's pre-built launch
        (:class:`_Bound`): a kernel copy with its packed meta set once, only the buffers and scalars bound
        per launch, enqueued without pyopencl's argument conversion; while a graph capture or a
        KernelProfile holds pyopencl's launch function it goes through the kernel itself."""
        if defer and not any(offsets):
            bound = plan.bound[0] if plan.bound else self._bound(plan)
            if bound is not None and bound.kernel is plan.kernel and not profiling.swap_lock.locked():
                try:
                    scalars = bound.scalars(args, params) if bound.packers else ()
                except (OverflowError, struct.error):   # out of the kernel type's range: pyopencl's conversion
                    pass
                else:
                    binding = []
                    for i in bound.buffer_args:
                        binding += (i, args[i])
                    entry = (tuple(binding), scalars)
                    if held is not None:
                        self.device.hold(bound, plan.global_size, plan.local_size, entry, held[0], None, held[1])
                    elif plan.relu_twin is not None:   # an in-place relu of the output may follow: wait for it
                        self.device.hold(bound, plan.global_size, plan.local_size, entry,
                                         relu_tag(args[0], 0, plan.prefix[0]), bound.twin)
                    else:
                        self.device.defer(bound, plan.global_size, plan.local_size, entry)
                    return None
        plan, meta = self.at_offsets(plan, offsets)
        cast = plan.cast
        for i in plan.scalar_args:
            args[i] = cast(args[i])
        for p in params:
            args.append(cast(p))
        args.append(meta)
        if defer:
            if held is not None:
                self.device.hold(plan.kernel, plan.global_size, plan.local_size, args, held[0], None, held[1])
            elif plan.relu_twin is not None:   # an in-place relu of the output may follow: wait for it
                self.device.hold(plan.kernel, plan.global_size, plan.local_size, args,
                                 relu_tag(args[0], offsets[0], plan.prefix[0]), lambda op: self._relu_twin(plan, op))
            else:
                self.device.defer(plan.kernel, plan.global_size, plan.local_size, args)
            return None
        return plan.kernel(self.device.queue, plan.global_size, plan.local_size, *args)

    def _bound(self, plan: _Plan) -> _Bound | None:
        """``plan``'s pre-built launch at offsets 0, made once (None for a kernel that cannot be copied)."""
        nin = len(plan.signature[3])
        count = 1 + nin + EXPRESSIONS[plan.signature[0]].nparams
        scalar_args = set(plan.scalar_args) | set(range(1 + nin, count))
        # placeholders where each launch binds its own (the preset never keeps a caller's buffer)
        args = [plan.cast(0) if i in scalar_args else None for i in range(count)] + [plan.meta]
        preset = launches.preset_kernel(plan.kernel, args)
        bound = None
        if preset is not None:
            dtypes = plan.kernel._tunecl_dtypes
            bound = _Bound(plan.kernel, plan.global_size, plan.local_size, args,
                           tuple(i for i in range(count) if i not in scalar_args), preset)
            bound.scalar_args = tuple(plan.scalar_args)
            bound.param_args = tuple(range(1 + nin, count))
            bound.packers = tuple(_PACKERS[np.dtype(dtypes[i])] if i in scalar_args else None
                                  for i in range(count)) if scalar_args else ()
            bound.cast = plan.cast
            if plan.relu_twin is not None:
                bound.twin = launches.Twin(bound, lambda op: self._relu_twin(plan, op))
        plan.bound[:] = [bound]
        return bound

    def _relu_twin(self, plan: _Plan, op: str = "relu") -> cl.Kernel | None:
        """The kernel of ``plan``'s launch with its op's relu twin (same arguments, grid and meta); None for
        an in-place op other than relu (``op``), which it has no twin for."""
        if op != "relu":
            return None
        if not plan.relu_twin:
            op, *rest = plan.signature
            plan.relu_twin.append(self._plan(None, RELU_TWINS[op], *rest, wide=plan.wide, vec=plan.vec).kernel)
        return plan.relu_twin[0]

    def at_offsets(self, plan: _Plan, offsets: Sequence[int]) -> tuple[_Plan, bytes]:
        """The plan that serves ``plan``'s signature at element ``offsets`` and its packed ``meta``: the
        scalar twin of a float4 plan when an offset is not a multiple of 4, the 64-bit plan when an
        offset reaches past 32-bit indices."""
        if not any(offsets):   # offsets of 0 need no range check: a 32-bit plan's extents all fit
            return plan, plan.meta
        if plan.vec and any(o % VEC for o in offsets):   # float4 accesses would be misaligned
            if not plan.unaligned:
                plan.unaligned.append(self._plan(None, *plan.signature, wide=plan.wide, vec=False))
            plan = plan.unaligned[0]
        if not plan.wide and any(o + e > INT32_MAX for o, e in zip(offsets, plan.extents)):
            plan = self._plan(None, *plan.signature, wide=True, vec=plan.vec)
        return plan, pack_meta(plan.prefix + list(offsets), "long" if plan.wide else "int")

    def _plan(self, key: tuple | None, op: str, shape: Sequence[int], out: Operand, inputs: Sequence[Input],
              wide: bool, vec: bool = True) -> _Plan:
        expr = EXPRESSIONS[op]
        if len(inputs) != expr.nin:
            raise ValueError(f"{op} takes {expr.nin} inputs, got {len(inputs)}")
        count = math.prod(shape)
        tc = compute_type(out.dtype, inputs)
        tensors = [out] + [x for x in inputs if isinstance(x, Operand)]
        for t in tensors:
            if t.dtype not in CTYPES:
                raise Unsupported(f"dtype {t.dtype}")
        if tc != "float" and expr.int_code is None:
            raise Unsupported(f"{op} on integer tensors")
        if tc == "float" and not expr.code:
            raise Unsupported(f"{op} on floating tensors")
        mshape, mstrides = merge_dims(shape, [t.strides for t in tensors])
        rank = rank_bucket(len(mshape))
        extents = tuple(sum((n - 1) * s for n, s in zip(mshape, st)) for st in mstrides)
        wide = wide or count > INT32_MAX or any(e > INT32_MAX for e in extents)
        idx = "long" if wide else "int"
        dtypes = tuple(x.dtype if isinstance(x, Operand) else None for x in inputs)
        vec = vec and tc == "float" and all(t.dtype == "float32" for t in tensors) and \
            len(mshape) == 1 and all(st == [1] for st in mstrides)
        kernel_key = (op, tc, out.dtype, dtypes, rank, idx, vec)
        kernel = self.cache.get(kernel_key)
        if kernel is None:
            kernel = self._build(kernel_key, expr, 1 + rank + (expr.nin + 1) * (rank + 1))
        prefix = [count] + pad_front(mshape, rank, 1)
        operand_extents = []
        strides_iter, extents_iter = iter(mstrides), iter(extents)
        for x in [out, *inputs]:  # scalar inputs keep zero strides so the layout stays fixed
            if isinstance(x, Operand):
                prefix += pad_front(next(strides_iter), rank, 0)
                operand_extents.append(next(extents_iter))
            else:
                prefix += [0] * rank
                operand_extents.append(0)
        scalar_args = tuple(i + 1 for i, x in enumerate(inputs) if not isinstance(x, Operand))
        signature = (op, shape, out._replace(buffer=None, offset=0),
                     [x._replace(buffer=None, offset=0) if isinstance(x, Operand) else type(x)() for x in inputs])
        plan = _Plan(kernel, prefix, tuple(operand_extents), float if tc == "float" else int,
                     (round_up(-(-count // VEC) if vec else count, self.local),), (self.local,), wide,
                     pack_meta(prefix + [0] * len(operand_extents), idx), scalar_args, signature, vec, [],
                     [] if op in RELU_TWINS and tc == "float" and out.dtype == "float32" and _dense(mshape, mstrides[0])
                     else None, [])
        if key is not None:
            if len(self._plans) >= self.MAX_PLANS:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def _build(self, key: tuple, expr: Expr, meta_len: int) -> cl.Kernel:
        _, tc, out_dtype, signature, rank, idx, vec = key
        code = expr.code if tc == "float" else expr.int_code
        options = [f"-DOP(a,b,c)={code}", f"-DNIN={expr.nin}", f"-DNS={expr.nparams}",
                   f"-DNDIM={rank}", f"-DIDX={idx}", f"-DTC={tc}", f"-DTOUT={CTYPES[out_dtype]}",
                   f"-DOUT_KIND={_out_kind(out_dtype, tc)}"] + (["-DVEC"] if vec else [])
        np_tc = np.float32 if tc == "float" else (np.int64 if tc == "long" else np.int32)
        dtypes: list = [None]
        for k, dtype in enumerate(signature):
            if dtype is None:
                options.append(f"-DIN{k}_SCALAR")
                dtypes.append(np_tc)
            else:
                options += [f"-DTIN{k}={CTYPES[dtype]}", f"-DIN{k}_KIND={1 if dtype == 'float16' else 0}"]
                dtypes.append(None)
        dtypes += [np_tc] * expr.nparams
        dtypes.append(meta_dtype(meta_len, idx))
        return self.cache.build(key, options, "pointwise", dtypes, prefix=_special_source() if expr.special else "")
