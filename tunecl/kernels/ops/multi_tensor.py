"""The arguments of a multi-tensor launch (``optim.cl``'s adam_step, sgd_step, foreach_map), by column.

One launch updates up to ``slots`` tensors. Tensor k has a pointer per *column* (param, grad, exp_avg, ...,
or foreach_map's o, a, b, c), each with an element offset, and ``numels[k]`` elements; a call over ``count``
tensors is ``ceil(count / slots)`` launches (*chunks*). Each chunk's arguments are, in order: the *head*
(by-value scalars shared by every chunk, or foreach_map's per-slot numbers), the packed ``meta`` (per slot:
n, then each column's offset; zeros for unused slots), the pointers slot by slot (NULL for unused slots and
absent operands), then the *tail*: a (pointer, int64 offset) pair per one-element tensor the kernel reads.

:class:`Chunks` holds what a call signature fixes (kernel, grid, numels) and what changes rarely (offsets,
scalars, numbers), never the buffers (a call passes its own, so no buffer outlives its tensors here).
:meth:`Chunks.launch` launches through the kernel's pyopencl invoker; after :meth:`Chunks.prebuild` each
chunk also has a copy of the kernel with its arguments set (:func:`tunecl.kernels.launches.preset_kernel`),
and a call binds only what changed (:meth:`bind`, :meth:`bind_tail`; offsets and numbers are set at the
next :meth:`enqueue`) and enqueues the copies without argument conversion: the same launches, bit for bit.

*By address*: where the device lets kernels reach buffers by their addresses
(:mod:`tunecl.runtime.addresses`), the copies are of the kernel's ``ADDRESSES`` variant, which has no pointer
arguments: each meta entry holds its tensor's address (the buffer's address plus the offset in bytes), so
binding a column writes numbers into the meta and a launch sets one by-value argument however many tensors
it updates. The tail stays pointer arguments. :meth:`launch` (a graph capture, a profile, a signature's
first call) keeps the pointer variant.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl.kernels.launches import preset_kernel
from tunecl.runtime import addresses as _addresses

_enqueue = cl.enqueue_nd_range_kernel
_INT64 = struct.Struct("q")


class Chunks:
    """One multi-tensor call signature's launches (see the module docstring)."""

    __slots__ = (
        "_addresses_of",
        "_by_address",
        "_dirty",
        "_lock",
        "_pointers",
        "_positions",
        "address_kernel",
        "bases",
        "columns",
        "count",
        "global_sizes",
        "head",
        "head_types",
        "itemsize",
        "kernel",
        "launched",
        "local",
        "meta",
        "presets",
        "slots",
        "tail",
        "values",
    )

    def __init__(self, kernel: cl.Kernel, slots: int, local: int, items: int, numels: Sequence[int], columns: int,
                 head: Sequence[float | int] = (), head_types: str = "", values: int = 0, tail: int = 0,
                 empty_items: int = 0, itemsize: int = 4,
                 by_address: Callable[[], tuple[cl.Kernel, Callable[[Sequence[Any]], list[int]]] | None] | None = None
                 ) -> None:
        """``head``/``head_types``: the shared scalars and their struct type characters ('f', 'i'; 'b': bytes, a
        by-value struct); ``values``:
        numbers per slot of a per-chunk head struct of floats instead (foreach_map: 5); ``tail``: one-element
        tensors read by the kernel; ``items``: work-items per slot at most; ``empty_items``: the work-items of
        a chunk whose tensors are all empty; ``itemsize``: bytes per element of the columns' tensors;
        ``by_address``: a function giving the kernel's ADDRESSES variant and the function giving buffers'
        addresses (None where the device does not allow it), asked by :meth:`prebuild` (see the module
        docstring)."""
        self.kernel, self.slots, self.local, self.columns = kernel, slots, local, columns
        self.count = count = len(numels)
        chunks = -(-count // slots)
        self.meta = np.zeros((chunks * slots, 1 + columns), np.int64)
        self.meta[:count, 0] = numels
        self.global_sizes = []
        for start in range(0, count, slots):
            sizes = numels[start:start + slots]
            n = min(max(sizes), items) or empty_items
            self.global_sizes.append((-(-n // local) * local, len(sizes)))
        self.head, self.head_types = list(head), head_types
        self.values = np.zeros((chunks * slots, values), np.float32) if values else None
        self.tail = [0] * tail             # the tail tensors' offsets
        self.itemsize = itemsize
        self._by_address = by_address
        self.address_kernel: cl.Kernel | None = None
        self._addresses_of: Callable[[Sequence[Any]], list[int]] | None = None
        # by address (from prebuild): each tensor's buffer address per column (0: none)
        self.bases: np.ndarray | None = None
        self._pointers = slots * columns   # the copies' pointer arguments
        self.presets: list[cl.Kernel] | None = None
        self._dirty = False                # by-value arguments changed since the presets were set
        self._positions: dict[tuple, list[int]] = {}   # columns -> their pointers' argument positions
        self._lock = threading.Lock()
        self.launched = 0                  # calls of launch() so far

    # -- what changes rarely -------------------------------------------------------------------------
    def set_offsets(self, column: int, offsets: Sequence[int]) -> None:
        self.meta[:self.count, 1 + column] = offsets
        self._dirty = True

    def set_head(self, head: Sequence[float | int]) -> None:
        self.head = list(head)
        self._dirty = True

    def set_values(self, index: int, numbers: Sequence[float]) -> None:
        self.values[:self.count, index] = numbers
        self._dirty = True

    def set_tail_offset(self, index: int, offset: int) -> None:
        self.tail[index] = offset
        self._dirty = True

    # -- launching through the invoker ----------------------------------------------------------------
    def arguments(self, chunk: int, buffers: Sequence[Sequence[Any]], tail: Sequence[Any] = (),
                  meta: np.ndarray | None = None) -> list:
        """Chunk ``chunk``'s full argument list with ``buffers`` (one list per column, one buffer or None per
        tensor) and ``tail`` (the tail tensors' buffers); with ``meta`` (the meta of addresses, see
        :meth:`_address_meta`) the by-address variant's: that meta and no pointers."""
        slots, columns = self.slots, self.columns
        start = chunk * slots
        stop = min(start + slots, self.count)
        if self.values is None:
            args = list(self.head)
        else:
            args = [self.values[start:start + slots].tobytes()]
        args.append((self.meta if meta is None else meta)[start:start + slots].tobytes())
        if meta is None:
            pointers = [None] * (slots * columns)
            for column, column_buffers in enumerate(buffers):
                pointers[column:(stop - start) * columns:columns] = column_buffers[start:stop]
            args += pointers
        for buffer, offset in zip(tail, self.tail):
            args += (buffer, offset)
        return args

    def _address_meta(self) -> np.ndarray:
        """The meta with each tensor's address (its buffer's, plus its offset in bytes; 0 for none)."""
        meta = self.meta.copy()
        bases = self.bases
        meta[:, 1:] = np.where(bases != 0, bases + meta[:, 1:] * self.itemsize, 0)
        return meta

    def launch(self, queue_of: Any, buffers: Sequence[Sequence[Any]], tail: Sequence[Any] = ()) -> None:
        """Launch every chunk through the kernel's invoker (``queue_of()`` gives the queue for each)."""
        self.launched += 1
        kernel, local = self.kernel, (self.local, 1)
        for chunk, global_size in enumerate(self.global_sizes):
            kernel(queue_of(), global_size, local, *self.arguments(chunk, buffers, tail))

    # -- pre-built copies -----------------------------------------------------------------------------
    def prebuild(self, buffers: Sequence[Sequence[Any]], tail: Sequence[Any] = ()) -> bool:
        """Give each chunk a kernel copy with its arguments set (``buffers`` and ``tail`` as for
        :meth:`arguments`); False (nothing built) for a kernel that cannot be copied so."""
        if self._by_address is not None:
            found, self._by_address = self._by_address(), None
            if found is not None:
                self.address_kernel, self._addresses_of = found
                self.bases = np.zeros((len(self.meta), self.columns), np.int64)
                self._pointers = 0
        kernel, meta = self.kernel, None
        if self.address_kernel is not None:
            for column, column_buffers in enumerate(buffers):
                self.bases[:self.count, column] = self._addresses_of(column_buffers)
            _addresses.launched = True
            kernel, meta = self.address_kernel, self._address_meta()
        presets = []
        for chunk in range(len(self.global_sizes)):
            preset = preset_kernel(kernel, self.arguments(chunk, buffers, tail, meta))
            if preset is None:
                return False
            presets.append(preset)
        self.presets = presets
        self._dirty = False
        return True

    def bind(self, columns: Sequence[int], buffers: Sequence[Any]) -> None:
        """Set the pointers of ``columns`` (column indices; several when they take the same buffers) of every
        copy to ``buffers`` (one per tensor)."""
        slots, width, count = self.slots, self.columns, self.count
        columns = tuple(columns)
        if self.bases is not None:
            found = self._addresses_of(buffers)
            with self._lock:
                for column in columns:
                    self.bases[:count, column] = found
                self._dirty = True
            return
        positions = self._positions.get(columns)
        if positions is None:   # per tensor, per column
            head = (1 if self.values is not None else len(self.head)) + 1
            positions = self._positions[columns] = [head + (k % slots) * width + column
                                                    for k in range(count) for column in columns]
        per_tensor = len(columns)
        binding: list[Any] = [None] * (2 * count * per_tensor)
        binding[0::2] = positions
        binding[1::2] = buffers if per_tensor == 1 else list(chain.from_iterable(zip(*[buffers] * per_tensor)))
        flat = tuple(binding)
        step = 2 * slots * per_tensor
        with self._lock:
            for chunk, preset in enumerate(self.presets):
                preset._set_arg_multi(flat[chunk * step:(chunk + 1) * step])

    def bind_tail(self, index: int, buffer: Any) -> None:
        """Set tail tensor ``index``'s pointer of every copy."""
        position = (1 if self.values is not None else len(self.head)) + 1 + self._pointers + 2 * index
        with self._lock:
            for preset in self.presets:
                preset._set_arg_multi((position, buffer))

    def _set_by_value(self) -> None:   # with the lock held
        slots = self.slots
        raw: list[Any] = []
        if self.values is None:
            head = len(self.head)
            packed: list[Any] = []
            for position, (kind, value) in enumerate(zip(self.head_types, self.head)):
                if kind == "b":
                    raw += (position, value)
                else:
                    packed += (position, kind.encode(), value)
            packed = tuple(packed)
        else:
            head = 1
        tail = []
        for index, offset in enumerate(self.tail):
            tail += (head + 2 + self._pointers + 2 * index, _INT64.pack(offset))
        tail = tuple(tail)
        meta = self.meta if self.bases is None else self._address_meta()
        values = self.values
        for chunk, preset in enumerate(self.presets):
            start = chunk * slots
            if values is None:
                if packed:
                    preset._set_arg_buf_pack_multi(packed)
                if raw:
                    preset._set_arg_buf_multi(tuple(raw))
            else:
                preset._set_arg_buf_multi((0, values[start:start + slots].tobytes()))
            preset._set_arg_buf_multi((head, meta[start:start + slots].tobytes()))
            if tail:
                preset._set_arg_buf_multi(tail)
        self._dirty = False

    def enqueue(self, queue_of: Any) -> None:
        """Enqueue every copy (after :meth:`prebuild`), with the offsets, scalars and numbers set since."""
        local = (self.local, 1)
        with self._lock:
            if self._dirty:
                self._set_by_value()
            for preset, global_size in zip(self.presets, self.global_sizes):
                _enqueue(queue_of(), preset, global_size, local)
