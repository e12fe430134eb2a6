"""The backend's one device and its kernel families, created on first use.

Only one device is possible: the Python DeviceGuard of ``torch._C._acc`` hard-codes one device, so
``opencl:0`` is whatever ``TUNECL_DEVICE`` selects (see :func:`tunecl.runtime.select_device`) and any
other index is refused by :func:`check_index`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyopencl as cl
import torch

from tunecl import runtime
from tunecl.errors import DeviceNotFoundError
from tunecl.problems import Problem
from tunecl.runtime import Device


class State:
    """The selected device plus lazily built kernel families (each compiles on first use).

    The backend reaches the device through a State only, so another one can stand in for the whole
    device (:func:`installed`). What touches the device:

    - ``device``: the kernel families launch through it (``defer``, and ``hold`` for a launch an in-place
      op may fuse into: ``replace_held``); its properties and limits decide what runs on it;
    - ``allocates``: whether the caching allocator gives storages device buffers;
    - ``write_bytes(buffer, offset, data)`` and ``read_bytes(data, buffer, offset)``: host↔device bytes
      (:func:`tunecl.backend.copies.write_bytes`, :func:`~tunecl.backend.copies.read_bytes`);
    - ``cl``: the OpenCL API buffer-to-buffer copies are enqueued through (``cl.enqueue_copy``: pyopencl,
      looked up per call, so graph capture and kernel profiling see the copies);
    - ``plan(problem)``: the conv/GEMM/attention plan serving a problem (:func:`tunecl.backend.plans.plan`);
    - ``on_fallback(name, reason)``: what a call about to take the CPU fallback does first
      (:func:`tunecl.backend.fallback.check_allowed`: warn, stay silent or raise).

    The class holds the real implementations (the modules that define them :func:`provide` them); a
    dry run's State (:mod:`tunecl.tools.coverage`) sets recording ones on itself.
    """

    allocates = True
    cl = cl
    # provided by tunecl.backend.copies, .plans and .fallback (imported with tunecl.backend, before any State)
    write_bytes: Callable[[cl.Buffer, int, np.ndarray], None]
    read_bytes: Callable[[np.ndarray, cl.Buffer, int], None]
    plan: Callable[[Problem], Any]
    on_fallback: Callable[[str, str], None]

    def __init__(self, device: Device):
        self.device = device
        # launches without profiling events cost less host time (NVIDIA: ~11 µs against ~16 µs);
        # measurements and tunecl.profiling.KernelProfile turn it on for their blocks
        device.set_profiling_default(False)

    @property
    def queue(self):
        """The device's queue (its deferred launches enqueued first: :meth:`Device.defer`)."""
        return self.device.queue

    @functools.cached_property
    def pointwise(self):
        from tunecl.kernels.ops.pointwise import Pointwise
        return Pointwise(self.device)

    @functools.cached_property
    def reduce(self):
        from tunecl.kernels.ops.reduce import Reduce
        return Reduce(self.device)

    def raise_index_fault(self) -> None:
        """torch's IndexError if a gather or scatter launched since the last call met an index out of range
        (its kernel skipped that element): one 4-byte read from the device, only after such launches."""
        family = self.__dict__.get("index")   # (not made here: no launch, no fault)
        if family is not None and family.take_fault():
            raise IndexError("index out of range in self: an index given to a gather, scatter or index_select on "
                             "the opencl device (or an op built on them: embedding, embedding_bag, take, ...) was "
                             "outside its dimension, and the element was skipped. It is reported here, at the "
                             "first wait for the device after that launch, as CUDA reports a device-side assert; "
                             "results computed since then are wrong")

    @functools.cached_property
    def index(self):
        from tunecl.kernels.ops.index import Index
        return Index(self.device)

    @functools.cached_property
    def softmax(self):
        from tunecl.kernels.ops.softmax import Softmax
        return Softmax(self.device)

    @functools.cached_property
    def norm(self):
        from tunecl.kernels.ops.norm import BatchNorm
        return BatchNorm(self.device)

    @functools.cached_property
    def pool(self):
        from tunecl.kernels.ops.pool import Pool
        return Pool(self.device)

    @functools.cached_property
    def loss(self):
        from tunecl.kernels.ops.loss import NllLoss
        return NllLoss(self.device)

    @functools.cached_property
    def ctc(self):
        from tunecl.kernels.ops.ctc import Ctc
        return Ctc(self.device)

    @functools.cached_property
    def optim(self):
        from tunecl.kernels.ops.optim import Optim
        return Optim(self.device)

    @functools.cached_property
    def random(self):
        from tunecl.kernels.ops.random import Random
        return Random(self.device)

    @functools.cached_property
    def transformer(self):
        from tunecl.kernels.ops.transformer import Transformer
        return Transformer(self.device)

    @functools.cached_property
    def upsample(self):
        from tunecl.kernels.ops.upsample import Upsample
        return Upsample(self.device)

    @functools.cached_property
    def group_norm(self):
        from tunecl.kernels.ops.group_norm import GroupNorm
        return GroupNorm(self.device)

    @functools.cached_property
    def scan(self):
        from tunecl.kernels.ops.scan import Scan
        return Scan(self.device)

    @functools.cached_property
    def index_nd(self):
        from tunecl.kernels.ops.index_nd import IndexNd
        return IndexNd(self.device)

    @functools.cached_property
    def sort(self):
        from tunecl.kernels.ops.sort import Sort
        return Sort(self.device)


SEAMS = ("write_bytes", "read_bytes", "plan", "on_fallback")


def provide(**implementations: Callable[..., Any]) -> None:
    """Make each function the real implementation of the :class:`State` seam it is named for (one of
    :data:`SEAMS`), for every State that does not set its own."""
    for name, function in implementations.items():
        if name not in SEAMS:
            raise ValueError(f"{name!r} is not a seam of the backend State ({', '.join(SEAMS)})")
        setattr(State, name, staticmethod(function))


_state: State | None = None
_lock = threading.Lock()


def get() -> State:
    """The backend state; selects the device (``TUNECL_DEVICE``) on first call.

    Raises:
        DeviceNotFoundError: no OpenCL device matches; the message lists those available.
    """
    global _state
    if _state is None:
        with _lock:
            if _state is None:
                _state = State(runtime.select_device())
    return _state


@contextlib.contextmanager
def installed(other: State) -> Iterator[State]:
    """Make ``other`` the backend's State for the block (every op, allocation and copy goes through it),
    then the selected device's again. Nothing checks what else runs meanwhile: the caller makes sure no
    real device work overlaps the block and that none of its tensors outlive it."""
    global _state
    previous = get()
    with _lock:
        _state = other
    try:
        yield other
    finally:
        with _lock:
            _state = previous


def device_if_available() -> Device | None:
    """The device, or None when no OpenCL device can be selected (for ``is_available``)."""
    try:
        return get().device
    except DeviceNotFoundError:
        return None


def check_index(device: torch.device | str | int | None) -> None:
    """Refuse any ``opencl`` device index but 0 with a clear error (never land on device 0)."""
    if device is None:
        return
    if isinstance(device, int):
        index = device
    else:
        if type(device) is not torch.device:   # (factories pass a torch.device: no new one)
            device = torch.device(device)
        if device.type != "opencl":
            return
        index = device.index
    if index not in (None, 0):
        raise RuntimeError(
            f"opencl:{index} does not exist: tunecl's pure-Python backend supports exactly one OpenCL "
            f"device, opencl:0 (choose it with TUNECL_DEVICE=<index|platform:device|name>; "
            f"`tunecl devices` lists them)")
