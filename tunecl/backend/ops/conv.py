"""Convolution: the two ``*_overrideable`` ops torch routes PrivateUse1 convolutions through.

Each call becomes a :class:`~tunecl.problems.ConvProblem` and runs the cached conv plan of
:mod:`tunecl.backend.plans` (NCHW contiguous fp32; strided inputs are made contiguous on the device
first). A float16 convolution runs, direction by direction, a float16 plan where a registered
algorithm computes the float16 problem on the device (``conv_implicit_gemm_mma_f16`` on tensor cores,
where the probe granted ``mma_f16``: half operands read as they are, fp32 accumulation and bias, one
rounding of the result); otherwise its operands are converted to float32 scratch and the results
rounded back, so it runs the tuned float32 plan of the same shape (the same numerics, see
:mod:`tunecl.backend.half`). A transposed float16 convolution with a bias keeps the converted route for
its output (the bias is added after a ``bwd_data`` plan, in float32):

- forward: ``y = conv(x, w) + bias`` by the ``fwd`` plan (bias fused into the plan's run);
  a Winograd plan may run from the weight transformed by an earlier call
  (:mod:`tunecl.backend.weight_cache`, ``TUNECL_WINOGRAD_CACHE``), as may the input gradient;
- backward: ``grad_input`` by the ``bwd_data`` plan, ``grad_weight`` by the ``bwd_weight`` plan and
  ``grad_bias`` by the backend's sum reduction over (N, H, W) of the output gradient, each only
  when ``output_mask`` asks for it.

A transposed convolution runs the plans of the regular convolution it is made of
(:meth:`~tunecl.problems.ConvProblem.transposed`), so it shares their tuning: its output is the
``bwd_data`` plan's (the bias added by a pointwise kernel), its input gradient the ``fwd`` plan's and
its weight gradient the ``bwd_weight`` plan's, with the roles of input and output gradient swapped.

A float32 call whose operands are contiguous runs a pre-built call of its signature (see "pre-built
calls" below): the first call of a signature records its plans' launches, later ones allocate the
outputs, bind the buffers and enqueue them, with the results of the route above bit for bit.

3-D convolutions, transposed or not, run as sums of 2-d convolutions over the kernel's depth taps, by the
2-d route above (:mod:`tunecl.backend.ops.conv3d`). Dtypes other than fp32/fp16 and transposed
convolutions whose ``output_padding`` is not below the stride keep an explicit CPU route that is counted and
governed as a fallback (``TUNECL_FALLBACK=error`` raises). A zero-size batch produces empty (or, for gradients of
parameters, zero) results without launching a plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from tunecl.backend import copies, counters, fallback, half, memory, plans, state, weight_cache
from tunecl.backend.memory import buffer_of
from tunecl.kernels import launches
from tunecl.backend.operands import operand
from tunecl.backend.ops import conv3d
from tunecl.backend.ops.reduction import reduce
from tunecl.errors import Unsupported
from tunecl.problems import ConvProblem

aten = torch.ops.aten
FORWARD = "aten::convolution_overrideable"
BACKWARD = "aten::convolution_backward_overrideable"


def _pair(values: Sequence[int]) -> tuple[int, int]:
    values = list(values)
    if len(values) == 1:
        return values[0], values[0]
    if len(values) != 2:
        raise Unsupported(f"{len(values)}-d convolution parameters")
    return values[0], values[1]


# (input shape, weight shape, stride, padding, dilation, transposed, output_padding, groups) -> the
# call's problems by direction: building and validating a ConvProblem is ~10 µs, and nets repeat shapes
_PROBLEMS: dict[tuple, dict[str, ConvProblem]] = {}
MAX_CACHED_PROBLEMS = 4096


def _problems(input: torch.Tensor, weight: torch.Tensor, stride: Sequence[int], padding: Sequence[int],
              dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int,
              *others: torch.Tensor | None) -> dict[str, ConvProblem]:
    """The regular forward problem of a call with batch max(N, 1) (for a transposed convolution the one
    it is made of, see :meth:`ConvProblem.transposed`) as ``"fwd"``, and its ``"bwd_data"`` and
    ``"bwd_weight"``; Unsupported for what only the CPU runs."""
    if input.dim() != 4 or weight.dim() != 4:
        raise Unsupported(f"{input.dim() - 2}-d convolution (the device runs 2-d and 3-d ones)")
    half.check(input, weight, *others)
    key = (input.shape, weight.shape, tuple(stride), tuple(padding), tuple(dilation), bool(transposed),
           tuple(output_padding), groups)
    found = _PROBLEMS.get(key)
    if found is None:
        problem = _problem(input, weight, stride, padding, dilation, transposed, output_padding, groups)
        found = {"fwd": problem, "bwd_data": problem.with_direction("bwd_data"),
                 "bwd_weight": problem.with_direction("bwd_weight")}
        if len(_PROBLEMS) < MAX_CACHED_PROBLEMS:
            _PROBLEMS[key] = found
    return found


def _problem(input: torch.Tensor, weight: torch.Tensor, stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int) -> ConvProblem:
    n, c, h, w = input.shape
    k, _, r, s = weight.shape
    try:
        if transposed:
            if k != c:  # torch's CPU kernel says what is wrong
                raise ValueError(f"weight of {k} input channels for an input of {c}")
            return ConvProblem.transposed(max(n, 1), c, h, w, weight.shape[1] * groups, r, s, _pair(stride),
                                          _pair(padding), _pair(output_padding), _pair(dilation), groups)
        if any(output_padding):
            raise Unsupported("output_padding")
        return ConvProblem(max(n, 1), c, h, w, k, r, s, _pair(stride), _pair(padding), _pair(dilation), groups)
    except ValueError as why:  # empty channels and the like: torch's CPU kernel says what is wrong
        raise Unsupported(str(why)) from None


def _zeros(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    out = memory.empty_contiguous(shape, dtype)
    if out.numel():
        state.get().pointwise("fill", out.shape, operand(out), (), (0,))
    return out


def _add_channel_bias(y: torch.Tensor, bias: torch.Tensor) -> None:
    """``y[n, c, h, w] += bias[c]`` on a contiguous float32 ``y`` (the transposed convolution's bias: its
    plan is a ``bwd_data`` one, which fuses none)."""
    along_channels = operand(bias)._replace(strides=(0, bias.stride(0), 0, 0))
    state.get().pointwise("add", tuple(y.shape), operand(y), (operand(y), along_channels), (1,))


def _half_plan(problem: ConvProblem, *tensors: torch.Tensor | None) -> Any | None:
    """The plan of ``problem`` as a float16 convolution where every given tensor is float16 and a
    registered algorithm computes that problem on this device (:func:`plans.served_plan`), else None
    (the caller converts)."""
    if any(t is not None and t.dtype != torch.float16 for t in tensors):
        return None
    return plans.served_plan(dataclasses.replace(problem, dtype="float16"))


def _run_half(plan: Any, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
              bias: torch.Tensor | None = None) -> None:
    """``plan.run`` of a float16 plan: ``a``, ``b`` half (made contiguous on the device where they are
    not), ``out`` a contiguous half tensor, ``bias`` passed as float32 (exact)."""
    a, b, bias = copies.contiguous_on_device(a), copies.contiguous_on_device(b), half.to_float32(bias)
    plan.run(buffer_of(a), buffer_of(b), buffer_of(out), a_offset=a.storage_offset(), b_offset=b.storage_offset(),
             bias=None if bias is None else buffer_of(bias), bias_offset=0 if bias is None else bias.storage_offset())


def _forward(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
             padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
             groups: int) -> torch.Tensor:
    problems = _problems(input, weight, stride, padding, dilation, transposed, output_padding, groups, bias)
    problem = problems["fwd"]
    n = input.shape[0]
    # a transposed convolution is the bwd_data of the regular one: its output is that one's input
    shape = (n, problem.c, problem.h, problem.w) if transposed else (n, problem.k, problem.p, problem.q)
    direction = problems["bwd_data"] if transposed else problem
    if n and not (transposed and bias is not None):
        plan16 = _half_plan(direction, input, weight, bias)
        if plan16 is not None:
            y = memory.empty_contiguous(shape, torch.float16)
            _run_half(plan16, input, weight, y, bias)
            return y
    y = memory.empty_contiguous(shape, torch.float32)
    if n == 0:
        return half.cast(y, input.dtype)
    plan = state.get().plan(direction)
    x, bias = half.to_float32(input), half.to_float32(bias)
    if transposed:
        weight_cache.run_conv(plan, x, weight, y)
        if bias is not None:
            _add_channel_bias(y, bias)
    else:
        weight_cache.run_conv(plan, x, weight, y, bias=bias)
    return half.cast(y, input.dtype)


def _backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, stride: Sequence[int],
              padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
              groups: int, output_mask: Sequence[bool]) -> tuple[torch.Tensor | None, ...]:
    problems = _problems(input, weight, stride, padding, dilation, transposed, output_padding, groups, grad_output)
    problem = problems["fwd"]
    want_input, want_weight, want_bias = (bool(m) for m in output_mask)
    channels = grad_output.shape[1]
    if input.shape[0] == 0:
        return (memory.empty_contiguous(input.shape, input.dtype) if want_input else None,
                _zeros(weight.shape, weight.dtype) if want_weight else None,
                _zeros((channels,), grad_output.dtype) if want_bias else None)
    # Both input gradients read (grad_output, weight): the regular conv's bwd_data, or for a transposed
    # one the regular fwd. The weight gradient is the regular bwd_weight of (its input, its output
    # gradient): (input, grad_output), or (grad_output, input) for a transposed convolution.
    # Every plan is found first: an Unsupported problem then takes the CPU route before anything runs.
    # float16: each direction runs a float16 plan where one computes it, else the converted route.
    data_problem = problem if transposed else problems["bwd_data"]
    weight_problem = problems["bwd_weight"]
    data16 = _half_plan(data_problem, grad_output, input, weight) if want_input else None
    weight16 = _half_plan(weight_problem, grad_output, input, weight) if want_weight else None
    plan_of = state.get().plan
    data_plan = plan_of(data_problem) if want_input and data16 is None else None
    weight_plan = plan_of(weight_problem) if want_weight and weight16 is None else None
    converted = grad_output.dtype == torch.float32 or data_plan is not None or weight_plan is not None
    dy = half.to_float32(grad_output) if converted else None
    grad_input = grad_weight = grad_bias = None
    if data16 is not None:
        grad_input = memory.empty_contiguous(input.shape, torch.float16)
        _run_half(data16, grad_output, weight, grad_input)
    if weight16 is not None:
        a, b = (grad_output, input) if transposed else (input, grad_output)
        grad_weight = memory.empty_contiguous(weight.shape, torch.float16)
        _run_half(weight16, a, b, grad_weight)
    if data_plan is not None:
        grad_input = memory.empty_contiguous(input.shape, torch.float32)
        weight_cache.run_conv(data_plan, dy, weight, grad_input, backward=True)
        grad_input = half.cast(grad_input, input.dtype)
    if weight_plan is not None:
        x = half.to_float32(input)
        a, b = (dy, x) if transposed else (x, dy)
        grad_weight = memory.empty_contiguous(weight.shape, torch.float32)
        weight_plan.run(buffer_of(a), buffer_of(b), buffer_of(grad_weight), a_offset=a.storage_offset(),
                        b_offset=b.storage_offset())
        grad_weight = half.cast(grad_weight, weight.dtype)
    if want_bias:  # summed in float32 (from the float32 dy where there is one), rounded once
        grad_bias = reduce("sum", grad_output if dy is None else dy, [0, 2, 3], False,
                           memory.empty_contiguous((channels,), grad_output.dtype))
    return grad_input, grad_weight, grad_bias


# -- pre-built calls ---------------------------------------------------------------------------------
# A float32 convolution's signature (every operand's shape, strides, storage offset and dtype, the
# convolution's parameters, output_mask, and the precisions torch's TF32 flags accept) fixes everything
# but its buffers: the problems, the plans, the output geometry, the route, and each plan's launches with
# their kernel variant, grid, offsets and scalars. So the first call of a signature records its plans'
# launches (tunecl.kernels.launches) and later calls allocate the outputs, bind the buffers and enqueue.
# What may change between calls of one signature is checked per call: whether the Winograd weight cache
# serves the weight (policy, version, writes: weight_cache), and a graph capture or kernel profile
# (Launches.enqueue then goes through pyopencl's launch function). plans.clear() (a new tuning DB, new
# algorithms) and a new backend State drop every pre-built call; a State with a planner of its own (a dry
# run's, tunecl.tools.coverage: no device) takes the general route.
MAX_CALLS = 1024
_calls = plans.SignatureCalls()      # signature -> _Forward / _Backward, or None: the general route
_FLOAT32 = torch.float32
_DL_FLOAT32 = memory.DLPACK[_FLOAT32]


class _Direction:
    """A plan with a direction's output geometry, and its two runs (whole, from the cached transform)."""

    __slots__ = ("full", "nbytes", "plan", "shape", "source", "strides", "transformed", "transforms")

    def __init__(self, problem: ConvProblem, shape: Sequence[int]) -> None:
        entry = plans.plan_entry(problem, count=False)   # (each run counts its use)
        self.plan, self.source = entry.plan, entry.source
        self.shape = tuple(shape)
        self.strides = tuple(memory.contiguous_strides(shape))
        self.nbytes = memory.storage_nbytes(self.shape, self.strides, 4)
        self.transforms = weight_cache.can_transform(entry.plan)
        self.full, self.transformed = launches.RecordedRun(), launches.RecordedRun()

    def empty(self) -> torch.Tensor:
        return memory.empty_sized(self.shape, self.strides, _DL_FLOAT32, self.nbytes)

    def run(self, device: Any, a: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None,
            backward: bool) -> None:
        """``weight_cache.run_conv(plan, a, weight, out, bias=bias, backward=backward)`` by the launches."""
        plan = self.plan
        ba, bo = buffer_of(a), buffer_of(out)
        bb = None if bias is None else buffer_of(bias)
        counters.plan_sources[self.source] += 1
        if self.transforms:
            u = weight_cache.cached_transform(plan, weight, backward)
            if u is not None:
                self.transformed(device, (ba, buffer_of(u), bo, bb), lambda: plan.run_transformed(
                    ba, buffer_of(u), bo, a_offset=a.storage_offset(), bias=bb,
                    bias_offset=0 if bias is None else bias.storage_offset()))
                return
        bw = buffer_of(weight)
        self.full(device, (ba, bw, bo, bb), lambda: plan.run(
            ba, bw, bo, a_offset=a.storage_offset(), b_offset=weight.storage_offset(), bias=bb,
            bias_offset=0 if bias is None else bias.storage_offset()))


