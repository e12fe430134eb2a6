"""Copies host→device, device→host and device→device, contiguous or strided, with dtype conversion.

- Host→device on a GPU (or any non-CPU device): up to ``PINNED_LIMIT`` bytes are copied into a fresh
  buffer at creation (``COPY_HOST_PTR``, which copies before returning) and then moved by an enqueued device
  copy, so the host never waits for the queue. Larger uploads (a training batch) are copied into a
  page-locked host buffer (``ALLOC_HOST_PTR``, mapped once) in chunks, by a few threads, each chunk read by a
  non-blocking write submitted at once (the DMA of one chunk overlaps the copies of the next): drivers move
  page-locked memory by DMA where pageable memory goes through their own staging (NVIDIA's OpenCL guide
  recommends this), and the host goes on enqueueing meanwhile. An upload takes a staging buffer whose last
  write has finished (up to ``STAGING_BUFFERS`` of them, each grown when an upload needs more), so uploads
  back to back do not wait for each other's write, which waits on the queue for the work before it.
  ``benchmarks/upload.py`` times the routes against each other and torch CUDA's copy.
- Host→device on a CPU device, which reads host memory itself: up to ``STAGING_LIMIT`` bytes as above,
  larger uploads by one blocking write (a page-locked copy would only add a copy). Non-contiguous or
  broadcast host data is staged contiguously and scattered on the device by the pointwise ``copy`` kernel.
- Device→host blocks (the data must be in host memory on return), so ``non_blocking`` is accepted
  but synchronous.
- Device→device uses ``clEnqueueCopyBuffer`` for same-dtype contiguous copies, else the pointwise
  ``copy`` kernel (strides, broadcasting and dtype conversion on the device).
- Dtypes without kernels (bfloat16, complex64) copy through the host.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import torch

from tunecl.backend import graphs, memory, state
from tunecl.backend.dtypes import DLPACK, KERNEL_NAMES
from tunecl.backend.memory import buffer_of, contiguous_strides, storage_nbytes
from tunecl.backend.operands import broadcast_operand, dense_strides_like, is_dense, operand, same_storage
from tunecl.errors import Unsupported

STAGING_LIMIT = 16 << 20   # CPU devices: larger uploads are one blocking write
PINNED_LIMIT = 1 << 20     # GPUs: larger uploads go through the page-locked buffer
# the page-locked route: None = on GPUs and accelerators (a CPU device reads host memory itself: there the
# extra copy only costs, 2.0 -> 4.4 ms for a 38.5 MB batch on PoCL); True or False forces it
PINNED_UPLOADS: bool | None = None
STAGING_CHUNK = 4 << 20   # bytes staged (then written) at a time by the page-locked path
STAGING_THREADS = min(4, os.cpu_count() or 1)   # threads that copy the chunks into it
STAGING_BUFFERS = 4   # page-locked staging buffers at most (each of at least 2 * STAGING_LIMIT bytes)


def _bytes_of(host: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a numpy uint8 array (a view: writes land in it; the
    array keeps the tensor alive).

    Made from the data pointer rather than by ``Tensor.numpy()``, which marks the storage as not
    resizable for good: a CPU op of the fallback that resizes its out= argument would then fail."""
    host = host.detach()
    nbytes = host.numel() * host.element_size()
    if nbytes == 0:
        return np.empty(0, np.uint8)
    memory_ = (ctypes.c_uint8 * nbytes).from_address(host.data_ptr())
    memory_._tensor = host
    return np.frombuffer(memory_, dtype=np.uint8)


