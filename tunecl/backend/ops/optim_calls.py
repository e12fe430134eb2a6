"""Pre-built multi-tensor calls: the fused optimizer steps and the ``_foreach_*`` ops, bound once per signature.

An optimizer makes the same calls on the same tensors every step. A call's *signature* (the op and its
flags, which operands are tensors, the number of tensors and each one's numel) fixes its launches
(:class:`tunecl.kernels.ops.multi_tensor.Chunks`: kernel, grid, chunking); they are built on the signature's
second call, as kernel copies with every argument set. A call then checks, per tensor list, what may have
changed since the last one and binds only that:

- the ``data_ptr()`` of every tensor. A storage's address is unique and never reused
  (:mod:`tunecl.backend.memory`), so an unchanged data_ptr is the same storage, buffer and element offset.
  A list with any change (``p.data = other``, a parameter added, new gradients, fresh temporaries, a
  loaded state dict) is validated as the general route validates it (contiguous float32 opencl tensors,
  each input its output or sharing no storage with it) and its pointers and offsets are bound anew. The
  lists found valid are remembered by their data_ptrs, so a list several calls take (fresh gradients, a
  temporary list one call made) is checked once and only against each call's outputs after that;
- the numel of every tensor (a tensor resized in place keeps its data_ptr);
- the scalars and per-tensor numbers (a learning rate a scheduler changed, bias corrections), and the
  data_ptrs of the one-element tensors a fused step reads (learning rate, ``grad_scale``, ``found_inf``:
  their values are read by the kernel, so changing them in place needs nothing).

The same data_ptr can also be another view of the same storage at the same offset (``p.t()``,
``p.view(torch.int32)``), so a list taken on its data_ptrs is still checked to hold contiguous float32
tensors (about 16 us for 161 tensors on a desktop core). Calls with an empty tensor (its data_ptr need not be unique) and
calls while a graph capture or a KernelProfile watches pyopencl's launch function take the general route,
which launches the same kernels through pyopencl (so a capture records them). The tables live on the
backend State's Optim (a new State starts empty) and are bounded (:data:`MAX_CALLS`, :data:`MAX_LISTS`).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import torch

from tunecl import profiling
from tunecl.backend import state
from tunecl.backend.allocator import buffers as _buffers
from tunecl.backend.memory import empty_dense_many

MAX_CALLS = 256
MAX_LISTS = 64
_FLOAT32 = torch.float32
_Tensor = torch.Tensor
_data_ptr = torch.Tensor.data_ptr
_numel = torch.Tensor.numel
_MISSING = object()
_ONLY_FLOAT32 = {_FLOAT32}
_dtype = operator.attrgetter("dtype")
_shape = operator.attrgetter("shape")
_is_contiguous = torch.Tensor.is_contiguous
_storage_offset = torch.Tensor.storage_offset
_minus = operator.sub
_times4 = (4).__mul__
_swap_lock = profiling.swap_lock


class _Call:
    """One signature's launches and what they were last bound to: per column the data_ptrs (None: not
    bound yet, or a column without tensors) and offsets, the head scalars, the numbers, the tail's
    data_ptrs."""

    __slots__ = ("chunks", "head", "numbers", "numels", "offsets", "own_numels", "ptrs", "seen", "tail")

    def __init__(self, chunks: Any, numels: list[int], columns: int, numbers: int = 0, tail: int = 0) -> None:
        self.chunks, self.numels = chunks, numels
        self.own_numels: list[int] | None = None   # of the column bound with own_numels (step counts)
        self.ptrs: list[list[int] | None] = [None] * columns
        self.offsets: list[list[int] | None] = [None] * columns
        self.head: tuple | None = None
        self.numbers: list[list[float] | None] = [None] * numbers
        self.tail: list[int | None] = [None] * tail
        self.seen = False   # called once already (the launches are built on the second call)

    def set_offsets(self, column: int, offsets: list[int]) -> None:
        if offsets != self.offsets[column]:
            self.chunks.set_offsets(column, offsets)
            self.offsets[column] = offsets

    def set_numbers(self, index: int, numbers: list[float]) -> None:
        if numbers != self.numbers[index]:
            self.chunks.set_values(index, numbers)
            self.numbers[index] = list(numbers)   # (a copy: the caller may change its list)

    def set_head(self, head: tuple) -> None:
        if head != self.head:
            self.chunks.set_head(head)
            self.head = head


def _keep(calls: dict[tuple, _Call], key: tuple, call: _Call) -> _Call:
    if len(calls) >= MAX_CALLS:   # a safety valve for ever-changing signatures
        calls.clear()
    calls[key] = call
    return call


def _column(tensors: Sequence[torch.Tensor], numels: list[int] | None, outs: _Outs | None, ptrs: list[int],
            lists: dict[tuple, tuple]) -> tuple[list, list[int], list[int]] | None:
    """(buffers, element offsets, storage addresses) of ``tensors`` (data_ptrs ``ptrs``) when each is a
    contiguous float32 opencl tensor of the signature's numel (``numels`` None: of any but 0) and, given
    ``outs``, of its output's shape and either exactly its output or sharing no storage with it; else None.
    The general route's checks (:func:`tunecl.backend.ops.foreach.buffer_pairs`), a pass over the list per
    property.

    A data_ptr that is some storage's address (a key of ``_buffers``) is that of the tensor's own storage
    at offset 0: storages' address ranges never overlap and a tensor with elements points into its own
    (so the common list, every tensor at the start of its storage, needs no pass over the offsets).

    ``lists`` keeps the lists found valid by their data_ptrs, so a list that several calls take (the
    gradients, a temporary list one call made and the next ones read) is checked once: the same data_ptrs
    are the same storages at the same offsets; the tensors' dtype, contiguity and numels are checked again
    (the same data_ptr can be another view: see the module docstring)."""
    key = tuple(ptrs)
    found = lists.get(key)
    buffers = None
    if found is not None:
        if not _dense_float32(tensors) or (list(map(_numel, tensors)) != numels if numels is not None
                                           else 0 in map(_numel, tensors)):
            return None
        offsets, addresses = found
        buffers = list(map(_buffers.get, addresses, repeat(_MISSING, len(addresses))))
        if _MISSING in buffers:   # (a storage just died; its tensor cannot be among these)
            buffers = None
    if buffers is None:
        found = _valid(tensors, numels, ptrs)
        if found is None:
            return None
        buffers, offsets, addresses = found
        _remember(lists, key, (offsets, addresses))
    if outs is not None and outs.tensors is not tensors:
        if list(map(_shape, tensors)) != outs.shapes():
            return None
        if not set(addresses).isdisjoint(outs.addresses):   # some storage shared: the exact rule, per tensor
            for t, out, address, offset, out_address, out_offset in zip(tensors, outs.tensors, addresses, offsets,
                                                                        outs.addresses, outs.offsets):
                if out is not t and address == out_address and offset != out_offset:
                    return None
    return buffers, offsets, addresses


def dense_column(tensors: Sequence[torch.Tensor], numels: list[int] | None, ptrs: list[int]
                 ) -> tuple[list, list[int], list[int]] | None:
    """(buffers, element offsets, storage addresses) of a list of contiguous float32 opencl tensors of
    ``numels`` (None: of any but 0) whose data_ptrs are ``ptrs``, checked as :func:`_column` checks a call's
    column (a list seen before by its data_ptrs, cheaply); None for any other list."""
    return _column(tensors, numels, None, ptrs, state.get().optim.lists)


def remember_fresh(tensors: Sequence[torch.Tensor], ptrs: list[int]) -> None:
    """Note a list of fresh contiguous float32 tensors (new storages, data_ptrs ``ptrs``) as valid, so the
    calls that read it next find it without a pass over its tensors."""
    _remember(state.get().optim.lists, tuple(ptrs), ([0] * len(ptrs), ptrs))


def _remember(lists: dict[tuple, tuple], key: tuple, found: tuple) -> None:
    while len(lists) >= MAX_LISTS:   # lists of fresh tensors come every step: the oldest go
        del lists[next(iter(lists))]
    lists[key] = found


def _dense_float32(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every tensor is float32 and contiguous (what a data_ptr alone cannot say)."""
    return set(map(_dtype, tensors)) == _ONLY_FLOAT32 and all(map(_is_contiguous, tensors))


