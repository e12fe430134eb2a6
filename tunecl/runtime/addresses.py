"""Buffers' device addresses, for kernels that take their pointers by value instead of as pointer arguments.

A launch's host cost on NVIDIA's driver grows with its pointer arguments (about 0.27 µs each to enqueue,
more to set), so the multi-tensor kernels (``optim.cl`` with ``ADDRESSES``) can instead read each tensor's
address from their by-value meta argument: one argument however many tensors a launch updates.

A buffer's address is learned once, by a kernel that stores its pointer argument, and kept on the
``cl.Buffer`` object (:func:`addresses`). OpenCL does not promise that a buffer keeps its address between
launches, nor that a buffer absent from a launch's arguments is resident during it, so a device uses
addresses only where :func:`usable` finds that it does: a probe that writes buffers through their
learned addresses and reads them back, once per device, and ``TUNECL_ADDRESSES`` not ``off``.

Lifetimes: a launch that reaches a buffer by its address does not hold it, as a pointer argument would.
The buffers addressed so are tensors' storages, which go back to the backend's caching allocator, not to
the driver, when their tensors die; the allocator waits for the queue before it gives buffers back to
the driver (``CachingAllocator._release_cache``), so no pending launch outlives its buffers.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl import config

_SOURCE = r"""
__kernel void address_of(__global const char *p, __global ulong *out, const int k) { out[k] = (ulong)p; }
typedef struct { ulong a[4]; } probe_t;
__kernel void write_by_address(const probe_t t) {
  const int k = (int)get_global_id(1), i = (int)get_global_id(0);
  ((__global float *)t.a[k])[i] = (float)(100 * k + i + 1);
}
"""
_address = operator.attrgetter("_tunecl_address")
_verdicts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # device -> "" (usable) or why not
launched = False   # whether some launch reached buffers by their addresses (set by its caller)
_lock = threading.Lock()


def addresses(device: Any, buffers: Sequence[cl.Buffer | None]) -> list[int]:
    """The device address of each buffer (0 for None), learning those not known yet (one launch per
    buffer and a read that waits for the queue)."""
    try:
        return list(map(_address, buffers))
    except AttributeError:   # some buffer's address not known yet, or a None
        pass
    unknown = list({id(b): b for b in buffers if b is not None and not hasattr(b, "_tunecl_address")}.values())
    if unknown:
        _learn(device, unknown)
    return [0 if b is None else b._tunecl_address for b in buffers]


def _learn(device: Any, buffers: list[cl.Buffer]) -> None:
    kernel = _kernel(device, "address_of")
    table = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 8 * len(buffers))
    queue = device.queue
    for k, buffer in enumerate(buffers):
        kernel.set_args(buffer, table, np.int32(k))
        cl.enqueue_nd_range_kernel(queue, kernel, (1,), None)
    found = np.empty(len(buffers), np.uint64)
    cl.enqueue_copy(queue, found, table)   # (waits)
    for buffer, address in zip(buffers, found.tolist()):
        buffer._tunecl_address = address


def _kernel(device: Any, name: str) -> cl.Kernel:
    # a kernel object of its own (not Device.kernel's shared one): its arguments are set here, under no lock
    return cl.Kernel(device.build(_SOURCE), name)


def usable(device: Any) -> bool:
    """Whether kernels may reach ``device``'s buffers by address (see the module docstring)."""
    return not reason_unusable(device)


def reason_unusable(device: Any) -> str:
    """"" where :func:`usable`, else why not."""
    if config.get().addresses == "off":
        return "TUNECL_ADDRESSES is off"
    verdict = _verdicts.get(device)
    if verdict is None:
        with _lock:
            verdict = _verdicts.get(device)
            if verdict is None:
                verdict = _verdicts[device] = _probe(device)
    return verdict


def _probe(device: Any) -> str:
    """Write four buffers through their learned addresses, one launch each round, and read them back."""
    try:
        items = 64
        buffers = [cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * items) for _ in range(4)]
        known = addresses(device, buffers)
        if len(set(known)) != len(known) or 0 in known:
            return f"the device gave the addresses {known}"
        kernel = _kernel(device, "write_by_address")
        queue = device.queue
        for _ in range(2):   # twice: an address still holds for a later launch
            for buffer in buffers:
                cl.enqueue_fill_buffer(queue, buffer, np.float32(0), 0, 4 * items)
            kernel.set_arg(0, np.array(known, np.uint64))
            cl.enqueue_nd_range_kernel(queue, kernel, (items, len(buffers)), None)
            for k, buffer in enumerate(buffers):
                got = np.empty(items, np.float32)
                cl.enqueue_copy(queue, got, buffer)
                if not np.array_equal(got, 100 * k + np.arange(items, dtype=np.float32) + 1):
                    return "a kernel writing buffers through their addresses did not reach them"
        return ""
    except cl.Error as error:
        return f"the probe failed: {error}"