def write_bytes(buffer: cl.Buffer, offset: int, data: np.ndarray) -> None:
    """Copy host bytes into ``buffer`` at byte ``offset``; the host data may change on return (the
    backend calls it as ``state.get().write_bytes``, which a dry run's State replaces)."""
    nbytes = data.nbytes
    if nbytes == 0:
        return
    # (the staged path below enqueues a device copy from a fresh buffer, which a graph would record
    # with this call's bytes frozen in it)
    graphs.check_not_capturing("a host→device copy (random numbers are drawn on the host and uploaded)")
    st = state.get()
    pinned = PINNED_UPLOADS if PINNED_UPLOADS is not None else st.device.fingerprint.device_type != "cpu"
    if pinned and nbytes > PINNED_LIMIT:
        _pinned.write(st, buffer, offset, data)
    elif nbytes <= STAGING_LIMIT:
        staging = cl.Buffer(st.device.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                            hostbuf=data)
        cl.enqueue_copy(st.queue, buffer, staging, byte_count=nbytes, dst_offset=offset)
    else:
        cl.enqueue_copy(st.queue, buffer, data, dst_offset=offset, is_blocking=True)


class _Staging:
    """One page-locked host buffer, mapped for its lifetime, and the write that reads it last."""

    __slots__ = ("buffer", "last", "view")

    def __init__(self, st: state.State, nbytes: int, map_queue: cl.CommandQueue) -> None:
        size = max(nbytes, 2 * STAGING_LIMIT)
        self.buffer = cl.Buffer(st.device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, size)
        # (mapped on a queue of its own: on the device's queue the map would wait for the work enqueued there)
        self.view, _ = cl.enqueue_map_buffer(map_queue, self.buffer, cl.map_flags.WRITE, 0, (size,), np.uint8)
        self.last: cl.Event | None = None

    def idle(self) -> bool:
        """Whether no write still reads the bytes (a failed write reads nothing more either)."""
        return self.last is None or self.last.command_execution_status <= cl.command_execution_status.COMPLETE


class _PinnedStaging:
    """Page-locked host buffers for large uploads, at most ``STAGING_BUFFERS``. An upload takes one that no
    write still reads: the writes wait on the device's in-order queue behind the work enqueued before them,
    so a second upload that waited for the first one's write would wait for all of that work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stagings: list[_Staging] = []   # the least recently used first
        self._map_queue: cl.CommandQueue | None = None

    def write(self, st: state.State, buffer: cl.Buffer, offset: int, data: np.ndarray) -> None:
        with self._lock:
            self._write(st, buffer, offset, data)

    def _new(self, st: state.State, nbytes: int) -> _Staging:
        if self._map_queue is None or self._map_queue.context != st.device.context:
            self._map_queue = cl.CommandQueue(st.device.context, st.device.cl_device)
        return _Staging(st, nbytes, self._map_queue)

    def _take(self, st: state.State, nbytes: int) -> _Staging:
        stagings = self._stagings
        idle = [s for s in stagings if s.idle()]
        staging = next((s for s in idle if s.view.nbytes >= nbytes), None)
        if staging is None:
            if idle or len(stagings) >= STAGING_BUFFERS:
                # an idle one that is too small, else the least recently used, once its write has read it
                staging = idle[0] if idle else stagings[0]
                if staging.last is not None:
                    staging.last.wait()
                stagings.remove(staging)
                if staging.view.nbytes < nbytes:
                    staging = self._new(st, nbytes)   # (the old mapping goes with its buffer)
            else:
                staging = self._new(st, nbytes)
        else:
            stagings.remove(staging)
        stagings.append(staging)
        return staging

    def _write(self, st: state.State, buffer: cl.Buffer, offset: int, data: np.ndarray) -> None:
        nbytes = data.nbytes
        staging = self._take(st, nbytes)
        # In chunks copied by a few threads (numpy releases the GIL while it copies), each written and
        # submitted as soon as it is staged, so the DMA of one chunk overlaps the copies of the next.
        # (Not torch's copy_ on all its OpenMP threads: 4x faster alone, but 16x slower than one thread
        # when another process keeps the cores busy too, its threads waiting on each other.)
        src, view = data.reshape(-1).view(np.uint8), staging.view
        spans = [(start, min(start + STAGING_CHUNK, nbytes)) for start in range(0, nbytes, STAGING_CHUNK)]
        copied = _copy_pool().map(lambda span: np.copyto(view[span[0]:span[1]], src[span[0]:span[1]]), spans)
        for (start, stop), _ in zip(spans, copied):
            staging.last = cl.enqueue_copy(st.queue, buffer, view[start:stop], dst_offset=offset + start,
                                           is_blocking=False)
            st.queue.flush()


@functools.cache
def _copy_pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(STAGING_THREADS, thread_name_prefix="tunecl-staging")


# A forked child (a DataLoader worker) has none of the pool's threads: it makes its own pool if it needs one.
os.register_at_fork(after_in_child=_copy_pool.cache_clear)


_pinned = _PinnedStaging()


def read_bytes(data: np.ndarray, buffer: cl.Buffer, offset: int) -> None:
    """Fill host ``data`` from ``buffer`` at byte ``offset``; waits for the device (called as
    ``state.get().read_bytes``), and raises the IndexError of a gather or scatter launched before it that met
    an index out of range."""
    if data.nbytes:
        st = state.get()
        cl.enqueue_copy(st.queue, data, buffer, src_offset=offset, is_blocking=True)
        st.raise_index_fault()


def _download_span(t: torch.Tensor) -> torch.Tensor:
    """The storage elements ``t`` spans, from its first element, as a flat CPU tensor."""
    item = t.element_size()
    flat = torch.empty(storage_nbytes(t.shape, t.stride(), item) // item, dtype=t.dtype)
    if flat.numel():
        state.get().read_bytes(_bytes_of(flat), buffer_of(t), t.storage_offset() * item)
    return flat


def host_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t`` with the same sizes and strides (overlap and gaps preserved)."""
    return _download_span(t).as_strided(t.shape, t.stride())