def _valid(tensors: Sequence[torch.Tensor], numels: list[int] | None, ptrs: list[int]) -> tuple | None:
    """(buffers, element offsets, storage addresses) of a list :func:`_column` takes, else None."""
    if (not _dense_float32(tensors)
            or (list(map(_numel, tensors)) != numels if numels is not None else 0 in map(_numel, tensors))):
        return None
    buffers = list(map(_buffers.get, ptrs, repeat(_MISSING, len(ptrs))))
    if _MISSING in buffers:   # some tensor at an offset into its storage (or not an opencl storage)
        offsets = list(map(_storage_offset, tensors))
        # a storage's address is the data_ptr less the offset's bytes (float32: 4 per element)
        addresses = list(map(_minus, ptrs, map(_times4, offsets)))
        buffers = list(map(_buffers.get, addresses, repeat(_MISSING, len(addresses))))
        if _MISSING in buffers:   # not an opencl storage
            return None
    else:
        offsets = [0] * len(ptrs)
        addresses = ptrs
    return buffers, offsets, addresses


class _Outs:
    """A call's output list with the storage addresses and offsets its binding found, and its shapes once
    asked for (each input column is checked against them)."""

    __slots__ = ("_shapes", "addresses", "offsets", "tensors")

    def __init__(self, tensors: Sequence[torch.Tensor], ptrs: list[int], offsets: list[int]) -> None:
        self.tensors, self.offsets = tensors, offsets
        self.addresses = list(map(_minus, ptrs, map(_times4, offsets))) if any(offsets) else ptrs
        self._shapes: list | None = None

    def shapes(self) -> list:
        if self._shapes is None:
            self._shapes = list(map(_shape, self.tensors))
        return self._shapes


