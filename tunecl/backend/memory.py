"""Device memory: opencl tensors, each an ordinary ``torch.Tensor`` made from a DLPack struct
(:mod:`tunecl.backend.dlpack`) over a block of the caching allocator (:mod:`tunecl.backend.allocator`).


Every opencl tensor is an ordinary ``torch.Tensor`` created by ``torch._C._from_dlpack`` from a
``DLManagedTensor`` with device type kDLExtDev (12), which torch maps to PrivateUse1. Its data
pointer is a *pseudo address* from a bump pointer: unique, never reused, so two live storages never
appear to overlap and ``data_ptr() - storage.data_ptr()`` stays the byte offset. The address maps to a
``cl.Buffer`` in ``_buffers``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import pyopencl as cl
import torch

from tunecl.backend.allocator import Block, CachingAllocator, size_class
from tunecl.backend.allocator import size_classes as _classes
from tunecl.backend.allocator import buffers as _buffers
from tunecl.backend.dlpack import DL_HEADER as _DL_HEADER
from tunecl.backend.dlpack import KDL_EXT_DEV as _KDL_EXT_DEV
from tunecl.backend.dlpack import capsule_new as _capsule_new
from tunecl.backend.dtypes import DLPACK, check_storable


_watch = weakref.ref


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


allocator = CachingAllocator()


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
    block = allocator.allocate(nbytes, len(size))
    try:
        return _tensor(block, size, stride, dl_dtype)
    except BaseException:
        allocator.abandon(block)
        raise


def _tensor(block: Block, size: Sequence[int], stride: Sequence[int], dl_dtype: tuple[int, int]) -> torch.Tensor:
    """The tensor of a block just allocated (its caller gives the block back if this raises)."""
    slot = block.slot
    layout = slot.layout
    if layout[0] != size or layout[1] != stride or slot.dtype is not dl_dtype:   # (a list is never equal)
        ndim = len(size)
        slot.shape[:ndim] = size
        slot.strides[:ndim] = stride
        _DL_HEADER.pack_into(slot.managed, 0, block.address, _KDL_EXT_DEV, 0, ndim, dl_dtype[0], dl_dtype[1], 1)
        slot.layout, slot.dtype = (tuple(size), tuple(stride)), dl_dtype
    else:
        slot.tensor.data = block.address
    result = torch._C._from_dlpack(_capsule_new(slot.address, b"dltensor", None))
    block.watch = _watch(result.untyped_storage(), block)  # the storage's death queues the block
    return result


class Layouts:
    """The layouts of a call's outputs, worked out once: :meth:`empty` allocates a tensor of each (under one
    hold of the allocator's lock) and hands out their buffers with them, so the caller needs no lookups."""

    __slots__ = ("layouts", "requests")

    def __init__(self, layouts: Sequence[tuple[Sequence[int], Sequence[int], torch.dtype]]) -> None:
        self.layouts: list[tuple[tuple, tuple, tuple[int, int]]] = []
        self.requests: list[tuple[int, int, int]] = []
        for size, stride, dtype in layouts:
            dl_dtype = DLPACK.get(dtype)
            if dl_dtype is None:
                check_storable(dtype)
            self.layouts.append((tuple(size), tuple(stride), dl_dtype))
            self.requests.append(_request(storage_nbytes(size, stride, dl_dtype[1] >> 3), len(size)))

    def empty(self) -> tuple[list[torch.Tensor], list[cl.Buffer | None]]:
        """(tensors, their buffers)."""
        return _tensors(allocator.allocate_many(self.requests), self.layouts)


def _request(nbytes: int, ndim: int) -> tuple[int, int, int]:
    """:meth:`CachingAllocator.allocate_many`'s request for a storage of ``nbytes`` and ``ndim`` dims."""
    return (_classes.get(nbytes) or size_class(nbytes)) if nbytes else 0, nbytes, ndim


def _tensors(blocks: list[Block], layouts: Sequence[tuple[Sequence[int], Sequence[int], tuple[int, int]]]
             ) -> tuple[list[torch.Tensor], list[cl.Buffer | None]]:
    tensors: list[torch.Tensor] = []
    buffers: list[cl.Buffer | None] = []
    try:
        for block, (size, stride, dl_dtype) in zip(blocks, layouts):
            tensors.append(_tensor(block, size, stride, dl_dtype))
            buffers.append(block.buffer)
    except BaseException:
        for block in blocks[len(tensors):]:
            if block.watch is None:   # no tensor made (one that was, its storage's death gives back)
                allocator.abandon(block)
        raise
    return tensors, buffers


def empty_dense_many(tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[cl.Buffer | None]]:
    """:func:`empty_dense` of each of ``tensors`` (each non-overlapping and dense), and the new tensors'
    buffers."""
    layouts = []
    requests = []
    for t in tensors:
        size, dl_dtype = t.shape, DLPACK[t.dtype]
        layouts.append((size, t.stride(), dl_dtype))
        requests.append(_request(t.numel() * (dl_dtype[1] >> 3), len(size)))
    return _tensors(allocator.allocate_many(requests), layouts)


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