class _Forward:
    __slots__ = ("direction",)

    def __init__(self, problems: dict[str, ConvProblem], n: int, transposed: bool) -> None:
        problem = problems["fwd"]
        shape = (n, problem.c, problem.h, problem.w) if transposed else (n, problem.k, problem.p, problem.q)
        self.direction = _Direction(problems["bwd_data"] if transposed else problem, shape)


class _Backward:
    __slots__ = ("channels", "data", "transposed", "weight")

    def __init__(self, problems: dict[str, ConvProblem], input: torch.Tensor, weight: torch.Tensor,
                 channels: int, transposed: bool, want_input: bool, want_weight: bool) -> None:
        # every plan is found first: an Unsupported problem then takes the CPU route before anything runs
        self.data = _Direction(problems["fwd"] if transposed else problems["bwd_data"],
                               input.shape) if want_input else None
        self.weight = _Direction(problems["bwd_weight"], weight.shape) if want_weight else None
        self.channels, self.transposed = channels, transposed


def _signature(t: torch.Tensor) -> tuple | None:
    """What a pre-built call depends on of an operand: None for what only the general route runs
    (not a contiguous float32 tensor)."""
    if t.dtype is not _FLOAT32 or not t.is_contiguous():
        return None
    return t.shape, t.stride(), t.storage_offset()