_FAILED = None


def _bind(call: _Call, column: int, tensors: Sequence[Any], outs: _Outs | None, fresh: list,
          force: bool = False, numels_known: bool = False, own_numels: bool = False) -> bool | None:
    """Bind column ``column`` to ``tensors`` where their data_ptrs changed (or ``force``: its outputs
    changed), adding (column, buffers) to ``fresh`` for :func:`_launch`; an unchanged column's numels are
    checked unless ``numels_known``. ``own_numels``: the tensors need not have the signature's numels (a
    fused step's step counts), only the same as when bound. Whether it changed; None where the general
    route must serve the call."""
    ptrs = list(map(_data_ptr, tensors))
    if ptrs == call.ptrs[column] and not force:
        if not _dense_float32(tensors):
            return _FAILED
        if numels_known:
            return False
        expected = call.own_numels if own_numels else call.numels
        return False if list(map(_numel, tensors)) == expected else _FAILED
    found = _column(tensors, None if own_numels else call.numels, outs, ptrs, state.get().optim.lists)
    if own_numels and found is not None:
        call.own_numels = list(map(_numel, tensors))
    if found is None:
        call.ptrs[column] = None
        return _FAILED
    buffers, offsets, _ = found
    call.set_offsets(column, offsets)
    call.ptrs[column] = ptrs
    fresh.append(([column], buffers))
    return True


def _launch(call: _Call, fresh: list, columns: int, tail: list | None = None) -> None:
    """Launch a bound call: build its kernel copies on its second call (binding every column), bind the
    ``fresh`` columns of later calls (a list of (columns, buffers)), enqueue."""
    chunks = call.chunks
    optim = state.get().optim
    if chunks.presets is not None:
        for bound, buffers in fresh:
            chunks.bind(bound, buffers)
        if tail:
            for index, buffer in tail:
                chunks.bind_tail(index, buffer)
        chunks.enqueue(optim.queue)
        return
    # every column was bound in this call (none had data_ptrs yet)
    by_column: list[Any] = [None] * columns
    for bound, buffers in fresh:
        for column in bound:
            by_column[column] = buffers
    by_column = [b if b is not None else [None] * chunks.count for b in by_column]
    tail_buffers = [buffer for _, buffer in tail or ()]
    if call.seen and chunks.prebuild(by_column, tail_buffers):
        chunks.enqueue(optim.queue)
        return
    call.seen = True
    call.ptrs = [None] * len(call.ptrs)   # (the next call binds every column again, to build the copies)
    call.tail = [None] * len(call.tail)
    chunks.launch(optim.queue, by_column, tail_buffers)


