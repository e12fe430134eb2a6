"""Elementwise ops: ATen overloads mapped to expressions of the pointwise family.

Structured ops (add, mul, exp, ...) reach the backend as their ``.out`` overload: torch's
CompositeExplicitAutogradNonFunctional kernels compute the output's shape and dtype, allocate it
through ``empty_strided`` and call ``.out``; their functional and in-place variants come for free.
Non-structured ops (relu, hardtanh, where, masked_fill_, ...) are registered as themselves.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import graphs, memory, state
from tunecl.backend.dtypes import scalar_type_name
from tunecl.backend.allocator import buffers as _buffers
from tunecl.backend.counters import eager_fusions
from tunecl.backend.operands import dense_strides_like, operand, scalar_or_operand
from tunecl.backend.ops import COMPOSITE_KEYS
from tunecl.errors import Unsupported
from tunecl.kernels.ops import norm
from tunecl.kernels.strided import Operand, relu_tag

Number = bool | int | float


def run(expr: str, out: torch.Tensor, inputs: Sequence[Any], params: Sequence[Number] = (),
        key: tuple | None = None, held: tuple[object, object] | None = None) -> torch.Tensor:
    """Enqueue ``out = expr(inputs, params)``; inputs broadcast to ``out``'s shape. A caller that knows
    the call's signature more cheaply passes ``key`` (see :func:`_fast_binary`); ``held``: the launch waits
    under that (tag, payload), see :meth:`tunecl.kernels.ops.pointwise.Pointwise.launch`."""
    # The kernel plan depends only on this key (shapes, strides, dtypes, what each input is), so a
    # repeated signature skips building operands and keying the plan again: buffers, element
    # offsets and scalar values are all that is read per call.
    if key is None:
        key = (expr, out.shape, out.stride(), out.dtype,
               *[(x.shape, x.stride(), x.dtype, x.is_cpu) if isinstance(x, torch.Tensor) else type(x) for x in inputs])
    pointwise = state.get().pointwise
    launch = pointwise.launches.get(key)
    if launch is None:
        return _run_uncached(key, expr, out, inputs, params)
    plan, kinds = launch
    try:
        args = [_buffers[out.untyped_storage().data_ptr()]]
        offsets = [out.storage_offset()]
        for x, kind in zip(inputs, kinds):
            if kind is _TENSOR:
                args.append(_buffers[x.untyped_storage().data_ptr()])
                offsets.append(x.storage_offset())
            else:
                args.append(x.item() if kind is _WRAPPED else x)
                offsets.append(0)
    except KeyError:  # a tensor that is not one of our storages (meta, ...)
        raise Unsupported("a tensor without an opencl storage among opencl operands") from None
    pointwise.launch(plan, args, params, offsets, defer=True, held=held)
    return out


_TENSOR, _WRAPPED, _NUMBER = "tensor", "wrapped number", "number"
MAX_LAUNCHES = 8192  # a safety valve for programs with ever-changing shapes


def _run_uncached(key: tuple, expr: str, out: torch.Tensor, inputs: Sequence[Any],
                  params: Sequence[Number]) -> torch.Tensor:
    shape = given_shape = out.shape
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.shape != shape and x.dim():
            shape = _shape_for_out(out, inputs)
            break
    operands = [operand(x) if isinstance(x, torch.Tensor) and x.shape == shape else scalar_or_operand(x, shape)
                for x in inputs]
    pointwise = state.get().pointwise
    out_operand = operand(out)
    plan = pointwise.prepare(expr, shape, out_operand, operands)
    if plan is None:  # no elements
        return out
    if shape == given_shape:  # (not after a resize of out: then the key no longer describes this call)
        kinds = tuple(_TENSOR if isinstance(x, Operand) else _WRAPPED if isinstance(given, torch.Tensor) else _NUMBER
                      for x, given in zip(operands, inputs))
        launches = pointwise.launches
        if len(launches) >= MAX_LAUNCHES:
            launches.clear()
        launches[key] = (plan, kinds)
    args = [out_operand.buffer, *(x.buffer if isinstance(x, Operand) else x for x in operands)]
    offsets = [out_operand.offset, *(x.offset if isinstance(x, Operand) else 0 for x in operands)]
    pointwise.launch(plan, args, params, offsets, defer=True)
    return out


def run_out(expr: str, out: torch.Tensor, inputs: Sequence[Any], params: Sequence[Number] = ()) -> torch.Tensor:
    """:func:`run` for an ATen ``.out`` overload: ``out`` first takes the inputs' broadcast shape, as torch's
    ``resize_output`` does (the functional form of a non-structured op passes a fresh ``empty({0})``: a
    0-dim result must come back 0-dim, not of shape (0,))."""
    shape = out.shape
    matched = False
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.shape != shape:
            if x.dim():
                resize_output(out, torch.broadcast_shapes(*(x.shape for x in inputs if isinstance(x, torch.Tensor))))
                return run(expr, out, inputs, params)
        elif isinstance(x, torch.Tensor):
            matched = True
    if not matched and shape:   # every input 0-dim (or a number): the result is 0-dim
        resize_output(out, torch.Size(()))
    return run(expr, out, inputs, params)


def resize_output(out: torch.Tensor, shape: torch.Size) -> None:
    """Give ``out`` ``shape``, warning (as torch does) when it held elements of another shape."""
    if out.shape == shape:
        return
    if out.numel():
        warnings.warn(f"An output with one or more elements was resized since it had shape {list(out.shape)}, "
                      f"which does not match the required output shape {list(shape)}. This behavior is "
                      f"deprecated, and in a future PyTorch release outputs will not be resized unless they "
                      f"have zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, "
                      f"to zero elements with t.resize_(0).", UserWarning, stacklevel=4)
    out.resize_(shape)


def _shape_for_out(out: torch.Tensor, inputs: Sequence[Any]) -> torch.Size:
    """The iteration shape: ``out``'s when the inputs broadcast to it; otherwise (a user's ``out=``
    of another shape) ``out`` is resized to the inputs' broadcast shape, as structured kernels do."""
    target = torch.broadcast_shapes(*(x.shape for x in inputs if isinstance(x, torch.Tensor)))
    if out.shape != target:
        try:
            if torch.broadcast_shapes(out.shape, target) == out.shape:
                return out.shape
        except RuntimeError:  # not broadcastable: out has the wrong shape
            pass
        out.resize_(target)
    return out.shape


