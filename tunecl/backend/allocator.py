"""The caching allocator behind every opencl storage: blocks of ``cl.Buffer`` by size class, each with the
pseudo address its storage shows as ``data_ptr()`` and a DLPack :class:`~tunecl.backend.dlpack.Slot`.

Freeing: each block watches its storage through a Python weak reference to the storage's Python object
(``t.untyped_storage()``), which torch keeps exactly as long as the storage lives (PyObject preservation:
while only C++ holds the storage, a tensor autograd saved say, the Python object is kept for it). When the
storage dies, so does that object, and the reference's callback queues the block (an append to a deque:
no lock, so it may run on any thread, inside an allocator call, or while an exception propagates, since
Python saves and restores a pending exception around weak reference callbacks; a ctypes DLPack deleter
could not: run with an exception pending it replaces it with a SystemError). The next allocation, or a
statistic, moves the queued blocks to the cache of their size class whole, buffer and DLPack slot; an
allocation takes the newest cached block of its class and gives it a fresh address, and creates a buffer
only when its class has none cached. Nothing polls or sweeps: each allocation and each death costs O(1).

Size classes: requests up to 1 MiB round up to a multiple of 512 B (at most 511 B wasted); larger
requests round up to a multiple of 1/16 of the power of two at or below them (under 6.25 % wasted;
power-of-two rounding wastes up to 50 %). Freed blocks are cached per class and reused for the same
class (zero-byte blocks, without a buffer, too: for their slots); ``empty_cache`` returns the buffers to
the driver.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable, Sequence

import pyopencl as cl
import torch

from tunecl.backend import state
from tunecl.backend.dlpack import Slot
from tunecl.runtime import addresses

KIB, MIB = 1 << 10, 1 << 20
SMALL_LIMIT = 1 * MIB      # up to here: 512-byte granules
SMALL_GRANULE = 512
LARGE_SHIFT = 4            # above: 2**4 = 16 classes per power of two
_FIRST_ADDRESS = 1 << 56   # pseudo addresses lie above every user-space host pointer (< 2**57)
_ADDRESS_ALIGN = 256
MAX_DIMS_RECYCLED = 8      # DLPack structs with room for this many dims are recycled


def size_class(nbytes: int) -> int:
    """Bytes actually reserved for a request of ``nbytes`` (see the module docstring)."""
    reserved = size_classes.get(nbytes)
    if reserved is not None:
        return reserved
    reserved = _size_class(nbytes)
    if len(size_classes) < 4096:  # requests repeat (the same shapes every step): remember the answers
        size_classes[nbytes] = reserved
    return reserved


size_classes: dict[int, int] = {}   # request bytes -> class bytes, remembered


def _size_class(nbytes: int) -> int:
    if nbytes <= SMALL_LIMIT:
        return max(SMALL_GRANULE, -(-nbytes // SMALL_GRANULE) * SMALL_GRANULE)
    step = 1 << (nbytes.bit_length() - 1 - LARGE_SHIFT)
    return -(-nbytes // step) * step


# blocks whose storages died, queued by their weak references' callbacks (thread-safe appends) for the
# allocator to move to its cache under its lock
_deaths: collections.deque[Block] = collections.deque()


def _check_storage_objects_live_with_their_storages() -> None:
    """The allocator frees a block when its storage's Python object goes: make sure this torch keeps that
    object while the storage lives (here held by a tensor without a Python reference to the storage)."""
    died: list[int] = []
    t = torch.empty(1)
    watch = weakref.ref(t.untyped_storage(), lambda _: died.append(1))
    alive = not died
    del t
    if not (alive and died and watch() is None):
        raise ImportError(f"tunecl.backend needs torch to keep a storage's Python object as long as the storage "
                          f"lives (PyObject preservation); this torch {torch.__version__} does not")


_check_storage_objects_live_with_their_storages()


class Block:
    """One allocation: its pseudo address (the storage's data_ptr), buffer (None when empty), class bytes
    held, bytes requested, DLPack slot, and the weak reference to its storage's Python object that queues
    the block when the storage dies (None while the block is cached or its tensor is being made)."""

    __slots__ = ("address", "buffer", "requested", "reserved", "slot", "watch")

    def __init__(self, address: int, buffer: cl.Buffer | None, reserved: int, requested: int, slot: Slot):
        self.address, self.buffer, self.reserved, self.requested, self.slot = address, buffer, reserved, requested, slot
        self.watch: weakref.ref | None = None

    def __call__(self, _: weakref.ref, _queue: Callable[[Block], None] = _deaths.append) -> None:
        """The weak reference's callback: the storage died."""
        _queue(self)


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
        # the cache: dead blocks by size class, each kept whole (buffer and DLPack slot) for the next
        # allocation of its class, which revives it with a fresh address (see _take)
        self._idle: dict[int, list[Block]] = {}
        self._blocks: dict[int, Block] = {}      # struct address -> live block
        self._free_slots: list[Slot] = []
        # slots of more than MAX_DIMS_RECYCLED dims, by rank: kept rather than freed, since torch may read a
        # dead storage's DLManagedTensor (its deleter field) just after its Python object went, possibly on
        # another thread, so its memory must stay valid
        self._free_large_slots: dict[int, list[Slot]] = {}
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
        self.freed = 0            # blocks whose storages died
        self.revived = 0          # allocations served from the cache (see _take) ...
        self.revived_empty = 0    # ... of them, zero-byte blocks (no buffer: not a cache hit)
        self.graph_bytes = 0      # bytes of the buffers live graphs hold (some also belong to live tensors)
        # caches of derived tensors (weight_cache): let go of those of dead tensors before statistics and
        # empty_cache, of everything before an allocation fails (called with the allocator's lock held:
        # must not wait)
        self.before_sweep: list[Callable[[], None]] = []
        self.under_pressure: list[Callable[[], None]] = []

    @property
    def reserved(self) -> int:
        return self.allocated + self.cached

    # called with the lock held
    def _bury(self) -> None:
        """Move the blocks whose storages died (queued by their callbacks) to the cache (:meth:`_release`,
        written out here for the common case: a block with a buffer no graph holds)."""
        blocks, idle_by_class = self._blocks, self._idle
        while _deaths:
            block = _deaths.popleft()
            if blocks.pop(block.slot.address, None) is not block:
                continue
            block.watch = None
            self.freed += 1
            buffer, reserved = block.buffer, block.reserved
            if buffer is None or (graph_buffers and id(buffer) in graph_buffers):
                self._release(block)
                continue
            del buffers[block.address]
            self.allocated -= reserved
            self.requested -= block.requested
            self.cached += reserved
            idle = idle_by_class.get(reserved)
            if idle is None:
                idle_by_class[reserved] = [block]
            else:
                idle.append(block)

    def _recycle_slot(self, slot: Slot) -> None:
        if slot.rank == MAX_DIMS_RECYCLED:
            self._free_slots.append(slot)
        else:
            self._free_large_slots.setdefault(slot.rank, []).append(slot)

    def _new_buffer(self, reserved: int, requested: int) -> cl.Buffer | None:
        st = state.get()
        if not st.allocates:   # a State without device memory (a dry run's): the storage gets no buffer
            return None
        device = st.device
        if reserved > device.max_alloc_size:
            raise _oom(self, requested, device, f"the device's largest single allocation is "
                                          f"{_fmt(device.max_alloc_size)}")
        for attempt in range(2):
            if self.reserved + reserved > device.cl_device.global_mem_size:
                if attempt == 0:
                    self._relieve()
                    self._bury()
                    self._release_cache()
                    continue
                raise _oom(self, requested, device, "the device's global memory is exhausted")
            try:
                buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, reserved)
            except cl.Error as error:  # MEM_OBJECT_ALLOCATION_FAILURE, OUT_OF_RESOURCES, ...
                if attempt == 0:
                    self.counts["oom_retries"] += 1
                    self._relieve()
                    self._bury()
                    self._release_cache()
                    continue
                raise _oom(self, requested, device, f"the driver said {error}") from None
            self.counts["buffers_created"] += 1
            self.reserved_total += reserved
            return buffer
        raise AssertionError("unreachable")

    def _relieve(self) -> None:
        """Ask the caches of derived tensors to let go (their blocks are queued as their storages die)."""
        for release in self.under_pressure:
            release()

    def _release_cache(self) -> None:
        if any(block.buffer is not None for idle in self._idle.values() for block in idle):
            _wait_for_addressed_launches()
        for idle in self._idle.values():
            for block in idle:
                if block.buffer is not None:
                    self.counts["buffers_released"] += 1
                self._recycle_slot(block.slot)
        self._idle.clear()
        self.cached = 0

    def allocate(self, nbytes: int, ndim: int) -> Block:
        """A live block of at least ``nbytes`` with a DLPack slot for ``ndim`` dims; its caller sets
        :attr:`Block.watch` once the storage exists."""
        reserved = (size_classes.get(nbytes) or size_class(nbytes)) if nbytes else 0
        with self._lock:
            if self._pending_graph_releases:
                self._drain_graph_releases()
            if _deaths:
                self._bury()
            return self._take(reserved, nbytes, ndim)

    def allocate_many(self, requests: Sequence[tuple[int, int, int]]) -> list[Block]:
        """:meth:`allocate` for each (class bytes (:func:`size_class`, 0 for 0 bytes), nbytes, ndim) of
        ``requests``, under one hold of the lock."""
        blocks: list[Block] = []
        with self._lock:
            if self._pending_graph_releases:
                self._drain_graph_releases()
            if _deaths:
                self._bury()
            try:
                for reserved, nbytes, ndim in requests:
                    blocks.append(self._take(reserved, nbytes, ndim))
            except BaseException:   # (out of memory) the blocks taken so far go back
                for block in blocks:
                    self._blocks.pop(block.slot.address, None)
                    self._release(block)
                raise
        return blocks

    # called with the lock held
    def _take(self, reserved: int, nbytes: int, ndim: int) -> Block:
        """A block of class ``reserved``: a cached one revived with a fresh address (and a slot of the
        needed rank), else a new one."""
        idle = self._idle.get(reserved)
        if not idle:
            return self._new_block(reserved, nbytes, max(MAX_DIMS_RECYCLED, ndim))
        block = idle.pop()
        self.cached -= reserved
        slot = block.slot
        if slot.rank != MAX_DIMS_RECYCLED or ndim > MAX_DIMS_RECYCLED:   # (rare: a slot of more dims)
            rank = max(MAX_DIMS_RECYCLED, ndim)
            if slot.rank != rank:
                self._recycle_slot(slot)
                slot = block.slot = self._slot(rank)
        address = block.address = self._next_address
        self._next_address = address + (reserved or _ADDRESS_ALIGN)
        block.requested = nbytes
        self._blocks[slot.address] = block
        allocated = self.allocated = self.allocated + reserved
        self.allocated_total += reserved
        self.requested += nbytes
        self.revived += 1
        if not reserved:
            self.revived_empty += 1
        elif allocated > self.peak_allocated:
            self.peak_allocated = allocated
        buffers[address] = block.buffer
        return block

    # called with the lock held
    def _new_block(self, reserved: int, nbytes: int, rank: int) -> Block:
        buffer = self._new_buffer(reserved, nbytes) if reserved else None
        address = self._next_address
        # classes are multiples of the alignment (512 B granules, >= 64 KiB steps above 1 MiB)
        self._next_address = address + (reserved or _ADDRESS_ALIGN)
        slot = self._slot(rank)
        block = Block(address, buffer, reserved, nbytes, slot)
        self._blocks[slot.address] = block
        self.allocated += reserved
        self.allocated_total += reserved
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.allocated + self.cached)
        self.counts["allocs"] += 1
        buffers[address] = buffer
        return block

    def _slot(self, rank: int) -> Slot:
        if rank > MAX_DIMS_RECYCLED:  # rare: a struct of exactly this rank, recycled per rank
            spare = self._free_large_slots.get(rank)
            return spare.pop() if spare else Slot(rank)
        return self._free_slots.pop() if self._free_slots else Slot(MAX_DIMS_RECYCLED)

    def abandon(self, block: Block) -> None:
        """Take back a block whose tensor could not be created."""
        with self._lock:
            self._blocks.pop(block.slot.address, None)
            self._release(block)

    # called with the lock held
    def _release(self, block: Block) -> None:
        """Forget a dead block's address; keep it, buffer and slot, in the cache of its size class (a block
        of a class above 0 without a buffer, a dry run's, or whose buffer a graph holds, gives its slot back
        instead)."""
        buffers.pop(block.address, None)
        self.allocated -= block.reserved
        self.requested -= block.requested
        buffer = block.buffer
        if (buffer is not None or not block.reserved) and not (graph_buffers and id(buffer) in graph_buffers):
            idle = self._idle.get(block.reserved)
            if idle is None:
                self._idle[block.reserved] = [block]
            else:
                idle.append(block)
            self.cached += block.reserved
        else:
            self._recycle_slot(block.slot)

    def reserve_for_graph(self, buffers: Sequence[cl.MemoryObjectHolder]) -> None:
        """Keep ``buffers`` (each once) out of circulation while the graph that replays into them lives:
        the ones in the cache leave it, the others never enter it (the graph holds them)."""
        with self._lock:
            self._drain_graph_releases()
            for buffer in buffers:
                graph_buffers[id(buffer)] = graph_buffers.get(id(buffer), 0) + 1
            for reserved, idle in self._idle.items():
                kept = [b for b in idle if b.buffer is None or id(b.buffer) not in graph_buffers]
                if len(kept) != len(idle):
                    self.cached -= reserved * (len(idle) - len(kept))
                    for block in idle:
                        if block.buffer is not None and id(block.buffer) in graph_buffers:
                            self._recycle_slot(block.slot)
                    idle[:] = kept
            self.graph_bytes += sum(b.size for b in buffers)

    def release_from_graph(self, buffers: Sequence[cl.MemoryObjectHolder]) -> None:
        """Undo :meth:`reserve_for_graph` for a graph that is reset or dropped. Buffers still held by live
        tensors return to the cache when those die; the others are freed with the graph's references."""
        with self._lock:
            self._drain_graph_releases()
            _wait_for_addressed_launches()   # (the graph lets go of its buffers after this)
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
        if pending:   # (the list holds the graphs' buffers: they go to the driver after this)
            _wait_for_addressed_launches()
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
            self._bury()
            self._release_cache()

    def _sweep_derived(self) -> None:
        for sweep in self.before_sweep:
            sweep()

    def stats(self) -> dict[str, int]:
        self._sweep_derived()
        with self._lock:
            self._drain_graph_releases()
            self._bury()
            counts = self.counts
            return {"allocated_bytes": self.allocated, "requested_bytes": self.requested,
                    "reserved_bytes": self.reserved, "cached_bytes": self.cached,
                    "peak_allocated_bytes": self.peak_allocated, "peak_reserved_bytes": self.peak_reserved,
                    "live_blocks": len(self._blocks), "graph_bytes": self.graph_bytes,
                    "allocated_bytes_total": self.allocated_total, "reserved_bytes_total": self.reserved_total,
                    **counts,
                    # a block revived from the cache is an allocation and (with a buffer) a cache hit
                    "allocs": counts["allocs"] + self.revived, "frees": self.freed,
                    "cache_hits": self.revived - self.revived_empty}

    def reset_peak(self) -> None:
        self._sweep_derived()
        with self._lock:
            self._drain_graph_releases()
            self._bury()
            self.peak_allocated = self.allocated
            self.peak_reserved = self.reserved


def _wait_for_addressed_launches() -> None:
    """Wait for the device's queue where launches reached buffers by their addresses, before buffers go
    back to the driver: such a launch does not hold its buffers (see :mod:`tunecl.runtime.addresses`)."""
    if addresses.launched:
        st = state.get()
        if st.allocates:
            st.device.queue.finish()


def _fmt(nbytes: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} bytes"


def _oom(a: CachingAllocator, requested: int, device, reason: str) -> torch.OutOfMemoryError:
    a.counts["ooms"] += 1
    return torch.OutOfMemoryError(
        f"OpenCL out of memory: tried to allocate {_fmt(requested)} on opencl:0 ({device.name}); "
        f"{reason}. tunecl holds {_fmt(a.allocated)} in tensors and {_fmt(a.reserved)} reserved; "
        f"device memory is {_fmt(device.cl_device.global_mem_size)}.")


buffers: dict[int, cl.Buffer | None] = {}   # pseudo address -> buffer of every live storage