# -- the _foreach_* ops ---------------------------------------------------------------------------------
def foreach_map(name: str, expr: str, in_place: bool, self: list[torch.Tensor], inputs: Sequence[Sequence[Any]],
                params: Sequence[list[float]]) -> list[torch.Tensor] | None:
    """``expr`` over the lists by a pre-built call: the outputs (``self`` for an in-place op); None where
    the general route must serve the call. ``inputs``: tensor lists or per-tensor number lists (a, b, c);
    ``params``: per-tensor numbers (s0, s1)."""
    if _swap_lock.locked():
        return None
    numels = list(map(_numel, self))
    kinds = tuple(bool(column) and isinstance(column[0], _Tensor) for column in inputs)
    key = (name, kinds, len(params), tuple(numels))
    optim = state.get().optim
    call = optim.calls.get(key)
    if call is None:
        if 0 in numels:
            return None
        call = _keep(optim.calls, key, _Call(optim.map_chunks(expr, kinds, len(params), numels), numels, 4,
                                             numbers=5))
    if call.chunks.presets is None:
        call.ptrs = [None] * 4
    fresh: list = []
    if in_place:
        outs = self
        changed = _bind(call, 0, outs, None, fresh, numels_known=True)
        if changed is None:
            return None
    else:
        if kinds[0] and _bind(call, 1, self, None, fresh) is None:   # self is input a: checked before allocating
            return None
        outs, buffers = empty_dense_many(self)
        ptrs = list(map(_data_ptr, outs))
        offsets = [0] * len(outs)
        call.set_offsets(0, offsets)
        call.ptrs[0] = ptrs
        fresh.append(([0], buffers))
        if kinds[0]:   # contiguous float32 tensors of the signature's numels, as self: valid for the calls that read them
            _remember(optim.lists, tuple(ptrs), (offsets, ptrs))   # (fresh storages: their data_ptrs are their addresses)
        changed = False   # (fresh outputs share no storage with any input)
    out_bound = fresh[-1] if fresh and fresh[-1][0][0] == 0 else None
    outs_found = None
    for index in range(3):
        column = inputs[index] if index < len(inputs) else None
        if index < len(kinds) and kinds[index] and column is not outs:
            if index == 0 and not in_place:
                continue
            if outs_found is None:
                outs_found = _Outs(outs, call.ptrs[0], call.offsets[0])
            if len(column) != len(outs) or _bind(call, 1 + index, column, outs_found, fresh, force=changed) is None:
                return None
            continue
        if out_bound is not None:   # an unused pointer (or the output itself) points at the output
            call.set_offsets(1 + index, call.offsets[0])
            out_bound[0].append(1 + index)
        if column is not None and not kinds[index]:
            call.set_numbers(index, column)
    for index, numbers in enumerate(params):
        call.set_numbers(3 + index, numbers)
    _launch(call, fresh, 4)
    return outs


# -- the fused optimizer steps ----------------------------------------------------------------------------
def _tail(call: _Call, tensors: Sequence[torch.Tensor | None]) -> list | None:
    """Bind the one-element tensors a fused step reads (lr, grad_scale, found_inf, those present, in that
    order): (index, buffer) of each that changed; None where one is not a one-element float32 opencl tensor."""
    fresh = []
    for index, t in enumerate(t for t in tensors if t is not None):
        ptr = t.data_ptr()
        if ptr == call.tail[index]:
            continue
        if t.dtype is not _FLOAT32 or t.numel() != 1:
            return None
        buffer = _buffers.get(t.untyped_storage().data_ptr(), _MISSING)
        if buffer is _MISSING:
            return None
        call.chunks.set_tail_offset(index, t.storage_offset())
        call.tail[index] = ptr
        fresh.append((index, buffer))
    return fresh