def _fast_forward(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
                  groups: int) -> torch.Tensor | None:
    """The forward by a pre-built call, or None where the general route serves the call."""
    key = ("fwd", _signature(input), _signature(weight), None if bias is None else _signature(bias), tuple(stride),
           tuple(padding), tuple(dilation), transposed, tuple(output_padding), groups,
           plans.accepted_precisions("conv"))
    call = _calls.lookup(key)
    if call is _calls:
        eligible = (_calls.prebuilds and key[1] is not None and key[2] is not None
                    and (bias is None or key[3] is not None)
                    and input.dim() == 4 and weight.dim() == 4 and input.shape[0] > 0
                    and not (transposed and bias is not None))
        call = _calls.keep(key, _Forward(_problems(input, weight, stride, padding, dilation, transposed,
                                                   output_padding, groups, bias), input.shape[0], transposed)
                           if eligible else None, MAX_CALLS)
    if call is None:
        return None
    direction = call.direction
    y = direction.empty()
    direction.run(state.get().device, input, weight, y, bias, False)
    return y


def _fast_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, stride: Sequence[int],
                   padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
                   groups: int, output_mask: Sequence[bool]) -> tuple | None:
    """The backward by a pre-built call, or None where the general route serves the call."""
    mask = (bool(output_mask[0]), bool(output_mask[1]), bool(output_mask[2]))
    key = ("bwd", _signature(grad_output), _signature(input), _signature(weight), tuple(stride), tuple(padding),
           tuple(dilation), transposed, tuple(output_padding), groups, mask, plans.accepted_precisions("conv"))
    call = _calls.lookup(key)
    if call is _calls:
        eligible = (_calls.prebuilds and None not in key[1:4] and input.dim() == 4
                    and weight.dim() == 4 and input.shape[0] > 0)
        call = _calls.keep(key, _Backward(_problems(input, weight, stride, padding, dilation, transposed,
                                                    output_padding, groups, grad_output), input, weight,
                                          grad_output.shape[1], transposed, mask[0], mask[1])
                           if eligible else None, MAX_CALLS)
    if call is None:
        return None
    device = state.get().device
    grad_input = grad_weight = grad_bias = None
    if call.data is not None:
        grad_input = call.data.empty()
        call.data.run(device, grad_output, weight, grad_input, None, True)
    if call.weight is not None:
        grad_weight = call.weight.empty()
        a, b = (grad_output, input) if call.transposed else (input, grad_output)
        call.weight.full(device, (buffer_of(a), buffer_of(b), buffer_of(grad_weight)), lambda: _run_weight(
            call.weight, a, b, grad_weight))
        counters.plan_sources[call.weight.source] += 1
    if mask[2]:
        grad_bias = reduce("sum", grad_output, [0, 2, 3], False,
                           memory.empty_contiguous((call.channels,), grad_output.dtype))
    return grad_input, grad_weight, grad_bias


