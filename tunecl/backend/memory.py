"""Device memory: DLPack-backed storages over a caching allocator with size classes.

Every opencl tensor is an ordinary ``torch.Tensor`` created by ``torch._C._from_dlpack`` from a
``DLManagedTensor`` with device type kDLExtDev (12), which torch maps to PrivateUse1. Its data
pointer is a *pseudo address* from a bump pointer: unique, never reused, so two live storages never
appear to overlap and ``data_ptr() - storage.data_ptr()`` stays the byte offset. The address maps to a
``cl.Buffer`` in ``_buffers``.

Freeing: the allocator keeps a weak reference to each storage and recycles the block of a storage
that has died when it next needs memory (a cache miss) or reports statistics. A DLPack deleter
callback would be immediate, but a ctypes callback that runs while a Python exception is pending
(a tensor freed during error propagation) replaces that exception with a SystemError; polling weak
references has no such failure mode. A poll costs ~0.1 µs per block, so an allocation first looks at
the newest block, then (on a cache miss) at the ``CLASS_BLOCKS`` newest blocks of the class it needs and
the ``RECENT_BLOCKS`` newest of any class (temporaries die young: the previous op's output is usually the
one to reuse), and takes a dead one of its class over as it is (buffer and DLPack slot, with a fresh
address), skipping the cache; the full sweep over every live block (weights included) runs at most once
per ``len(blocks) / 16`` allocations, and only on a miss none of those found, so it stays O(1) amortised
per allocation. (Each class's live blocks are kept in the order they were allocated or taken over:
weights and optimizer state sink to the front, so the class's newest blocks are its temporaries.)

Size classes: requests up to 1 MiB round up to a multiple of 512 B (at most 511 B wasted); larger
requests round up to a multiple of 1/16 of the power of two at or below them (under 6.25 % wasted;
power-of-two rounding wastes up to 50 %). Freed blocks are cached per class and reused for the same
class; ``empty_cache`` returns them to the driver.
"""

from __future__ import annotations

import collections
import ctypes
import struct
import threading
from collections.abc import Callable, Sequence

import pyopencl as cl
import torch

from tunecl.backend import state
from tunecl.backend.dtypes import DLPACK, check_storable

KIB, MIB = 1 << 10, 1 << 20
SMALL_LIMIT = 1 * MIB      # up to here: 512-byte granules
SMALL_GRANULE = 512
LARGE_SHIFT = 4            # above: 2**4 = 16 classes per power of two
_FIRST_ADDRESS = 1 << 56   # pseudo addresses lie above every user-space host pointer (< 2**57)
_ADDRESS_ALIGN = 256
MAX_DIMS_RECYCLED = 8      # DLPack structs with room for this many dims are recycled
RECENT_BLOCKS = 16         # a cache miss then polls this many of the newest blocks
CLASS_BLOCKS = 16          # a cache miss first polls this many of the newest blocks of the class it needs


def size_class(nbytes: int) -> int:
    """Bytes actually reserved for a request of ``nbytes`` (see the module docstring)."""
    reserved = _classes.get(nbytes)
    if reserved is not None:
        return reserved
    reserved = _size_class(nbytes)
    if len(_classes) < 4096:  # requests repeat (the same shapes every step): remember the answers
        _classes[nbytes] = reserved
    return reserved


_classes: dict[int, int] = {}