def _folded(t: torch.Tensor, op: str) -> bool:
    """``t.relu_()`` (``op`` "relu") or ``hardtanh_(t, 0, 6)`` ("relu6") done by the launch that has just
    produced ``t``, if it still waits, held, and can apply the op as it writes (a batch norm's
    normalisation, an add for relu: torchvision's nets follow those by ``ReLU(inplace=True)`` or
    ``ReLU6(inplace=True)``): one pass over the activations and one launch fewer each. In training, autograd
    clones the input of ``hardtanh_`` first, which enqueues the held launch: relu6 folds where no gradient
    is recorded (inference)."""
    if t.dtype is not torch.float32 or not t.is_contiguous() or not t.numel():
        return False
    buffer = _buffers.get(t.untyped_storage().data_ptr())
    if buffer is None or not state.get().device.replace_held(relu_tag(buffer, t.storage_offset(), t.numel()), op):
        return False
    eager_fusions["activation"] += 1
    return True


def new_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised device tensor shaped like ``t`` (dense layouts kept)."""
    return memory.empty(t.shape, dense_strides_like(t), t.dtype if dtype is None else dtype)


def unary_new(expr: str, self: torch.Tensor, params: Sequence[Number] = ()) -> torch.Tensor:
    """``expr`` of ``self`` into a new tensor laid out like it; a contiguous self is keyed by its shape and
    dtype alone, as :func:`_fast_binary` keys its calls."""
    if self.is_contiguous():
        return run(expr, memory.empty_dense(self), (self,), params, (_DENSE, expr, self.shape, self.dtype, None))
    return run(expr, new_like(self), (self,), params)


def polygamma_out(n: int, self: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    """Orders 0 (digamma) and 1 (trigamma, digamma's derivative) on the device; higher orders on the CPU."""
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    if n > 1:
        raise Unsupported(f"polygamma of order {n}")
    return run_out("digamma" if n == 0 else "trigamma", out, (self,))


# -- adapter builders: each returns a kernel with the overload's exact signature -------------------
def unary(expr: str) -> Callable[..., torch.Tensor]:
    return lambda self, *, out: run_out(expr, out, (self,))


def binary(expr: str) -> Callable[..., torch.Tensor]:
    return lambda self, other, *, out: run_out(expr, out, (self, other))


def binary_alpha(expr: str) -> Callable[..., torch.Tensor]:
    return lambda self, other, *, alpha=1, out: run_out(expr, out, (self, other), (alpha,))


def backward(expr: str) -> Callable[..., torch.Tensor]:
    """``op_backward.grad_input(grad_output, self_or_output, *, grad_input)``."""
    return lambda grad_output, x, *, grad_input: run_out(expr, grad_input, (grad_output, x))


def functional_and_inplace(expr: str, params: Callable[..., tuple]) -> dict[str, Callable[..., torch.Tensor]]:
    """``op``, ``op_`` and ``op.out`` kernels of a non-structured unary op."""
    return {
        "": lambda self, *args: unary_new(expr, self, params(*args)),
        "_": lambda self, *args: run(expr, self, (self,), params(*args)),
        ".out": lambda self, *args, out: run_out(expr, out, (self,), params(*args)),
    }


# -- adapters with logic beyond a table row ------------------------------------------------------
_HARDTANH = functional_and_inplace("hardtanh", lambda lo=-1, hi=1: (lo, hi))


def _hardtanh_(self: torch.Tensor, min_val: float = -1, max_val: float = 1) -> torch.Tensor:
    """``hardtanh_``; relu6 (bounds 0 and 6) folds into the launch that produced ``self`` where it can."""
    if min_val == 0 and max_val == 6 and _folded(self, "relu6"):
        return self
    return _HARDTANH["_"](self, min_val, max_val)


def check_divisor(other: Any, result: torch.dtype) -> None:
    """torch's error for an integer division (or remainder) by zero: a number is checked here, a tensor by one
    read of a flag from the device (not inside a graph capture, where its values are not known yet)."""
    if result.is_floating_point or result is torch.bool:
        return
    if isinstance(other, torch.Tensor):
        if other.dtype.is_floating_point or not other.numel():
            return
        if other.is_cpu:
            zero = bool((other == 0).any())
        else:
            zero = not graphs.capturing() and bool((other == 0).any())
    else:
        zero = other == 0
    if zero:
        raise RuntimeError("ZeroDivisionError")


def integer_division(expr: str) -> Callable[..., torch.Tensor]:
    """``op.out(self, other)`` of a division or remainder, refusing an integer division by zero."""
    def kernel(self: torch.Tensor, other: Any, *, out: torch.Tensor) -> torch.Tensor:
        check_divisor(other, out.dtype)
        return run_out(expr, out, (self, other))
    return kernel


def div_mode(self: torch.Tensor, other: Any, *, rounding_mode: str | None = None,
             out: torch.Tensor) -> torch.Tensor:
    expr = {None: "div", "trunc": "div_trunc", "floor": "div_floor"}[rounding_mode]
    if rounding_mode is not None:
        check_divisor(other, out.dtype)
    return run_out(expr, out, (self, other))


def floor_divide(self: torch.Tensor, other: Any) -> torch.Tensor:
    result = torch.result_type(self, other)
    check_divisor(other, result)
    out = memory.empty_contiguous(torch.broadcast_shapes(self.shape, getattr(other, "shape", ())), result)
    return run("div_floor", out, (self, other))


def remainder_scalar_tensor(self: Number, other: torch.Tensor) -> torch.Tensor:
    """``number % tensor``."""
    result = torch.result_type(self, other)
    check_divisor(other, result)
    return run("remainder", new_like(other, result), (self, other))


def floor_divide_(self: torch.Tensor, other: Any) -> torch.Tensor:
    check_divisor(other, self.dtype)
    return run("div_floor", self, (self, other))


def pow_tensor_scalar(self: torch.Tensor, exponent: Number, *, out: torch.Tensor) -> torch.Tensor:
    if exponent == 2:
        return run_out("mul", out, (self, self))  # exact, like torch's own square path
    if exponent == 0.5 and out.dtype.is_floating_point:
        return run_out("sqrt", out, (self,))
    return run_out("pow", out, (self, exponent))


def nan_to_num_out(self: torch.Tensor, nan: float | None = None, posinf: float | None = None,
                   neginf: float | None = None, *, out: torch.Tensor) -> torch.Tensor:
    """NaN, +inf and -inf replaced (by default 0 and the result dtype's largest and lowest values); integer and
    bool tensors are copied."""
    if not self.dtype.is_floating_point:
        return run_out("copy", out, (self,))
    info = torch.finfo(out.dtype)
    return run_out("nan_to_num", out, (self,), (0.0 if nan is None else nan, info.max if posinf is None else posinf,
                                              info.min if neginf is None else neginf))


def clamp(self: torch.Tensor, min: Number | None = None, max: Number | None = None, *,
          out: torch.Tensor) -> torch.Tensor:
    if min is not None and max is not None:
        return run_out("clamp", out, (self,), (min, max))
    if min is not None:
        return run_out("clamp_min", out, (self,), (min,))
    if max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    return run_out("clamp_max", out, (self,), (max,))


def clamp_tensor(self: torch.Tensor, min: torch.Tensor | None = None, max: torch.Tensor | None = None, *,
                 out: torch.Tensor) -> torch.Tensor:
    if min is not None and max is not None:
        return run_out("clamp_tensor", out, (self, min, max))
    if min is not None:
        return run_out("maximum", out, (self, min))
    if max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    return run_out("minimum", out, (self, max))


def where(condition: torch.Tensor, self: torch.Tensor | Number, other: torch.Tensor | Number) -> torch.Tensor:
    """``where.self``; a number (torch.where(mask, x, 0.0)) arrives unwrapped, as for add."""
    shape = torch.broadcast_shapes(*(getattr(x, "shape", ()) for x in (condition, self, other)))
    out = memory.empty_contiguous(shape, torch.result_type(self, other) if isinstance(self, torch.Tensor)
                                  or isinstance(other, torch.Tensor) else torch.get_default_dtype())
    return run_out("where", out, (condition, self, other))


def masked_fill_tensor(self: torch.Tensor, mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    if value.device.type != "opencl":
        return run("masked_fill", self, (self, mask), (value.item(),))
    return run("masked_fill_tensor", self, (self, mask, value))


# gelu's expressions (forward, backward) by ``approximate``
_GELU = {"none": ("gelu", "gelu_backward"), "tanh": ("gelu_tanh", "gelu_tanh_backward")}


def _gelu_exprs(approximate: str) -> tuple[str, str]:
    """gelu's expressions for ``approximate``; torch's error for a value it does not know."""
    exprs = _GELU.get(approximate)
    if exprs is None:
        raise RuntimeError("approximate argument must be either none or tanh.")
    return exprs


def gelu(self: torch.Tensor, *, approximate: str = "none", out: torch.Tensor) -> torch.Tensor:
    return run_out(_gelu_exprs(approximate)[0], out, (self,))


def gelu_backward(grad_output: torch.Tensor, self: torch.Tensor, *, approximate: str = "none",
                  grad_input: torch.Tensor) -> torch.Tensor:
    return run_out(_gelu_exprs(approximate)[1], grad_input, (grad_output, self))


def gelu_new(self: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
    """``gelu(x)`` for a contiguous floating ``x`` (a transformer's every feed-forward): the result allocated
    here; anything else through torch's structured wrapper (see the functional fast paths below)."""
    exprs = _GELU.get(approximate)
    if exprs is not None and self.dtype.is_floating_point and self.is_contiguous():
        return run(exprs[0], memory.empty_dense(self), (self,))
    return torch.ops.aten.gelu.default.redispatch(COMPOSITE_KEYS, self, approximate=approximate)


def gelu_backward_new(grad_output: torch.Tensor, self: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
    """``gelu_backward`` for contiguous floating operands of one shape and dtype, as :func:`gelu_new`."""
    exprs = _GELU.get(approximate)
    if (exprs is not None and self.dtype.is_floating_point and grad_output.dtype is self.dtype
            and grad_output.shape == self.shape and self.is_contiguous() and grad_output.is_contiguous()
            and not grad_output.is_cpu and not self.is_cpu):
        return run(exprs[1], memory.empty_dense(self), (grad_output, self))
    return torch.ops.aten.gelu_backward.default.redispatch(COMPOSITE_KEYS, grad_output, self,
                                                            approximate=approximate)


# -- functional fast paths ------------------------------------------------------------------------------
# The hottest binary ops are also registered as themselves: for dense same-shape operands (or a
# Python number) we allocate the output and launch directly, skipping torch's structured wrapper
# (shape/dtype inference in C++ plus a separate empty_strided call into Python). Every other case
# goes to that wrapper unchanged, reached by redispatching to a backend key with no kernel of its
# own (PrivateUse3), where the shared CompositeExplicitAutogradNonFunctional kernel runs; it then
# allocates through our empty_strided and calls our ``.out`` kernel.


def _number_result_type(expr: str, a: torch.Tensor | Number, b: torch.Tensor | Number) -> torch.dtype:
    """torch's result dtype of ``a expr b`` where one side is a Python number."""
    tensor = a if isinstance(a, torch.Tensor) else b
    if expr == "sub" and tensor.dtype == torch.bool:
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported.")
    dtype = torch.result_type(a, b)
    if expr == "div" and not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return dtype


def _fast_binary(expr: str, op: torch._ops.OpOverload, with_alpha: bool) -> Callable[..., torch.Tensor]:
    """Floating inputs only on the fast path (integer division would change the dtype)."""
    def kernel(self: torch.Tensor | Number, other: torch.Tensor | Number, *, alpha: Number = 1) -> torch.Tensor:
        # (a Python number arrives as such: torch unwraps wrapped-number tensors for Python kernels;
        # rsub passes it first)
        if isinstance(self, torch.Tensor) and (dtype := self.dtype).is_floating_point and self.is_contiguous():
            # out is laid out like self, so self's shape and dtype and what other is make the plan's key
            shape = self.shape
            if not isinstance(other, torch.Tensor):
                kind = type(other) if isinstance(other, (float, int)) and not isinstance(other, bool) else None
            elif other.is_cpu:
                kind = other.dtype if other.dim() == 0 and not other.dtype.is_complex else None
            else:
                kind = True if other.dtype == dtype and other.shape == shape and other.is_contiguous() else None
            if kind is not None:
                out = memory.empty_dense(self)
                # (a block's x + bn(...), or bn(...) + x)
                if kind is True and expr == "add" and alpha == 1 and _fold_add((other, self, out), (self, other, out)):
                    return out
                return run(expr, out, (self, other), (alpha,) if with_alpha else (), (_DENSE, expr, shape, dtype, kind))
        if not isinstance(other, torch.Tensor) or not isinstance(self, torch.Tensor):
            # a number cannot be passed back as the Tensor argument (torch unwrapped it), so this
            # case is done here: torch's promotion rules, an output laid out like self
            tensor = self if isinstance(self, torch.Tensor) else other
            dtype = _number_result_type(expr, self, other)
            return run(expr, new_like(tensor, dtype), (self, other), (alpha,) if with_alpha else ())
        if with_alpha:
            return op.redispatch(COMPOSITE_KEYS, self, other, alpha=alpha)
        return op.redispatch(COMPOSITE_KEYS, self, other)
    return kernel


_DENSE = object()  # starts the plan keys of _fast_binary's calls

FOLD_RESIDUALS = True   # an add of a residual to a batch norm's output may run inside its launch (tests: off)


def _held_normalisation(y: torch.Tensor, residual: torch.Tensor) -> tuple[norm.HeldNormalisation, Any] | None:
    """The batch norm forward launch that wrote ``y`` (contiguous), if it still waits, held, and can add
    ``residual`` (laid out as y, in another storage) as it writes; with the residual's (buffer, offset)."""
    if not FOLD_RESIDUALS or y.dtype is not torch.float32 or not y.numel():
        return None
    device = state.get().device
    if not device.holding:
        return None
    storage = y.untyped_storage().data_ptr()
    buffer, residual_buffer = _buffers.get(storage), _buffers.get(residual.untyped_storage().data_ptr())
    if buffer is None or residual_buffer is None or residual_buffer is buffer:
        return None
    held = device.peek_held(relu_tag(buffer, y.storage_offset(), y.numel()))
    if not isinstance(held, norm.HeldNormalisation):
        return None
    return held, (residual_buffer, residual.storage_offset())


def _fold_add(*tries: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]) -> bool:
    """An add of a residual to a batch norm's output done by the batch norm launch that has just produced it,
    if it still waits, held: the first of ``tries`` (y, residual, out) whose y that launch wrote (contiguous
    float32 operands of one shape, in other storages) adds the residual as it writes, into y (``out`` None)
    or into ``out`` (a new tensor, or the residual itself), and an in-place relu after it folds in too.
    One pass over the activations and one launch fewer; bit for bit the add's result."""
    for y, residual, out in tries:
        found = _held_normalisation(y, residual)
        if found is not None:
            held, placed = found
            if not held.add(placed, None if out is None else (_buffers[out.untyped_storage().data_ptr()],
                                                              out.storage_offset())):
                return False
            eager_fusions["residual"] += 1
            return True
    return False


def _overlaps(self: torch.Tensor, other: torch.Tensor) -> bool:
    """Another view of self's storage (torch's structured wrapper decides whether that is allowed)."""
    return other is not self and other.untyped_storage().data_ptr() == self.untyped_storage().data_ptr()


def _fast_inplace(expr: str, op: torch._ops.OpOverload, with_alpha: bool) -> Callable[..., torch.Tensor]:
    """``self.op_(other)`` for a same-shape tensor or a number: launch directly (no broadcast or
    dtype question arises); anything else takes torch's structured in-place wrapper, which checks. A
    contiguous self (and other) is keyed as :func:`_fast_binary` keys its calls: the same plan."""
    def kernel(self: torch.Tensor, other: torch.Tensor | Number, *, alpha: Number = 1) -> torch.Tensor:
        params = (alpha,) if with_alpha else ()
        dtype = self.dtype
        if isinstance(other, torch.Tensor):
            if (dtype.is_floating_point and other.shape == self.shape and not other.is_cpu
                    and other.dtype == dtype and not _overlaps(self, other)):
                dense = self.is_contiguous() and other.is_contiguous()
                # (a residual block's out = bn(...); out += identity, or out += bn(...) for a downsampled identity)
                if dense and expr == "add" and alpha == 1 and _fold_add((self, other, None), (other, self, self)):
                    return self
                return run(expr, self, (self, other), params, (_DENSE, expr, self.shape, dtype, True) if dense else None)
            if with_alpha:
                return op.redispatch(COMPOSITE_KEYS, self, other, alpha=alpha)
            return op.redispatch(COMPOSITE_KEYS, self, other)
        number = type(other)
        # a float or int into a floating tensor, an int into an integer one (a step counter): its own dtype
        if not (number is float or number is int) or not (
                dtype.is_floating_point or number is int and dtype in _INTEGERS and expr != "div"):
            result = _number_result_type(expr, self, other)   # torch's checks
            if not torch.can_cast(result, dtype):
                raise RuntimeError(f"result type {scalar_type_name(result)} can't be cast to the desired output type "
                                   f"{scalar_type_name(dtype)}")
        held = None
        if (expr == "add" and number is int and dtype is torch.int64 and FOLD_STEP_COUNTS and self.dim() == 0
                and (not with_alpha or alpha == 1) and -_INT32_LIMIT < other < _INT32_LIMIT):
            # a step count (a batch norm's num_batches_tracked += 1)
            held = (STEP_COUNT_TAG, (self, other))
        return run(expr, self, (self, other), params,
                   (_DENSE, expr, self.shape, dtype, number) if self.is_contiguous() else None, held)
    return kernel


_INTEGERS = frozenset((torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64))
_INT32_LIMIT = 1 << 31   # a step count's increment folds into a batch norm's launch within int32's range


def _dense_backward(expr: str, grad_output: torch.Tensor, self: torch.Tensor,
                    params: Sequence[Number], mask: str | None = None) -> torch.Tensor | None:
    """An activation backward of dense same-shape device operands of one floating dtype, launched on a key of
    their shape and dtype alone (as :func:`_fast_binary` keys its calls); None for any other operands.
    ``mask`` ("relu": threshold_backward at 0, "relu6": hardtanh_backward over (0, 6)): on contiguous float32
    operands the launch waits, held under :func:`masked_tag` of its output, so that a batch norm's backward
    of that output can compute it in its own reduction instead (:mod:`tunecl.backend.ops.nn`)."""
    dtype = grad_output.dtype
    if (dtype.is_floating_point and self.dtype == dtype and self.shape == grad_output.shape
            and not self.is_cpu and not grad_output.is_cpu and grad_output.is_contiguous() and self.is_contiguous()):
        out = memory.empty_dense(grad_output)
        held = None
        if mask is not None and FOLD_MASKS and dtype is torch.float32 and out.numel():
            buffer = _buffers.get(out.untyped_storage().data_ptr())
            held = None if buffer is None else (masked_tag(buffer, out), (mask, grad_output, self))
        return run(expr, out, (grad_output, self), params, (_DENSE, expr, grad_output.shape, dtype, True), held)
    return None


FOLD_MASKS = True   # a relu's or relu6's backward may run inside the batch norm backward after it (tests: off)
# An in-place add of a Python int to a 0-dim int64 tensor (a step count: BatchNorm's num_batches_tracked += 1,
# right before its forward) waits, held under STEP_COUNT_TAG with (the tensor, the int) as payload, so that
# a training batch norm's forward right after it adds it inside its own first launch (tests: off)
FOLD_STEP_COUNTS = True
STEP_COUNT_TAG = ("step_count",)


def masked_tag(buffer: object, t: torch.Tensor) -> tuple:
    """The tag under which an activation's backward into ``t`` (whose storage is ``buffer``) waits, held.
    (The held launch's arguments keep ``buffer`` alive, so its id names it while the tag is held.)"""
    return ("masked", id(buffer), t.storage_offset(), t.numel())


def _fast_threshold_backward(grad_output: torch.Tensor, self: torch.Tensor, threshold: Number) -> torch.Tensor:
    """ReLU's backward (about 300 calls per resnet50 training step): :func:`_dense_backward`; anything else
    takes torch's structured wrapper."""
    result = _dense_backward("threshold_backward", grad_output, self, (threshold,),
                             "relu" if threshold == 0 else None)
    if result is not None:
        return result
    return torch.ops.aten.threshold_backward.default.redispatch(COMPOSITE_KEYS, grad_output, self, threshold)


def _activation_backward(expr: str) -> Callable[..., torch.Tensor]:
    """The functional form of a non-structured activation backward (``hardtanh_backward``, 35 calls per
    mobilenet_v2 training step; ``hardswish_backward``): :func:`_dense_backward`; any other operands get an
    output of their broadcast shape and promoted dtype, laid out like ``grad_output`` where their shapes
    agree, as torch's TensorIterator kernels give."""
    def kernel(grad_output: torch.Tensor, self: torch.Tensor, *params: Number) -> torch.Tensor:
        dense = _dense_backward(expr, grad_output, self, params,
                                "relu6" if expr == "hardtanh_backward" and params == (0, 6) else None)
        if dense is not None:
            return dense
        result = torch.result_type(grad_output, self)
        shape = torch.broadcast_shapes(grad_output.shape, self.shape)
        out = new_like(grad_output, result) if shape == grad_output.shape else memory.empty_contiguous(shape, result)
        return run(expr, out, (grad_output, self), params)
    return kernel


FAST_FUNCTIONAL = {
    "threshold_backward": _fast_threshold_backward,
    "add.Tensor": _fast_binary("add", torch.ops.aten.add.Tensor, True),
    "sub.Tensor": _fast_binary("sub", torch.ops.aten.sub.Tensor, True),
    "mul.Tensor": _fast_binary("mul", torch.ops.aten.mul.Tensor, False),
    "div.Tensor": _fast_binary("div", torch.ops.aten.div.Tensor, False),
    "add_.Tensor": _fast_inplace("add", torch.ops.aten.add_.Tensor, True),
    "sub_.Tensor": _fast_inplace("sub", torch.ops.aten.sub_.Tensor, True),
    "mul_.Tensor": _fast_inplace("mul", torch.ops.aten.mul_.Tensor, False),
    "div_.Tensor": _fast_inplace("div", torch.ops.aten.div_.Tensor, False),
}


def _with_suffixes(base: str, kernels: dict[str, Callable[..., torch.Tensor]]) -> dict[str, Callable]:
    return {base + suffix: fn for suffix, fn in kernels.items()}


KERNELS: dict[str, Callable[..., Any]] = {
    **FAST_FUNCTIONAL,
    # arithmetic
    "add.out": binary_alpha("add"),
    "sub.out": binary_alpha("sub"),
    "mul.out": binary("mul"),
    "div.out": binary("div"),
    "div.out_mode": div_mode,
    "maximum.out": binary("maximum"),
    "minimum.out": binary("minimum"),
    "pow.Tensor_Scalar_out": pow_tensor_scalar,
    "pow.Tensor_Tensor_out": binary("pow"),
    "pow.Scalar_out": lambda self, exponent, *, out: run_out("pow", out, (self, exponent)),
    "clamp.out": clamp,
    "clamp.Tensor_out": clamp_tensor,
    "clamp_min.out": lambda self, min, *, out: run_out("clamp_min", out, (self,), (min,)),
    "clamp_max.out": lambda self, max, *, out: run_out("clamp_max", out, (self,), (max,)),
    "clamp_min.Tensor_out": lambda self, min, *, out: run_out("maximum", out, (self, min)),
    "clamp_max.Tensor_out": lambda self, max, *, out: run_out("minimum", out, (self, max)),
    "addcmul.out": lambda self, t1, t2, *, value=1, out: run_out("addcmul", out, (self, t1, t2), (value,)),
    "addcdiv.out": lambda self, t1, t2, *, value=1, out: run_out("addcdiv", out, (self, t1, t2), (value,)),
    "lerp.Scalar_out": lambda self, end, weight, *, out: run_out("lerp", out, (self, end), (weight,)),
    "lerp.Tensor_out": lambda self, end, weight, *, out: run_out("lerp_tensor", out, (self, end, weight)),
    # unary math
    **{f"{name}.out": unary(name) for name in (
        "neg", "abs", "sign", "reciprocal", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin",
        "cos", "erf", "floor", "ceil", "trunc", "round", "sigmoid", "tanh", "silu", "hardsigmoid",
        "logical_not", "erfc", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log2",
        "log10", "lgamma", "frac", "erfinv", "digamma")},
    "polygamma.out": polygamma_out,
    **{f"{name}.out": binary(name) for name in ("hypot", "copysign", "logaddexp", "logaddexp2")},
    "fmod.Tensor_out": integer_division("fmod"),
    "fmod.Scalar_out": integer_division("fmod"),
    "nan_to_num.out": nan_to_num_out,
    "hardshrink.out": lambda self, lambd=0.5, *, out: run_out("hardshrink", out, (self,), (lambd,)),
    "hardshrink_backward.grad_input": lambda grad_out, self, lambd, *, grad_input: run_out(
        "hardshrink_backward", grad_input, (grad_out, self), (lambd,)),
    "softshrink.out": lambda self, lambd=0.5, *, out: run_out("softshrink", out, (self,), (lambd,)),
    "softshrink_backward.grad_input": lambda grad_output, self, lambd, *, grad_input: run_out(
        "softshrink_backward", grad_input, (grad_output, self), (lambd,)),
    **{f"{name}.out": binary(name) for name in ("logical_and", "logical_or", "logical_xor")},
    **{f"{name}.Tensor_out": binary(name) for name in ("bitwise_and", "bitwise_or", "bitwise_xor")},
    "sgn.out": unary("sign"),
    "exp2.out": unary("exp2"),
    "atan2.out": binary("atan2"),
    "remainder.Tensor_out": integer_division("remainder"),
    "remainder.Scalar_Tensor": remainder_scalar_tensor,
    "floor_divide.out": integer_division("div_floor"),
    "floor_divide": floor_divide,
    "floor_divide_.Tensor": floor_divide_,
    "bitwise_not.out": lambda self, *, out: run_out("logical_not" if self.dtype == torch.bool else "bitwise_not",
                                                out, (self,)),
    "isinf": lambda self: run("isinf", new_like(self, torch.bool), (self,)),
    "isposinf.out": unary("isposinf"),
    "isneginf.out": unary("isneginf"),
    "isfinite": lambda self: run("isfinite", new_like(self, torch.bool), (self,)),
    "softplus.out": lambda self, beta=1, threshold=20, *, out: run_out("softplus", out, (self,), (beta, threshold)),
    "softplus_backward.grad_input": lambda grad_output, self, beta, threshold, *, grad_input: run_out(
        "softplus_backward", grad_input, (grad_output, self), (beta, threshold)),
    "elu.out": lambda self, alpha=1, scale=1, input_scale=1, *, out: run_out(
        "elu", out, (self,), (alpha, scale, input_scale)),
    "elu_backward.grad_input": lambda grad_output, alpha, scale, input_scale, is_result, self_or_result, *,
        grad_input: run_out("elu_backward_result" if is_result else "elu_backward", grad_input,
                        (grad_output, self_or_result), (alpha, scale, input_scale)),  # sgn is sign for real tensors (abs backward uses it)
    # comparisons (bool out) and selection
    **{f"{cmp}.{kind}_out": binary(cmp) for cmp in ("eq", "ne", "lt", "le", "gt", "ge")
       for kind in ("Scalar", "Tensor")},
    "isnan": lambda self: run("isnan", new_like(self, torch.bool), (self,)),
    "where.self": where,
    "where.self_out": lambda condition, self, other, *, out: run_out("where", out, (condition, self, other)),
    "masked_fill_.Scalar": lambda self, mask, value: run("masked_fill", self, (self, mask), (value,)),
    "masked_fill_.Tensor": masked_fill_tensor,
    # activations
    **_with_suffixes("relu", {
        "": lambda self: unary_new("relu", self),
        "_": lambda self: self if _folded(self, "relu") else run("relu", self, (self,)),
    }),
    **_with_suffixes("hardtanh", {**_HARDTANH, "_": _hardtanh_}),
    **_with_suffixes("hardswish", functional_and_inplace("hardswish", lambda: ())),
    "threshold.out": lambda self, threshold, value, *, out: run_out("threshold", out, (self,), (threshold, value)),
    "leaky_relu.out": lambda self, negative_slope=0.01, *, out: run_out("leaky_relu", out, (self,),
                                                                   (negative_slope,)),
    "xlogy.OutTensor": binary("xlogy"),
    "gelu.out": gelu,
    "gelu": gelu_new,
    "gelu_backward": gelu_backward_new,
    # activation backward
    "threshold_backward.grad_input": lambda grad_output, self, threshold, *, grad_input: run_out(
        "threshold_backward", grad_input, (grad_output, self), (threshold,)),
    "hardtanh_backward": _activation_backward("hardtanh_backward"),
    "hardtanh_backward.grad_input": lambda grad_output, self, min_val, max_val, *, grad_input: run_out(
        "hardtanh_backward", grad_input, (grad_output, self), (min_val, max_val)),
    "hardswish_backward": _activation_backward("hardswish_backward"),
    "leaky_relu_backward.grad_input": lambda grad_output, self, negative_slope, self_is_result, *, grad_input:
        run_out("leaky_relu_backward", grad_input, (grad_output, self), (negative_slope,)),
    "sigmoid_backward.grad_input": backward("sigmoid_backward"),
    "tanh_backward.grad_input": backward("tanh_backward"),
    "silu_backward.grad_input": backward("silu_backward"),
    "hardsigmoid_backward.grad_input": backward("hardsigmoid_backward"),
    "gelu_backward.grad_input": gelu_backward,
}