def contiguous_on_device(t: torch.Tensor) -> torch.Tensor:
    """A contiguous device copy of ``t`` (``t`` itself if it already is contiguous)."""
    if t.is_contiguous():
        return t
    out = memory.empty_contiguous(t.shape, t.dtype)
    device_copy(out, t)
    return out


def has_math_bits(t: torch.Tensor) -> bool:
    """Whether ``t`` is a lazy conjugate or negative view: its values are its storage's, conjugated or
    negated (``x.conj()`` of a complex tensor, ``x.conj().imag``)."""
    return t.is_conj() or t.is_neg()


def apply_math_bits(host: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``host`` conjugated where ``like`` has the conjugate bit and negated where it has the negative bit:
    ``like``'s values from its storage's (host: the storage's values, no bits of its own), and back (both
    maps are involutions)."""
    if like.is_conj():
        host = host.conj_physical()
    if like.is_neg():
        host = host.neg()
    return host


def to_cpu(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A CPU copy of device tensor ``t`` (its values: a conjugate or negative bit is applied); dense
    layouts keep their strides, others become contiguous."""
    if is_dense(t.shape, t.stride()):
        host = host_view(t)
    elif t.dtype in KERNEL_NAMES and not has_math_bits(t):
        host = host_view(contiguous_on_device(t))  # gather on the device, transfer only the elements
    else:
        host = host_view(t).contiguous()
    if has_math_bits(t):
        host = apply_math_bits(host, t)
    if dtype is not None and dtype != host.dtype:
        host = host.to(dtype)
    return host


def upload(host: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new device tensor holding CPU tensor ``host`` (dense layouts keep their strides)."""
    dtype = host.dtype if dtype is None else dtype
    out = memory.empty(host.shape, dense_strides_like(host), dtype)
    upload_into(out, host)
    return out


def upload_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for device ``dst`` and CPU ``src`` (broadcast, strides, dtype)."""
    if dst.numel() == 0:
        return
    src = src.detach().resolve_conj().resolve_neg()
    if src._is_zerotensor():   # torch's efficient zeros (e.g. a gradient of sgn) have no data to copy
        src = torch.zeros(src.shape, dtype=src.dtype)
    if src.dtype != dst.dtype and (src.dtype not in DLPACK or dst.dtype not in KERNEL_NAMES
                                   or src.dtype not in KERNEL_NAMES):
        src = src.to(dst.dtype)  # e.g. float64 host data: convert on the host, never store float64
    if src.dtype == dst.dtype and src.shape == dst.shape:
        if dst.is_contiguous():
            state.get().write_bytes(buffer_of(dst), dst.storage_offset() * dst.element_size(),
                                    _bytes_of(src.contiguous()))
            return
        if is_dense(dst.shape, dst.stride()) and src.stride() == dst.stride():
            # same dense layout: the span of src is exactly the bytes dst covers
            span = src.as_strided((storage_nbytes(src.shape, src.stride(), 1),), (1,), src.storage_offset())
            state.get().write_bytes(buffer_of(dst), dst.storage_offset() * dst.element_size(), _bytes_of(span))
            return
    if dst.dtype in KERNEL_NAMES and src.dtype in KERNEL_NAMES:
        device_copy(dst, upload(src.contiguous()))
        return
    # no kernels for this dtype: read-modify-write the span dst covers on the host
    flat = _download_span(dst)
    flat.as_strided(dst.shape, dst.stride()).copy_(src)
    state.get().write_bytes(buffer_of(dst), dst.storage_offset() * dst.element_size(), _bytes_of(flat))


def device_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` with both on the device (broadcast, strides, dtype conversion)."""
    if dst.numel() == 0:
        return
    if same_storage(dst, src):
        if (dst.storage_offset(), dst.stride(), dst.shape, dst.dtype) == \
                (src.storage_offset(), src.stride(), src.shape, src.dtype):
            return
        src = _fresh_copy(src)  # reading and writing overlapping memory in one kernel would race
    if (dst.dtype == src.dtype and dst.shape == src.shape and dst.is_contiguous()
            and src.is_contiguous()):
        item = dst.element_size()
        st = state.get()
        st.cl.enqueue_copy(st.queue, buffer_of(dst), buffer_of(src), byte_count=dst.numel() * item,
                           src_offset=src.storage_offset() * item, dst_offset=dst.storage_offset() * item)
        return
    try:
        state.get().pointwise("copy", dst.shape, operand(dst), [broadcast_operand(src, dst.shape)])
    except Unsupported:
        upload_into(dst, to_cpu(src))


def _fresh_copy(src: torch.Tensor) -> torch.Tensor:
    out = memory.empty(src.shape, dense_strides_like(src), src.dtype)
    if src.dtype in KERNEL_NAMES:
        state.get().pointwise("copy", src.shape, operand(out), [operand(src)])
    else:
        upload_into(out, host_view(src))
    return out


# -- ATen adapters ---------------------------------------------------------------------------------
def _check_broadcast(src: torch.Tensor, dst: torch.Tensor) -> None:
    """copy_ reaches _copy_from without torch's own shape check for other backends."""
    if src.shape == dst.shape:
        return
    try:
        fits = torch.broadcast_shapes(src.shape, dst.shape) == dst.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(f"The size of the source {list(src.shape)} must match the size of the destination "
                           f"{list(dst.shape)} (or broadcast to it) in copy_")


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``aten::_copy_from``: every copy_ with an opencl side lands here, lazy conjugate and negative views
    included (registration.py lets it through those keys: their generic fallback would clone the view,
    and a clone copies through this op again)."""
    _check_broadcast(src, dst)
    if has_math_bits(src) or has_math_bits(dst):
        _copy_values(src, dst)
    elif src.device.type == "opencl" and dst.device.type == "opencl":
        device_copy(dst, src)
    elif dst.device.type == "opencl":
        upload_into(dst, src)
    elif src.device.type == "opencl":
        if (dst.device.type == "cpu" and dst.dtype == src.dtype and dst.shape == src.shape
                and dst.is_contiguous() and src.is_contiguous()):
            state.get().read_bytes(_bytes_of(dst), buffer_of(src), src.storage_offset() * src.element_size())
        else:
            dst.copy_(to_cpu(src))
    return dst


def _copy_values(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst.copy_(src)`` where either is a conjugate or negative view, through the host (rare: complex
    tensors have no kernels): ``src``'s values, with ``dst``'s bits applied, into ``dst``'s storage."""
    values = to_cpu(src) if src.device.type == "opencl" else src.resolve_conj().resolve_neg()
    if dst.device.type == "opencl":
        upload_into(dst, apply_math_bits(values, dst))
    else:
        dst.copy_(values)


def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return copy_from(src, dst)


def out_overload(kernel: Callable[..., Any], *names: str) -> Callable[..., Any]:
    """The ``.out`` / ``.grad_input`` overload of a functional op kernel: its result (or results, in order) copied
    into the keyword arguments ``names`` (default ``out``), resized to fit; returns those tensors."""
    names = names or ("out",)

    def out_kernel(*args: Any, **kwargs: Any) -> Any:
        outs = [kwargs.pop(name) for name in names]
        results = kernel(*args, **kwargs)
        results = results if isinstance(results, tuple) else (results,)
        for result, out in zip(results, outs):
            copy_from_and_resize(result, out)
        return outs[0] if len(outs) == 1 else tuple(outs)
    return out_kernel


def _strides_for(t: torch.Tensor, memory_format: torch.memory_format | None) -> list[int]:
    if memory_format in (None, torch.preserve_format):
        return dense_strides_like(t)
    if memory_format == torch.contiguous_format:
        return contiguous_strides(t.shape)
    return list(torch.empty(t.shape, device="meta").contiguous(memory_format=memory_format).stride())


def to_copy(self: torch.Tensor, *, dtype: torch.dtype | None = None, layout: torch.layout | None = None,
            device: torch.device | None = None, pin_memory: bool | None = None,
            non_blocking: bool = False, memory_format: torch.memory_format | None = None) -> torch.Tensor:
    """``aten::_to_copy`` for opencl sources (ours: the generic one wants pinned host memory for
    ``non_blocking`` device→host copies, and PrivateUse1 has no pinned allocator in Python)."""
    target = self.device if device is None else torch.device(device)
    state.check_index(target)
    dtype = self.dtype if dtype is None else dtype
    if layout not in (None, torch.strided):
        raise RuntimeError(f"opencl tensors are strided; cannot convert to {layout}")
    if target.type == "opencl":
        out = memory.empty(self.shape, _strides_for(self, memory_format), dtype)
        if self.device.type == "opencl":
            device_copy(out, self)
        else:  # BackendSelect routes host->device _to_copy here by the target device
            upload_into(out, self)
        return out
    host = to_cpu(self, dtype)
    if memory_format not in (None, torch.preserve_format):
        host = host.contiguous(memory_format=memory_format)
    return host if target.type == "cpu" else host.to(target, non_blocking=non_blocking)


def pin_memory_cpu(self: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """CPU ``aten::_pin_memory`` while the backend is loaded: an unpinned copy.

    Once PrivateUse1 is registered it is torch's "current accelerator", so pinning without an
    explicit device asks our Python hooks for a pinned allocator, which Python cannot provide. Our
    uploads copy at buffer creation and never need pinned memory, so a plain copy is equivalent
    for ``DataLoader(pin_memory=True)``. Pinning for another device type is handed on unchanged.
    """
    if device is not None and torch.device(device).type not in ("opencl", "cpu"):
        return torch.ops.aten._pin_memory.default.redispatch(_DEFAULT_KERNEL_KEYS, self, device)
    return self.clone()


# Redispatching to a backend key that has no kernel of its own reaches the CompositeExplicitAutograd
# kernel we overrode for CPU (the same one every backend shares).
_DEFAULT_KERNEL_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse3)


state.provide(write_bytes=write_bytes, read_bytes=read_bytes)