def _size_class(nbytes: int) -> int:
    if nbytes <= SMALL_LIMIT:
        return max(SMALL_GRANULE, -(-nbytes // SMALL_GRANULE) * SMALL_GRANULE)
    step = 1 << (nbytes.bit_length() - 1 - LARGE_SHIFT)
    return -(-nbytes // step) * step


def storage_nbytes(size: Sequence[int], stride: Sequence[int], itemsize: int) -> int:
    """Bytes a tensor of ``size``/``stride`` spans from its first element (0 if it has none)."""
    span = 1
    for n, s in zip(size, stride):
        if not n:
            return 0
        span += (n - 1) * s
    return span * itemsize


def contiguous_strides(size: Sequence[int]) -> list[int]:
    strides = []
    step = 1
    for n in reversed(size):
        strides.append(step)
        if n > 1:  # a size-0 dim counts as 1, as in torch
            step *= n
    strides.reverse()
    return strides


# -- DLPack structs ------------------------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_KDL_EXT_DEV = 12
# data, device (type, id), ndim, dtype (code, bits, lanes): the DLTensor's first 24 bytes, written
# in one call (three ctypes field stores cost twice as much)
_DL_HEADER = struct.Struct("=QiiiBBH")
assert (_DLTensor.device.offset, _DLTensor.ndim.offset, _DLTensor.dtype.offset, _DLTensor.shape.offset) == (8, 16, 20, 24)
_weak_ref_expired = torch.UntypedStorage._expired
_free_weak_ref = torch.UntypedStorage._free_weak_ref


class _Slot:
    """A recycled DLManagedTensor with shape/stride arrays (ctypes objects are slow to create).
    Its deleter stays NULL: blocks are reclaimed through weak references instead."""

    __slots__ = ("address", "managed", "rank", "shape", "strides", "tensor")

    def __init__(self, ndim: int):
        self.rank = ndim
        self.managed = _DLManagedTensor()
        self.shape = (ctypes.c_int64 * ndim)()
        self.strides = (ctypes.c_int64 * ndim)()
        self.tensor = tensor = self.managed.dl_tensor  # a view into managed, kept to skip lookups
        tensor.shape = self.shape
        tensor.strides = self.strides
        tensor.device = _DLDevice(_KDL_EXT_DEV, 0)
        self.address = ctypes.addressof(self.managed)


class _Block:
    """One allocation: its pseudo address (the storage's data_ptr), buffer (None when empty), class
    bytes held, bytes requested, DLPack slot, and torch's weak reference to the storage (0 until
    the storage exists)."""

    __slots__ = ("address", "buffer", "requested", "reserved", "slot", "weak")

    def __init__(self, address: int, buffer: cl.Buffer | None, reserved: int, requested: int, slot: _Slot):
        self.address, self.buffer, self.reserved, self.requested, self.slot = address, buffer, reserved, requested, slot
        self.weak = 0


def _fits(block: _Block, reserved: int, rank: int) -> bool:
    """Whether a dead ``block`` can serve a request of class ``reserved`` with a slot of ``rank`` dims as
    it is (dry-run blocks of a class above 0 have no buffer: those go through the cache instead; a buffer a
    graph replays into is never handed out again)."""
    return (block.reserved == reserved and block.slot.rank == rank and (block.buffer is not None or not reserved)
            and (not graph_buffers or id(block.buffer) not in graph_buffers))


# buffers that captured graphs (graphs.py) replay into: id -> how many live graphs hold it. Such a buffer
# never goes back to the cache or to another tensor: a replay would overwrite that tensor.
graph_buffers: dict[int, int] = {}


# -- the caching allocator -----------------------------------------------------------------------
class CachingAllocator:
    """Recycles ``cl.Buffer`` blocks by size class and keeps memory statistics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # buffers of graphs collected since the last locked call (release_from_graph_soon)
        self._pending_graph_releases: list[Sequence[cl.MemoryObjectHolder]] = []
        self._cache: dict[int, list[cl.Buffer]] = {}
        self._blocks: dict[int, _Block] = {}      # struct address -> live block
        # the same blocks by size class, each class's newest (allocated or taken over) last
        self._by_class: dict[int, dict[int, _Block]] = {}
        self._free_slots: list[_Slot] = []
        # slots of more than MAX_DIMS_RECYCLED dims, by rank: kept rather than freed, since torch reads a
        # dead storage's DLManagedTensor (its deleter field) just after the weak reference shows it
        # expired, possibly on another thread, so its memory must stay valid
        self._free_large_slots: dict[int, list[_Slot]] = {}
        self._next_address = _FIRST_ADDRESS
        self.allocated = 0      # class bytes of live blocks
        self.requested = 0      # requested bytes of live blocks
        self.cached = 0         # class bytes sitting in the cache
        self.peak_allocated = 0
        self.peak_reserved = 0
        # class bytes ever handed to storages and bytes of buffers ever created (what was freed is the
        # difference to allocated/reserved): torch.cuda's allocated_bytes/reserved_bytes ".allocated"
        self.allocated_total = 0
        self.reserved_total = 0
        self.counts = collections.Counter()
        self.reused_in_place = 0  # allocations that took a dead block over (see _take_over)
        self.reused_empty_in_place = 0  # of those, empty (0-byte) blocks: no buffer, so no cache hit
        self.graph_bytes = 0      # bytes of the buffers live graphs hold (some also belong to live tensors)
        self._allocs_since_sweep = 0
        # caches of derived tensors (weight_cache): let go of those of dead tensors before a full sweep
        # (statistics, empty_cache), of everything before an allocation fails (called with the
        # allocator's lock held: must not wait)
        self.before_sweep: list[Callable[[], None]] = []
        self.under_pressure: list[Callable[[], None]] = []

    @property
    def reserved(self) -> int:
        return self.allocated + self.cached

    # called with the lock held
    def _sweep(self) -> None:
        """Recycle the blocks whose storages have died."""
        dead = [key for key, b in self._blocks.items() if b.weak and _weak_ref_expired(b.weak)]
        self._free_dead(dead)
        self.counts["sweeps"] += 1
        self._allocs_since_sweep = 0

    # called with the lock held
    def _reclaim_recent(self, reserved: int, rank: int = 0) -> _Block | None:
        """Look at the ``RECENT_BLOCKS`` newest blocks for a dead one of class ``reserved``: return it,
        still registered, when its slot has rank ``rank`` and it holds a buffer (or needs none), for
        :meth:`_take_over`; recycle it otherwise, and every other dead block met before it."""
        dead = []
        found = None
        for n, (key, b) in enumerate(reversed(self._blocks.items())):
            if b.weak and _weak_ref_expired(b.weak):
                if b.reserved == reserved:
                    if _fits(b, reserved, rank):
                        found = b
                    else:
                        dead.append(key)
                    break
                dead.append(key)
            if n == RECENT_BLOCKS:
                break
        if dead:
            self._free_dead(dead)
        return found

    # called with the lock held
    def _reclaim_class(self, reserved: int, rank: int) -> _Block | None:
        """Look at the ``CLASS_BLOCKS`` newest live blocks of class ``reserved`` for a dead one that fits (see
        :func:`_fits`): return it, still registered, for :meth:`_take_over`. (Long-lived tensors, weights and
        optimizer state, sink to the front of their class as temporaries are taken over and move to its end.)"""
        same_class = self._by_class.get(reserved)
        if not same_class:
            return None
        for n, b in enumerate(reversed(same_class.values())):
            if b.weak and _weak_ref_expired(b.weak) and _fits(b, reserved, rank):
                return b
            if n == CLASS_BLOCKS:
                return None
        return None

    def _take_over(self, block: _Block, nbytes: int) -> _Block:
        """Give a dead block (of the class wanted and a fitting slot) to a new storage as it is: buffer,
        slot, a place as the newest block, and a fresh address. The outcome of recycling it through the
        cache and allocating again, in a third of the time."""
        _free_weak_ref(block.weak)
        block.weak = 0
        key = block.slot.address
        blocks = self._blocks
        if next(reversed(blocks)) != key:   # (the newest block stays where it is)
            del blocks[key]
            blocks[key] = block
            same_class = self._by_class[block.reserved]
            del same_class[key]
            same_class[key] = block
        del _buffers[block.address]
        address = block.address = self._next_address
        self._next_address = address + (block.reserved or _ADDRESS_ALIGN)
        self.requested += nbytes - block.requested
        block.requested = nbytes
        self.reused_in_place += 1
        self.allocated_total += block.reserved
        if not block.reserved:
            self.reused_empty_in_place += 1
        _buffers[address] = block.buffer
        return block

    def _free_dead(self, keys: list[int]) -> None:
        by_class = self._by_class
        for key in keys:
            block = self._blocks.pop(key)
            del by_class[block.reserved][key]
            _free_weak_ref(block.weak)
            block.weak = 0
            self._release(block)
            rank = block.slot.rank
            if rank == MAX_DIMS_RECYCLED:
                self._free_slots.append(block.slot)
            else:
                self._free_large_slots.setdefault(rank, []).append(block.slot)
        self.counts["frees"] += len(keys)

    def _new_buffer(self, reserved: int, requested: int) -> cl.Buffer:
        device = state.get().device
        if reserved > device.max_alloc_size:
            raise _oom(requested, device, f"the device's largest single allocation is "
                                          f"{_fmt(device.max_alloc_size)}")
        for attempt in range(2):
            if self.reserved + reserved > device.cl_device.global_mem_size:
                if attempt == 0:
                    self._relieve()
                    self._sweep()
                    self._release_cache()
                    continue
                raise _oom(requested, device, "the device's global memory is exhausted")
            try:
                buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, reserved)
            except cl.Error as error:  # MEM_OBJECT_ALLOCATION_FAILURE, OUT_OF_RESOURCES, ...
                if attempt == 0:
                    self.counts["oom_retries"] += 1
                    self._relieve()
                    self._sweep()
                    self._release_cache()
                    continue
                raise _oom(requested, device, f"the driver said {error}") from None
            self.counts["buffers_created"] += 1
            self.reserved_total += reserved
            return buffer
        raise AssertionError("unreachable")

    def _relieve(self) -> None:
        """Ask the caches of derived tensors to let go (the sweep that follows reclaims their blocks)."""
        for release in self.under_pressure:
            release()

    def _release_cache(self) -> None:
        self.counts["buffers_released"] += sum(map(len, self._cache.values()))
        self._cache.clear()
        self.cached = 0

    def allocate(self, nbytes: int, ndim: int) -> _Block:
        """A live block of at least ``nbytes`` with a DLPack slot for ``ndim`` dims."""
        reserved = (_classes.get(nbytes) or size_class(nbytes)) if nbytes else 0
        rank = max(MAX_DIMS_RECYCLED, ndim)  # (slots up to that many dims are that wide)
        with self._lock:
            if self._pending_graph_releases:
                self._drain_graph_releases()
            blocks = self._blocks
            if blocks:
                newest = blocks[next(reversed(blocks))]
                # the newest block has died (the previous op's temporary, typically) and fits (_fits)
                if (newest.reserved == reserved and newest.weak and newest.slot.rank == rank
                        and (newest.buffer is not None or not reserved) and _weak_ref_expired(newest.weak)
                        and (not graph_buffers or id(newest.buffer) not in graph_buffers)):
                    return self._take_over(newest, nbytes)
            self._allocs_since_sweep += 1
            if nbytes:
                cached = self._cache.get(reserved)
                if not cached:  # a miss: reclaim dead storages first (see the module docstring)
                    found = self._reclaim_class(reserved, rank)
                    if found is not None:
                        return self._take_over(found, nbytes)
                    found = self._reclaim_recent(reserved, rank)
                    if found is not None:
                        return self._take_over(found, nbytes)
                    cached = self._cache.get(reserved)
                    if (not cached and len(self._blocks) > RECENT_BLOCKS
                            and self._allocs_since_sweep > len(self._blocks) // 16):
                        self._sweep()
                        cached = self._cache.get(reserved)
                if cached:
                    buffer = cached.pop()
                    self.cached -= reserved
                    self.counts["cache_hits"] += 1
                else:
                    buffer = self._new_buffer(reserved, nbytes)
            else:
                buffer = None
            address = self._next_address
            # classes are multiples of the alignment (512 B granules, >= 64 KiB steps above 1 MiB)
            self._next_address = address + (reserved or _ADDRESS_ALIGN)
            if ndim > MAX_DIMS_RECYCLED:  # rare: a struct of exactly this rank, recycled per rank
                spare = self._free_large_slots.get(ndim)
                slot = spare.pop() if spare else _Slot(ndim)
            else:
                if not self._free_slots:  # (empty tensors never reclaimed above: a new _Slot costs ~15 µs)
                    self._reclaim_recent(reserved)
                slot = self._free_slots.pop() if self._free_slots else _Slot(MAX_DIMS_RECYCLED)
            block = _Block(address, buffer, reserved, nbytes, slot)
            self._blocks[slot.address] = block
            same_class = self._by_class.get(reserved)
            if same_class is None:
                same_class = self._by_class[reserved] = {}
            same_class[slot.address] = block
            self.allocated += reserved
            self.allocated_total += reserved
            self.requested += nbytes
            self.peak_allocated = max(self.peak_allocated, self.allocated)
            self.peak_reserved = max(self.peak_reserved, self.allocated + self.cached)
            self.counts["allocs"] += 1
            _buffers[address] = buffer
            return block

    def abandon(self, block: _Block) -> None:
        """Take back a block whose tensor could not be created."""
        with self._lock:
            if self._blocks.pop(block.slot.address, None) is not None:
                del self._by_class[block.reserved][block.slot.address]
            self._release(block)

    # called with the lock held
    def _release(self, block: _Block) -> None:
        """Forget a dead block's address and put its buffer back in the cache of its size class."""
        _buffers.pop(block.address, None)
        self.allocated -= block.reserved
        self.requested -= block.requested
        if block.buffer is not None and not (graph_buffers and id(block.buffer) in graph_buffers):
            self._cache.setdefault(block.reserved, []).append(block.buffer)
            self.cached += block.reserved

    def reserve_for_graph(self, buffers: Sequence[cl.MemoryObjectHolder]) -> None:
        """Keep ``buffers`` (each once) out of circulation while the graph that replays into them lives:
        the ones in the cache leave it, the others never enter it (the graph holds them)."""
        with self._lock:
            self._drain_graph_releases()
            for buffer in buffers:
                graph_buffers[id(buffer)] = graph_buffers.get(id(buffer), 0) + 1
            for reserved, cached in self._cache.items():
                kept = [b for b in cached if id(b) not in graph_buffers]
                if len(kept) != len(cached):
                    self.cached -= reserved * (len(cached) - len(kept))
                    cached[:] = kept
            self.graph_bytes += sum(b.size for b in buffers)

    def release_from_graph(self, buffers: Sequence[cl.MemoryObjectHolder]) -> None:
        """Undo :meth:`reserve_for_graph` for a graph that is reset or dropped. Buffers still held by live
        tensors return to the cache when those die; the others are freed with the graph's references."""
        with self._lock:
            self._drain_graph_releases()
            self._release_from_graph(buffers)

    def release_from_graph_soon(self, buffers: Sequence[cl.MemoryObjectHolder]) -> None:
        """:meth:`release_from_graph` for a finalizer (a graph garbage-collected): it takes no lock, since a
        collection may run inside any allocator call on this thread (one that allocates, say) whose lock
        it would wait for forever; the release happens at the allocator's next use (the list keeps the
        buffers, so their ids stay theirs until then)."""
        self._pending_graph_releases.append(buffers)

    # called with the lock held
    def _drain_graph_releases(self) -> None:
        pending = self._pending_graph_releases
        while pending:
            self._release_from_graph(pending.pop())

    def _release_from_graph(self, buffers: Sequence[cl.MemoryObjectHolder]) -> None:  # with the lock held
        for buffer in buffers:
            left = graph_buffers.get(id(buffer), 0) - 1
            if left > 0:
                graph_buffers[id(buffer)] = left
            else:
                graph_buffers.pop(id(buffer), None)
        self.graph_bytes -= sum(b.size for b in buffers)

    def empty_cache(self) -> None:
        """Give every cached (unused) buffer back to the driver."""
        self._sweep_derived()
        with self._lock:
            self._drain_graph_releases()
            self._sweep()
            self._release_cache()

    def _sweep_derived(self) -> None:
        for sweep in self.before_sweep:
            sweep()

    def stats(self) -> dict[str, int]:
        self._sweep_derived()
        with self._lock:
            self._drain_graph_releases()
            self._sweep()
            return {"allocated_bytes": self.allocated, "requested_bytes": self.requested,
                    "reserved_bytes": self.reserved, "cached_bytes": self.cached,
                    "peak_allocated_bytes": self.peak_allocated, "peak_reserved_bytes": self.peak_reserved,
                    "live_blocks": len(self._blocks), "graph_bytes": self.graph_bytes,
                    "allocated_bytes_total": self.allocated_total, "reserved_bytes_total": self.reserved_total,
                    **self.counts,
                    **self._in_place_counts()}

    def _in_place_counts(self) -> dict[str, int]:
        """A takeover in place is an allocation, a free and (for a block with a buffer) a reuse of a cached
        buffer."""
        n = self.reused_in_place
        return {"allocs": self.counts["allocs"] + n, "frees": self.counts["frees"] + n,
                "cache_hits": self.counts["cache_hits"] + n - self.reused_empty_in_place, "reused_in_place": n}

    def reset_peak(self) -> None:
        self._sweep_derived()
        with self._lock:
            self._drain_graph_releases()
            self._sweep()
            self.peak_allocated = self.allocated
            self.peak_reserved = self.reserved


def _fmt(nbytes: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} bytes"


def _oom(requested: int, device, reason: str) -> torch.OutOfMemoryError:
    a = allocator
    a.counts["ooms"] += 1
    return torch.OutOfMemoryError(
        f"OpenCL out of memory: tried to allocate {_fmt(requested)} on opencl:0 ({device.name}); "
        f"{reason}. tunecl holds {_fmt(a.allocated)} in tensors and {_fmt(a.reserved)} reserved; "
        f"device memory is {_fmt(device.cl_device.global_mem_size)}.")


allocator = CachingAllocator()
_buffers: dict[int, cl.Buffer | None] = {}   # pseudo address -> buffer of every live storage


# -- tensors ---------------------------------------------------------------------------------------
def empty(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A new, uninitialised opencl tensor with exactly ``size`` and ``stride``."""
    dl_dtype = DLPACK.get(dtype)
    if dl_dtype is None:
        check_storable(dtype)
    return _empty(size, stride, dl_dtype, storage_nbytes(size, stride, dl_dtype[1] >> 3))


def empty_dense(t: torch.Tensor) -> torch.Tensor:
    """A new, uninitialised tensor with ``t``'s size, strides and dtype, for a ``t`` known to be
    non-overlapping and dense (contiguous, channels-last, ...): it spans ``numel`` elements."""
    dl_dtype = DLPACK[t.dtype]  # (t exists: its dtype is storable)
    return _empty(t.shape, t.stride(), dl_dtype, t.numel() * (dl_dtype[1] >> 3))


def _empty(size: Sequence[int], stride: Sequence[int], dl_dtype: tuple[int, int], nbytes: int) -> torch.Tensor:
    ndim = len(size)
    block = allocator.allocate(nbytes, ndim)
    slot = block.slot
    slot.shape[:ndim] = size
    slot.strides[:ndim] = stride
    _DL_HEADER.pack_into(slot.managed, 0, block.address, _KDL_EXT_DEV, 0, ndim, dl_dtype[0], dl_dtype[1], 1)
    try:
        result = torch._C._from_dlpack(_capsule_new(slot.address, b"dltensor", None))
    except BaseException:
        allocator.abandon(block)
        raise
    block.weak = result.untyped_storage()._weak_ref()  # the allocator watches the storage from now on
    return result


# empty() for a caller that worked out once its DLPack dtype (DLPACK[dtype]) and its storage nbytes
# (storage_nbytes): empty_sized(size, stride, dl_dtype, nbytes)
empty_sized = _empty


def empty_contiguous(size: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A new, uninitialised contiguous opencl tensor of ``size``."""
    key = (tuple(size), dtype)
    layout = _contiguous_layouts.get(key)
    if layout is None:
        dl_dtype = DLPACK.get(dtype)
        if dl_dtype is None:
            check_storable(dtype)
        strides = tuple(contiguous_strides(size))
        layout = (strides, dl_dtype, storage_nbytes(size, strides, dl_dtype[1] >> 3))
        if len(_contiguous_layouts) < 4096:   # sizes repeat (the same shapes every step): remember them
            _contiguous_layouts[key] = layout
    return _empty(size, *layout)


_contiguous_layouts: dict[tuple, tuple] = {}   # (size, dtype) -> (strides, DLPack dtype, storage nbytes)


def buffer_of(t: torch.Tensor) -> cl.Buffer | None:
    """The ``cl.Buffer`` behind an opencl tensor's storage."""
    return _buffers[t.untyped_storage().data_ptr()]


def storage_buffer(storage: torch.UntypedStorage) -> cl.Buffer | None:
    return _buffers[storage.data_ptr()]


def empty_cache() -> None:
    allocator.empty_cache()


def memory_stats() -> dict[str, int]:
    return allocator.stats()
