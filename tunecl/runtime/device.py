"""The :class:`Device`: one OpenCL device's context and queues, deferred launches, its program and kernel
caches, buffers and copies, and event timing."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl import config
from tunecl.errors import BuildError
from tunecl.runtime.build import build_program, default_build_options
from tunecl.runtime.devices import DeviceEntry, fingerprint_of
from tunecl.runtime.probes import capability_probes

AUTO_LAUNCH_BATCH = 32  # Device.defer's batch on CPU devices (TUNECL_LAUNCH_BATCH=auto)
AUTO_FLUSH_EVERY = 16  # Device.queue submits (clFlush) every this many uses on non-CPU devices (TUNECL_FLUSH_EVERY=auto)


class Device:
    """One OpenCL device: context, in-order queue, program/kernel caches, buffers, timing.

    The queue profiles its commands (every event carries device timestamps) unless
    :meth:`set_profiling_default` turned that off, as the PyTorch backend does: on NVIDIA's driver a launch
    on a profiling queue costs ~16 µs of host time against ~11 µs without (``benchmarks/launch_cost.py``
    on the H200). Whatever reads event times (the tuner's measurements, :class:`tunecl.profiling.KernelProfile`)
    does so inside :meth:`profiling`, which moves the device to its profiling queue for the block.
    """

    def __init__(self, entry: DeviceEntry):
        self.entry = entry
        self.index = entry.index
        self.cl_device = entry.cl_device
        self.name = entry.name
        self.fingerprint = fingerprint_of(entry.cl_device, entry.platform)
        self.context = cl.Context([entry.cl_device])
        self._profiling_queue = cl.CommandQueue(self.context, entry.cl_device,
                                                properties=cl.command_queue_properties.PROFILING_ENABLE)
        self._plain_queue: cl.CommandQueue | None = None  # made when profiling is first turned off
        self._queue = self._profiling_queue  # the queue in use: one of the two
        self._profile_by_default = True
        self._profiling_depth = 0  # open profiling() blocks
        self._queue_lock = threading.RLock()
        settings = config.get()
        cpu = self.fingerprint.device_type == "cpu"
        batch = settings.launch_batch
        self.launch_batch = (AUTO_LAUNCH_BATCH if cpu else 0) if batch is None else batch
        every = settings.flush_every
        self.flush_every = (0 if cpu else AUTO_FLUSH_EVERY) if every is None else every
        self._queue_uses = 0
        self._deferred: list[tuple[cl.Kernel, tuple[int, ...], tuple[int, ...] | None, list]] = []
        self._deferred_lock = threading.RLock()  # reentrant: a finalizer run by the GC mid-flush may flush
        self._held: tuple[object, tuple, Callable[[str], Any] | None, object] | None = None   # see hold()
        self.local_mem_size = int(entry.cl_device.local_mem_size)
        self.max_work_group_size = int(entry.cl_device.max_work_group_size)
        self.max_alloc_size = int(entry.cl_device.max_mem_alloc_size)
        self._programs: dict[tuple[str, tuple[str, ...]], cl.Program] = {}
        self._kernels: dict[tuple[int, str], cl.Kernel] = {}
        self._lock = threading.RLock()
        self._capabilities: frozenset[str] | None = None
        self._default_options = default_build_options(entry.cl_device)

    @property
    def capabilities(self) -> frozenset[str]:
        """Optional features a probe showed this device to have (``{"mma_tf32", "cp_async", "mma_f16", "wgmma"}``; empty
        on PoCL).

        Not part of the fingerprint: the fingerprint key (model and driver) determines them, and the DB
        keys results by fingerprint, so adding them there would only change existing keys. Probed on
        first use (see :func:`capability_probes`), then kept.
        """
        with self._lock:
            if self._capabilities is None:
                self._capabilities = frozenset(
                    name for name, reason in capability_probes(self).items() if not reason)
            return self._capabilities

    def __repr__(self) -> str:
        return f"<tunecl.Device {self.index}: {self.name} [{self.entry.platform}]>"

    # -- the queue and deferred launches -----------------------------------------------------------
    @property
    def queue(self) -> cl.CommandQueue:
        """The in-order queue in use (see the class docstring), with every deferred launch enqueued first:
        whatever the caller enqueues next, or waits for, comes after them (see :meth:`defer`)."""
        if self._deferred:
            self.flush()
        if self.flush_every:
            # Submit what was enqueued so far every few uses (each launch, copy or wait uses the queue
            # once): NVIDIA's driver otherwise holds a non-profiling queue's commands back, and the
            # device idles while the host enqueues (resnet50 batch 16 training on the H200: 83.4 ms per
            # step without, 73.8 ms flushing every 16 uses; inference 18.5 -> 17.1 ms).
            self._queue_uses += 1
            if self._queue_uses >= self.flush_every:
                self._queue_uses = 0
                self._queue.flush()
        return self._queue

    @property
    def profiles(self) -> bool:
        """Whether commands enqueued now get events with device timestamps."""
        return self._queue is self._profiling_queue

    def set_profiling_default(self, enabled: bool) -> None:
        """Profile commands outside :meth:`profiling` blocks (``True``, the default) or not."""
        with self._queue_lock:
            self._profile_by_default = enabled
            if not self._profiling_depth:
                self._use_queue(enabled)

    @contextlib.contextmanager
    def profiling(self):
        """A block whose commands get profiling events (blocks nest; the queue switches back after the
        outermost). Switching queues waits for everything enqueued on the previous one, so commands stay
        in order; inside a block that was already profiling it costs nothing."""
        with self._queue_lock:
            self._profiling_depth += 1
            if self._profiling_depth == 1:
                self._use_queue(True)
        try:
            yield self
        finally:
            with self._queue_lock:
                self._profiling_depth -= 1
                if not self._profiling_depth:
                    self._use_queue(self._profile_by_default)

    def _use_queue(self, profiling: bool) -> None:  # with _queue_lock held
        if profiling:
            target = self._profiling_queue
        else:
            if self._plain_queue is None:
                self._plain_queue = cl.CommandQueue(self.context, self.cl_device)
            target = self._plain_queue
        if target is self._queue:
            return
        self.flush()  # deferred launches belong to the queue in use so far
        self._queue.finish()
        self._queue = target

    def defer(self, kernel: cl.Kernel, global_size: tuple[int, ...], local_size: tuple[int, ...] | None,
              args: list) -> None:
        """Launch ``kernel`` on ``args`` after the launches deferred before it, possibly later.

        On a CPU device the driver's worker threads share the host's cores and sleep between commands;
        enqueueing one small kernel at a time wakes them every time (PoCL: 4 µs per enqueue back to back,
        9-11 µs when the host spends 10-20 µs between them). So the backend's elementwise launches wait in
        a list of up to ``launch_batch`` and are enqueued together, which keeps the workers busy. Order
        is never changed: any use of :attr:`queue` (every other enqueue, read, copy and
        :meth:`synchronize`) enqueues the waiting launches first, and ``args`` keep their buffers alive.
        A launch that fails to enqueue raises from the call that flushed it. With ``launch_batch`` 0 or
        1 the kernel is enqueued now.
        """
        if self.launch_batch <= 1:  # (through the property: launches deferred under an earlier batch go first)
            kernel(self.queue, global_size, local_size, *args)
            return
        with self._deferred_lock:
            self._deferred.append((kernel, global_size, local_size, args))
            if len(self._deferred) < self.launch_batch:
                return
            waiting, self._deferred = self._deferred, []
            self._enqueue(waiting)

    def hold(self, kernel: cl.Kernel, global_size: tuple[int, ...], local_size: tuple[int, ...] | None,
             args: list, tag: object, fused: Callable[[str], Any] | None, payload: object = None) -> None:
        """Defer one launch, whatever ``launch_batch`` is, so that the op right after it may run
        ``fused(op)`` (a kernel with the same grid and arguments that also does ``op``'s work; None where
        the launch cannot take that op) instead, by :meth:`replace_held` with the same ``tag``, or do its
        work itself, by :meth:`take_held` (which hands it ``payload``). Like every deferred launch it is
        enqueued, in order, with the next use of :attr:`queue`."""
        entry = (kernel, global_size, local_size, args)
        with self._deferred_lock:
            # what waits already goes first, as defer would send it (a run of held launches never piles up)
            if self._deferred and (self.launch_batch <= 1 or len(self._deferred) >= self.launch_batch):
                self.queue   # noqa: B018 (the property enqueues the waiting launches and counts the use)
            self._deferred.append(entry)
            self._held = (tag, entry, fused, payload)

    def replace_held(self, tag: object, op: str = "relu") -> bool:
        """Launch the launch held under ``tag`` fused with ``op`` instead of it, if that is still the last
        deferred launch and it has a fused kernel for ``op``; False when it was enqueued already, another
        launch came after it, or it cannot take ``op``."""
        with self._deferred_lock:
            held = self._last_held(tag)
            if held is None:
                return False
            fused = None if held[2] is None else held[2](op)
            if fused is None:
                return False
            _, global_size, local_size, args = held[1]
            self._deferred[-1] = (fused, global_size, local_size, args)
            self._held = None
            return True

    @property
    def holding(self) -> bool:
        """Whether a launch is held (it may have been enqueued since: :meth:`take_held` tells)."""
        return self._held is not None

    def peek_held(self, tag: object) -> object:
        """The ``payload`` of the launch held under ``tag`` if it is still the last deferred launch (it stays
        held), else None: what a caller prepares with before :meth:`take_held`."""
        with self._deferred_lock:
            held = self._last_held(tag)
            return None if held is None else held[3]

    def take_held(self, tag: object) -> object:
        """Drop the launch held under ``tag`` and return its ``payload``, if it is still the last deferred
        launch: the caller does its work inside a launch of its own instead. None where it was enqueued
        already or another launch came after it (it then runs, or ran, as held)."""
        with self._deferred_lock:
            held = self._last_held(tag)
            if held is None:
                return None
            self._deferred.pop()
            self._held = None
            return held[3]

    def _last_held(self, tag: object) -> tuple | None:   # with _deferred_lock held
        """The held launch's record if it is held under ``tag`` and still the last deferred launch."""
        held = self._held
        if held is None or held[0] != tag or not self._deferred or self._deferred[-1] is not held[1]:
            return None
        return held

    def flush(self) -> None:
        """Enqueue every deferred launch now (in order)."""
        with self._deferred_lock:
            waiting, self._deferred = self._deferred, []
            self._enqueue(waiting)

    def _enqueue(self, waiting: list) -> None:  # with _deferred_lock held, so flushes keep their order
        self._held = None
        for index, (kernel, global_size, local_size, args) in enumerate(waiting):
            try:
                kernel(self._queue, global_size, local_size, *args)
            except cl.Error as error:
                error.add_note(f"(a deferred launch of {kernel.function_name}; the {len(waiting) - index - 1} "
                               f"deferred launches after it were dropped)")
                raise

    # -- programs and kernels ---------------------------------------------------------------------
    def build(self, source: str, options: Sequence[str] = ()) -> cl.Program:
        """Compile ``source`` with ``options`` (``-DNAME=VALUE`` ...), once per process.

        The in-process cache is keyed by (source hash, options); the device and driver are fixed per
        ``Device``. An on-disk cache spares recompiles across processes: the binaries in
        ``TUNECL_CACHE_DIR`` (pyopencl's, or for PoCL :func:`build_program`'s), or NVIDIA's driver's own
        cache; all are disposable and kept apart from tuning data.

        Raises:
            BuildError: the compiler rejected the program; the message carries the build log.
        """
        options = tuple(options) + tuple(o for o in self._default_options if o not in options)
        key = (hashlib.sha256(source.encode()).hexdigest(), options)
        with self._lock:
            program = self._programs.get(key)
            if program is not None:
                return program
        cache_dir = Path(config.get().cache_dir) / "pyopencl"
        cache_dir.mkdir(parents=True, exist_ok=True)
        try:
            with warnings.catch_warnings():
                # NVIDIA's compiler logs on every build ("Non-empty compiler output" warnings, one per
                # program, say nothing to a user); PYOPENCL_COMPILER_OUTPUT=1 shows the logs again.
                if not os.environ.get("PYOPENCL_COMPILER_OUTPUT"):
                    warnings.simplefilter("ignore", cl.CompilerWarning)
                program = build_program(self.context, self.cl_device, source, options, str(cache_dir))
        except cl.Error as error:
            raise BuildError(f"OpenCL build failed on {self.name} with options {' '.join(options)}:\n"
                             f"{error}") from None
        with self._lock:
            return self._programs.setdefault(key, program)

    def kernel(self, program: cl.Program, name: str, scalar_dtypes: Sequence[Any] | None = None) -> cl.Kernel:
        """Fetch kernel ``name`` of ``program`` once, with scalar argument dtypes set for fast launches.

        Args:
            scalar_dtypes: one entry per kernel argument: a numpy dtype for scalars, ``None`` for
                buffers and local memory. Without it pyopencl spends ~6 µs per scalar per launch.
        """
        key = (id(program), name)
        with self._lock:
            kernel = self._kernels.get(key)
            if kernel is None:
                kernel = cl.Kernel(program, name)
                if scalar_dtypes is not None:
                    kernel.set_scalar_arg_dtypes(list(scalar_dtypes))
                # (graphs make copies of a kernel with their own arguments: they need the same dtypes)
                kernel._tunecl_dtypes = None if scalar_dtypes is None else list(scalar_dtypes)
                self._kernels[key] = kernel
                # keep the program alive as long as its kernels are cached (id() must stay unique)
                kernel._tunecl_program = program
            return kernel

    def kernel_max_threads(self, kernel: cl.Kernel) -> int:
        """The most work-items per work-group ``kernel`` can launch with here: the device's limit, or
        fewer where each work-item needs many registers (CL_KERNEL_WORK_GROUP_SIZE)."""
        return int(kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.cl_device))

    def launch(self, kernel: cl.Kernel, global_size: Sequence[int], local_size: Sequence[int] | None,
               *args: Any, wait_for: Sequence[cl.Event] | None = None) -> cl.Event:
        """Enqueue ``kernel`` over ``global_size`` (rounded by the caller) without waiting."""
        return kernel(self.queue, tuple(global_size), None if local_size is None else tuple(local_size),
                      *args, wait_for=wait_for)

    # -- memory -------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> cl.Buffer:
        """A device buffer of ``nbytes`` (at least 1 byte: OpenCL forbids empty buffers)."""
        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size=max(int(nbytes), 1))

    def upload(self, array: np.ndarray) -> cl.Buffer:
        """A new device buffer holding a copy of ``array`` (copied synchronously)."""
        array = np.ascontiguousarray(array)
        buffer = self.alloc(array.nbytes)
        if array.nbytes:
            cl.enqueue_copy(self.queue, buffer, array, is_blocking=True)
        return buffer

    def copyin(self, buffer: cl.Buffer, array: np.ndarray, offset: int = 0, wait: bool = True) -> cl.Event:
        """Copy host ``array`` into ``buffer`` at byte ``offset``."""
        array = np.ascontiguousarray(array)
        return cl.enqueue_copy(self.queue, buffer, array, dst_offset=offset, is_blocking=wait)

    def copyout(self, array: np.ndarray, buffer: cl.Buffer, offset: int = 0) -> np.ndarray:
        """Copy ``array.nbytes`` bytes of ``buffer`` from byte ``offset`` into contiguous ``array``."""
        if array.nbytes:
            cl.enqueue_copy(self.queue, array, buffer, src_offset=offset, is_blocking=True)
        return array

    def download(self, buffer: cl.Buffer, shape: Sequence[int], dtype: Any = np.float32,
                 offset: int = 0) -> np.ndarray:
        return self.copyout(np.empty(tuple(shape), dtype=dtype), buffer, offset)

    def synchronize(self) -> None:
        self.queue.finish()

    # -- timing -------------------------------------------------------------------------------------
    @staticmethod
    def elapsed(first: cl.Event, last: cl.Event | None = None) -> float:
        """Seconds of device time from the start of ``first`` to the end of ``last`` (or ``first``)."""
        last = first if last is None else last
        last.wait()
        return (last.profile.end - first.profile.start) * 1e-9