def _step(key: tuple, columns: Sequence[Sequence[torch.Tensor] | None], head: tuple,
          tensors: Sequence[torch.Tensor | None], build: Any, steps: int = -1) -> bool:
    """A fused step by a pre-built call (``build(numels)`` makes its Chunks; ``steps``: the column of step
    counts, if any); False where the general route must serve it."""
    if _swap_lock.locked():
        return False
    params = columns[0]
    numels = list(map(_numel, params))
    key += (tuple(numels),)
    optim = state.get().optim
    call = optim.calls.get(key)
    if call is None:
        if not params or 0 in numels:
            return False
        call = _keep(optim.calls, key, _Call(build(numels), numels, len(columns),
                                             tail=sum(t is not None for t in tensors)))
    if call.chunks.presets is None:
        call.ptrs = [None] * len(columns)
        call.tail = [None] * len(call.tail)
    fresh: list = []
    for column, tensors_of in enumerate(columns):
        if tensors_of is None:
            continue
        if len(tensors_of) != len(params) or _bind(call, column, tensors_of, None, fresh, numels_known=column == 0,
                                                   own_numels=column == steps) is None:
            return False
    tail = _tail(call, tensors)
    if tail is None:
        return False
    call.set_head(head)
    _launch(call, fresh, len(columns), tail)
    return True


def fused_adam(adamw: bool, self: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
               exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor], state_steps: list[torch.Tensor],
               lr: float | torch.Tensor, beta1: float, beta2: float, weight_decay: float, eps: float, amsgrad: bool,
               maximize: bool, grad_scale: torch.Tensor | None, found_inf: torch.Tensor | None) -> bool:
    """torch's ``_fused_adam_``/``_fused_adamw_`` by a pre-built call; False where the general route serves it
    (a learning rate as a CPU tensor among them: it is read on the host)."""
    lr_tensor = isinstance(lr, _Tensor)
    if lr_tensor and lr.device.type != "opencl":
        return False
    key = ("adam", adamw, amsgrad, maximize, lr_tensor, grad_scale is not None, found_inf is not None)
    head = (0.0 if lr_tensor else lr, beta1, beta2, weight_decay, eps)
    flags = (lr_tensor, grad_scale is not None, found_inf is not None)
    return _step(key, (self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else None, state_steps),
                 head, (lr if lr_tensor else None, grad_scale, found_inf),
                 lambda numels: state.get().optim.adam_chunks(
                     numels, lr=head[0], beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=amsgrad,
                     maximize=maximize, adamw=adamw, tensors=flags), steps=5)


def fused_sgd(self: list[torch.Tensor], grads: list[torch.Tensor], momentum_buffer_list: list[torch.Tensor],
              weight_decay: float, momentum: float, lr: float | torch.Tensor, dampening: float, nesterov: bool,
              maximize: bool, is_first_step: bool, grad_scale: torch.Tensor | None,
              found_inf: torch.Tensor | None) -> bool:
    """torch's ``_fused_sgd_`` by a pre-built call; False where the general route serves it."""
    lr_tensor = isinstance(lr, _Tensor)
    if lr_tensor and lr.device.type != "opencl":
        return False
    key = ("sgd", momentum != 0, nesterov, maximize, lr_tensor, grad_scale is not None, found_inf is not None)
    head = (0.0 if lr_tensor else lr, weight_decay, momentum, dampening, int(is_first_step))
    flags = (lr_tensor, grad_scale is not None, found_inf is not None)
    return _step(key, (self, grads, momentum_buffer_list if momentum != 0 else None), head,
                 (lr if lr_tensor else None, grad_scale, found_inf),
                 lambda numels: state.get().optim.sgd_chunks(
                     numels, lr=head[0], weight_decay=weight_decay, momentum=momentum, dampening=dampening,
                     nesterov=nesterov, maximize=maximize, first_step=is_first_step, tensors=flags))