def _run_weight(direction: _Direction, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    direction.plan.run(buffer_of(a), buffer_of(b), buffer_of(out), a_offset=a.storage_offset(),
                       b_offset=b.storage_offset())


# -- adapters ----------------------------------------------------------------------------------------
def convolution(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
                groups: int) -> torch.Tensor:
    """``aten::convolution_overrideable``: the ``fwd`` plan, or the CPU route for what it cannot run."""
    args = (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    try:
        if input.dim() == 5 and weight.dim() == 5:
            if transposed:
                return conv3d.transposed_forward(convolution_backward, input, weight, bias, stride, padding,
                                                 output_padding, dilation, groups)
            return conv3d.forward(convolution, input, weight, bias, stride, padding, dilation, groups)
        try:
            y = _fast_forward(*args)
        except KeyError:   # buffer_of: an operand on another device (the general route says what is wrong)
            y = None
        return _forward(*args) if y is None else y
    except Unsupported as why:
        # torch's own CPU convolution (the overrideable op has no CPU kernel), counted as a fallback
        return fallback.run_on_cpu(aten.convolution.default, args, {}, name=FORWARD, reason=str(why))


def convolution_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                         stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                         output_padding: Sequence[int], groups: int, output_mask: Sequence[bool]):
    """``aten::convolution_backward_overrideable``: the ``bwd_data``/``bwd_weight`` plans and a sum."""
    try:
        if input.dim() == 5 and weight.dim() == 5:
            if transposed:
                return conv3d.transposed_backward(convolution, convolution_backward, grad_output, input, weight,
                                                  stride, padding, output_padding, dilation, groups, output_mask)
            return conv3d.backward(convolution_backward, grad_output, input, weight, stride, padding, dilation,
                                   groups, output_mask)
        try:
            grads = _fast_backward(grad_output, input, weight, stride, padding, dilation, transposed,
                                   output_padding, groups, output_mask)
        except KeyError:   # buffer_of: an operand on another device (the general route says what is wrong)
            grads = None
        if grads is not None:
            return grads
        return _backward(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                         groups, output_mask)
    except Unsupported as why:
        bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
        return fallback.run_on_cpu(aten.convolution_backward.default,
                                   (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                    output_padding, groups, output_mask), {}, name=BACKWARD, reason=str(why))


KERNELS = {
    "convolution_overrideable": convolution,
    "convolution_backward_overrideable": convolution_backward,
}
