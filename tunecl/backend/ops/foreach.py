"""torch's elementwise ``_foreach_*`` ops as multi-tensor kernels.

torch.optim's default (foreach) optimizers update every parameter with a handful of ``_foreach_*``
calls per step (Adam: lerp_, mul_, addcmul_, sqrt, div_, add_, addcdiv_). torch's generic version of
these ops loops over the tensors, one device op each: on resnet50 (161 parameters) ~970 launches per
Adam step. Here each call is one launch per ``Optim.slots`` tensors (8 by default), computing the
pointwise family's expression for the op (so the result is the per-tensor op's, bit for bit).

The multi-tensor path takes contiguous float32 opencl tensors of equal shapes per index, where an input
either is its output or does not share its storage. Any other call (other dtypes, broadcasting, strides,
CPU scalars as tensors, overlapping views) runs torch's generic version, which calls the per-tensor ops
on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from numbers import Real
from typing import Any

import torch

from tunecl.backend import foreach_runs, state
from tunecl.backend.allocator import buffers as _buffers
from tunecl.backend.memory import empty_dense_many
from tunecl.backend.ops import optim_calls

_GENERIC = torch._C.DispatchKey.CompositeExplicitAutograd


def buffer_pairs(tensors: Sequence[Any], outs: Sequence[torch.Tensor] | None = None) -> list[tuple[Any, int]] | None:
    """(buffer, element offset) of each tensor when every one is a contiguous float32 opencl tensor (and,
    given ``outs``, of its output's shape, and either exactly its output or sharing no storage with it);
    else None. One pass, a few attribute reads per tensor: optimizers call this for ~1000 tensors a step."""
    pairs = []
    append, buffers, float32, tensor_type = pairs.append, _buffers, torch.float32, torch.Tensor
    for k, t in enumerate(tensors):
        if not isinstance(t, tensor_type) or t.dtype is not float32 or not t.is_contiguous():
            return None
        address = t.untyped_storage().data_ptr()
        buffer = buffers.get(address, _MISSING)
        if buffer is _MISSING:   # not an opencl storage (an empty one maps to None)
            return None
        offset = t.storage_offset()
        if outs is not None:
            out = outs[k]
            if out is not t and (t.shape != out.shape or (address == out.untyped_storage().data_ptr()
                                                          and offset != out.storage_offset())):
                return None
        append((buffer, offset))
    return pairs


_MISSING = object()
_PLAIN_NUMBERS = (float, int)
_FLOAT = {float}


def _is_number(value: Any) -> bool:
    # plain floats and ints first: isinstance against the numbers.Real ABC costs ~0.5 µs a value
    return type(value) in _PLAIN_NUMBERS or isinstance(value, Real)


def _numbers(value: Any, count: int) -> list[float] | None:
    """A Scalar (one number for every tensor) or a ScalarList as floats; None for anything else."""
    if type(value) is list and len(value) == count and set(map(type, value)) <= _FLOAT:
        return value   # (optimizers' per-tensor step sizes and bias corrections)
    if not isinstance(value, (list, tuple)):   # one number: checked once
        return [float(value)] * count if _is_number(value) else None
    values = list(value)
    if len(values) != count or not all(map(_is_number, values)):
        return None
    return [float(v) for v in values]


def _launch(expr: str, outs: Sequence[torch.Tensor], inputs: Sequence[Sequence[Any]],
            params: Sequence[list[float]], known: tuple[Sequence[Any], list] | None = None) -> bool:
    """Run ``expr`` over the lists when the multi-tensor path applies (module docstring); False if not.
    ``known``: an input list whose pairs were already found, with them (inputs of fresh outputs, which
    share no storage with them)."""
    out_pairs = buffer_pairs(outs)
    if out_pairs is None:
        return False
    columns: list[list[Any]] = []
    single = []
    for column in inputs:
        one = False
        if column and isinstance(column[0], torch.Tensor):
            if len(column) != len(outs):
                return False
            if known is not None and column is known[0]:
                pairs = known[1]
            else:
                pairs = column is outs and out_pairs or buffer_pairs(column, outs)
            if pairs is None and columns and (pairs := _single_elements(column, outs)) is not None:
                one = True   # (not the first input: it is self, whose shape is the output's)
            if pairs is None:
                return False
            columns.append(pairs)
        else:
            columns.append(list(column))
        single.append(one)
    state.get().optim.map(expr, out_pairs, columns, params, [o.numel() for o in outs], single)
    return True


def _single_elements(column: Sequence[Any], outs: Sequence[torch.Tensor]) -> list[tuple[Any, int]] | None:
    """The pairs of ``column`` when each of its tensors holds one element (a 0-dim tensor, e.g. a
    bias correction from a step count kept on the device, that broadcasts over its output) and none
    shares storage with an output; else None."""
    if not all(isinstance(t, torch.Tensor) and t.numel() == 1 for t in column):
        return None
    written = {o.untyped_storage().data_ptr() for o in outs}
    if any(t.untyped_storage().data_ptr() in written for t in column):
        return None
    return buffer_pairs(column)


def clone_all(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """Copies of ``tensors`` in one multi-tensor launch per ``Optim.slots`` of them, where the path applies
    (contiguous float32 opencl tensors); else None."""
    pairs = buffer_pairs(tensors)
    if pairs is None or not tensors:
        return None
    outs, _ = empty_dense_many(tensors)
    return outs if _launch("copy", outs, [tensors], [], (tensors, pairs)) else None


def copy_all(destinations: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> bool:
    """``d.copy_(s)`` for each pair in one multi-tensor launch per ``Optim.slots`` of them, where the path
    applies (contiguous float32 opencl tensors of equal shapes, no storage shared within a pair); False
    (nothing done) otherwise."""
    return bool(destinations) and _launch("copy", destinations, [sources], [])


# copies of _foreach_copy_ as multi-tensor kernels: True, False, or None (default): on devices other than
# CPUs (a CPU device's buffer copy is a memcpy, faster there than a kernel; elsewhere the launches count)
COPY_KERNELS: bool | None = None


def _foreach_copy_(self: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False) -> None:
    """``self[k].copy_(src[k])`` for every k: the pairs the multi-tensor path takes (contiguous float32
    tensors of one shape sharing no storage; the copy-backs of a compiled graph's mutated inputs) in one
    launch per ``Optim.slots`` (see :data:`COPY_KERNELS`), the others one by one, in order."""
    kernels = COPY_KERNELS if COPY_KERNELS is not None else state.get().device.fingerprint.device_type != "cpu"
    fast = [k for k, (d, s) in enumerate(zip(self, src))
            if kernels and d.dtype is s.dtype is torch.float32 and d.shape == s.shape and d.device == s.device]
    if len(self) != len(src) or not fast or not copy_all([self[k] for k in fast], [src[k] for k in fast]):
        fast = []
    done = set(fast)
    for k, (d, s) in enumerate(zip(self, src)):
        if k not in done:
            d.copy_(s, non_blocking)


def _add_counts(self: list[torch.Tensor], scalar: Any) -> bool:
    """``t.add_(scalar)`` for every t in one launch per ``Optim.slots`` of them, where every t is a contiguous
    int64 opencl tensor over a storage of its own and ``scalar`` an int (a compiled graph's batch-norm step
    counts, grouped by :mod:`tunecl.backend.step_counts`); False (nothing done) otherwise."""
    if type(scalar) is not int or not self:
        return False
    pairs, numels, seen = [], [], set()
    for t in self:
        if not isinstance(t, torch.Tensor) or t.dtype is not torch.int64 or not t.is_contiguous():
            return False
        if not t.numel():
            continue
        address = t.untyped_storage().data_ptr()
        buffer = _buffers.get(address, _MISSING)
        if buffer is _MISSING or buffer is None or address in seen:
            return False
        seen.add(address)
        pairs.append((buffer, t.storage_offset()))
        numels.append(t.numel())
    if pairs:
        state.get().optim.add_counts(pairs, numels, scalar)
    return True


def _foreach_pow_scalar_and_tensor(self: Any, exponent: list[torch.Tensor]) -> list[torch.Tensor]:
    """``[self ** e for e in exponent]`` (a number to tensor powers: Adam's bias corrections from step
    counts kept on the device) in one launch per ``Optim.slots`` tensors where the path applies."""
    if _is_number(self) and exponent and (pairs := buffer_pairs(exponent)) is not None:
        outs, _ = empty_dense_many(exponent)
        if _launch("pow", outs, [[float(self)] * len(exponent), exponent], [], (exponent, pairs)):
            return outs
    return torch.ops.aten._foreach_pow.ScalarAndTensor._op_dk(_GENERIC, self, exponent)


def _op(name: str) -> torch._ops.OpOverload:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _adapter(name: str, expr: str, arrange: Callable[..., tuple[list, list] | None]) -> Callable[..., Any]:
    """The kernel for overload ``name``: ``arrange(self, *args, **kwargs)`` gives (inputs after self,
    params) for ``expr``, or None when they are not numbers where numbers are expected. In-place
    overloads (``_foreach_add_``) write ``self``; the others return new tensors."""
    op = _op(name)
    in_place = name.partition(".")[0].endswith("_")

    def kernel(self: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        arranged = arrange(len(self), *args, **kwargs)
        if arranged is not None and self and foreach_runs.can_join():
            more, params = arranged
            if in_place:
                if foreach_runs.join(expr, True, self, more, params):
                    return None
            elif (fresh := _fresh_outputs(self)) is not None and foreach_runs.join(expr, False, self, more, params,
                                                                                   fresh):
                return fresh[0]
        foreach_runs.flush()
        if arranged is not None and self:
            more, params = arranged
            inputs = ([self] if expr != "fill" else []) + more
            outs = optim_calls.foreach_map(name, expr, in_place, self, inputs, params)
            if outs is not None:
                return None if in_place else outs
            known = None
            if in_place:
                outs = self
            elif (self_pairs := buffer_pairs(self)) is not None:
                # contiguous float32 opencl tensors: outputs straight from memory, self's pairs known
                outs, _ = empty_dense_many(self)
                known = (self, self_pairs)
            else:
                outs = None
            if outs is not None and _launch(expr, outs, inputs, params, known):
                return None if in_place else outs
        return op._op_dk(_GENERIC, self, *args, **kwargs)

    return kernel


def _fresh_outputs(self: list[torch.Tensor]) -> tuple[list[torch.Tensor], list] | None:
    """New outputs of ``self``'s layout and their buffers, for a functional call joining a run (None where
    ``self`` is not a list of contiguous float32 tensors: the call cannot join)."""
    if not all(isinstance(t, torch.Tensor) and t.dtype is torch.float32 and t.is_contiguous() and t.numel()
               for t in self):
        return None
    return empty_dense_many(self)


def _scalar_operand(count: int, scalar: Any) -> tuple[list, list] | None:        # a (op) scalar
    numbers = _numbers(scalar, count)
    return None if numbers is None else ([numbers], [])


def _list_operand(count: int, other: list[torch.Tensor]) -> tuple[list, list]:   # a (op) other
    return [other], []


def _scaled_scalar(count: int, scalar: Any) -> tuple[list, list] | None:         # a ± 1*scalar
    numbers = _numbers(scalar, count)
    return None if numbers is None else ([numbers], [[1.0] * count])


def _scaled_list(count: int, other: list[torch.Tensor], *, alpha: Any = 1) -> tuple[list, list] | None:
    numbers = _numbers(alpha, count)                                               # a ± alpha*other
    return None if numbers is None else ([other], [numbers])


def _pointwise_with(count: int, tensor1: list[torch.Tensor], tensor2: list[torch.Tensor],
                    value: Any = 1) -> tuple[list, list] | None:                   # a + value*t1 (*|/) t2
    numbers = _numbers(value, count)
    return None if numbers is None else ([tensor1, tensor2], [numbers])


def _lerp_scalar(count: int, end: list[torch.Tensor], weight: Any) -> tuple[list, list] | None:
    numbers = _numbers(weight, count)
    return None if numbers is None else ([end], [numbers])


def _lerp_list(count: int, end: list[torch.Tensor], weights: list[torch.Tensor]) -> tuple[list, list]:
    return [end, weights], []


def _scalar_param(count: int, scalar: Any) -> tuple[list, list] | None:          # clamp(a, scalar)
    numbers = _numbers(scalar, count)
    return None if numbers is None else ([], [numbers])


def _nothing(count: int) -> tuple[list, list]:
    return [], []


def _zero(count: int) -> tuple[list, list]:
    return [], [[0.0] * count]


def _overloads() -> dict[str, tuple[str, Callable[..., Any]]]:
    """Each functional ``_foreach_*`` overload's pointwise expression and how it arranges its operands
    (``add.Scalar``, ..., ``sqrt`` for ``.default``)."""
    overloads: dict[str, tuple[str, Callable[..., Any]]] = {}
    for op in ("add", "sub"):
        overloads[f"{op}.Scalar"] = (op, _scaled_scalar)
        overloads[f"{op}.ScalarList"] = (op, _scaled_scalar)
        overloads[f"{op}.List"] = (op, _scaled_list)
    for op in ("mul", "div"):
        overloads[f"{op}.Scalar"] = (op, _scalar_operand)
        overloads[f"{op}.ScalarList"] = (op, _scalar_operand)
        overloads[f"{op}.List"] = (op, _list_operand)
    for op in ("maximum", "minimum"):
        overloads[f"{op}.List"] = (op, _list_operand)
    for op in ("clamp_min", "clamp_max"):
        overloads[f"{op}.Scalar"] = (op, _scalar_param)
    for op in ("addcmul", "addcdiv"):
        overloads[f"{op}.Scalar"] = (op, _pointwise_with)
        overloads[f"{op}.ScalarList"] = (op, _pointwise_with)
    overloads["lerp.Scalar"] = ("lerp", _lerp_scalar)
    overloads["lerp.List"] = ("lerp_tensor", _lerp_list)
    for op in ("sqrt", "neg", "abs", "exp", "log", "reciprocal"):
        overloads[op] = (op, _nothing)
    return overloads


OVERLOADS = _overloads()


def arranged(overload: str, count: int, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[str, list, list] | None:
    """For a call of the functional or in-place ``_foreach_`` ``overload`` (``add.Scalar``, ``sqrt``) over
    ``count`` tensors with the operands after ``self``: its expression, the inputs after ``self`` (tensor
    lists, or one number per tensor) and its parameters (one number per tensor each); None where the
    operands are not of the forms the multi-tensor path takes."""
    entry = OVERLOADS.get(overload)
    if entry is None:
        return None
    expr, arrange = entry
    try:
        result = arrange(count, *args, **kwargs)
    except TypeError:
        return None
    return None if result is None else (expr, *result)


# the kernels that may join a pending run of foreach calls (tunecl.backend.foreach_runs): the registration
# launches a pending run before every other kernel
JOINABLE: set[str] = set()


def _table() -> dict[str, Callable[..., Any]]:
    table: dict[str, Callable[..., Any]] = {}
    for overload, (expr, arrange) in OVERLOADS.items():
        base, dot, rest = overload.partition(".")
        for name in (f"_foreach_{base}_{dot}{rest}", f"_foreach_{base}{dot}{rest}"):
            table[name] = _adapter(name, expr, arrange)
    float_add_ = table["_foreach_add_.Scalar"]
    table["_foreach_add_.Scalar"] = lambda self, scalar: None if _add_counts(self, scalar) else float_add_(self, scalar)
    table["_foreach_zero_"] = _adapter("_foreach_zero_", "fill", _zero)
    JOINABLE.update(table)   # (the adapters: each joins a pending run or launches it first)
    table["_foreach_copy_"] = _foreach_copy_
    table["_foreach_pow.ScalarAndTensor"] = _foreach_pow_scalar_and_tensor
    return table


KERNELS: dict[str, Callable[..., Any]] = _table()
