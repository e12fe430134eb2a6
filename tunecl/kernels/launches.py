"""Pre-built launches: the kernel launches of one plan call, recorded once and enqueued again with new buffers.

A plan's ``run`` re-derives on every call what depends only on its problem and the operands' layout
(the kernel variant, grids, offsets, scalars) and sets every kernel argument through pyopencl's
invoker. A caller that knows the call's signature (shapes, strides, storage offsets, dtypes, flags)
records one real call with :func:`recording` and turns it into :class:`Launches`: one copy of each
kernel with all its arguments set once, the call's own buffers (the *roles*: input, weight, output,
...) found by identity among them. A later call of the same signature binds its buffers to those
argument slots and enqueues the copies (``enqueue_nd_range_kernel``, no argument conversion).

While a graph capture or a :class:`~tunecl.profiling.KernelProfile` holds pyopencl's launch function
(``profiling.swap_lock``), :meth:`Launches.enqueue` goes through it instead, with the original kernels
and full argument lists, so the capture records and the profile sees exactly the launches ``run``
makes.

A recording refuses (:attr:`Recorder.refused`) a call that copies, waits for events other than those of
its own recorded launches (which the in-order queue orders anyway: a split reduction's second launch
waits for its first), passes other launch options, or gives one buffer two roles: such a call keeps
running through the plan.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl import profiling

_enqueue = cl.enqueue_nd_range_kernel


class Recorder:
    """The launches one thread made inside :func:`recording`, as (kernel, global size, local size, args)."""

    __slots__ = ("commands", "events", "queue", "refused", "thread")

    def __init__(self) -> None:
        self.commands: list[tuple[cl.Kernel, tuple[int, ...], tuple[int, ...] | None, tuple]] = []
        self.events: list[cl.Event] = []   # the recorded launches' events
        self.queue: cl.CommandQueue | None = None   # the queue of the first recorded launch
        self.refused: str | None = None
        self.thread = threading.get_ident()

    def own_events(self, events: Sequence[Any]) -> bool:
        """Whether every one of ``events`` is a recorded launch's (enqueued earlier on the same queue)."""
        return all(any(e is own for own in self.events) for e in events)

    def launches(self, roles: Sequence[Any]) -> Launches | None:
        """The recorded launches as :class:`Launches` whose buffer roles are ``roles`` (cl buffers, or None
        for a role the call did not have); None when the recording cannot be replayed."""
        if self.refused is not None or not self.commands:
            return None
        present = [r for r in roles if r is not None]
        if len({id(r) for r in present}) != len(present):   # one buffer in two roles: ambiguous
            return None
        where = {id(r): i for i, r in enumerate(roles) if r is not None}
        built = []
        for kernel, global_size, local_size, args in self.commands:
            slots = tuple((pos, where[id(a)]) for pos, a in enumerate(args)
                          if isinstance(a, cl.MemoryObjectHolder) and id(a) in where)
            # the recorded call's own buffers are not kept (each call binds its own)
            args = [None if any(pos == p for p, _ in slots) else a for pos, a in enumerate(args)]
            preset = preset_kernel(kernel, args)
            if preset is None:
                return None
            built.append((kernel, preset, global_size, local_size, args, slots))
        return Launches(built)


@contextlib.contextmanager
def recording() -> Iterator[Recorder | None]:
    """Record the kernel launches this thread makes in the block (they run as usual); yields None, and
    records nothing, while a graph capture or a KernelProfile holds pyopencl's launch functions."""
    if not profiling.swap_lock.acquire(blocking=False):
        yield None
        return
    recorder = Recorder()
    call, copy = cl.Kernel.__call__, cl.enqueue_copy
    thread = recorder.thread

    def recording_call(kernel: cl.Kernel, queue: cl.CommandQueue, global_size: Any, local_size: Any,
                       *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != thread:
            return call(kernel, queue, global_size, local_size, *args, **kwargs)
        wait_for = kwargs.get("wait_for")
        if any(v is not None for k, v in kwargs.items() if k != "wait_for") or (
                wait_for and not (queue is recorder.queue and recorder.own_events(wait_for))):
            recorder.refused = f"a launch of {kernel.function_name} with options"
        # by-value structs may be numpy arrays a caller reuses: keep their bytes as they were
        recorder.commands.append((kernel, tuple(global_size), None if local_size is None else tuple(local_size),
                                  tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)))
        event = call(kernel, queue, global_size, local_size, *args, **kwargs)
        if recorder.queue is None:
            recorder.queue = queue
        recorder.events.append(event)
        return event

    def recording_copy(queue: cl.CommandQueue, dest: Any, src: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == thread:
            recorder.refused = "a copy"
        return copy(queue, dest, src, **kwargs)

    cl.Kernel.__call__ = recording_call
    cl.enqueue_copy = recording_copy
    try:
        yield recorder
    finally:
        cl.Kernel.__call__, cl.enqueue_copy = call, copy
        profiling.swap_lock.release()


def preset_kernel(kernel: cl.Kernel, args: Sequence[Any]) -> cl.Kernel | None:
    """A new kernel object for ``kernel`` with ``args`` set once (its scalar dtypes as ``Device.kernel`` set
    them), so that enqueueing it costs no argument conversion; None for a kernel that cannot be copied so."""
    if not hasattr(kernel, "_tunecl_dtypes"):
        return None
    try:
        preset = cl.Kernel(kernel.program, kernel.function_name)
        if kernel._tunecl_dtypes is not None:
            preset.set_scalar_arg_dtypes(kernel._tunecl_dtypes)
        preset.set_args(*args)
    except (cl.Error, TypeError, ValueError):
        return None
    return preset


class RecordedRun:
    """One plan's run on one route of a pre-built call: its launches, recorded on first use (see
    :func:`recording`); False once a recording was refused (the plan runs itself from then on). Called
    with the device, the call's buffers by role and the function that runs the plan."""

    __slots__ = ("launches",)

    def __init__(self) -> None:
        self.launches: Any = None

    def __call__(self, device: Any, buffers: tuple, run: Callable[[], Any]) -> None:
        found = self.launches
        if found:
            found.enqueue(device.queue, buffers)
            return
        if found is None:
            device.flush()   # launches deferred before this call are not part of its recording
            with recording() as recorder:
                run()
            if recorder is not None:
                self.launches = recorder.launches(buffers) or False
            return
        run()


class Launches:
    """Recorded launches with their arguments set, whose role buffers each call binds anew."""

    __slots__ = ("_launches", "_lock")

    def __init__(self, launches: list[tuple]) -> None:
        self._launches = launches
        self._lock = threading.Lock()   # one call's bindings and enqueues stay together

    def __len__(self) -> int:
        return len(self._launches)

    def enqueue(self, queue: cl.CommandQueue, buffers: Sequence[Any]) -> None:
        """Enqueue every launch on ``queue``, in order, with ``buffers`` (by role) in their slots."""
        if profiling.swap_lock.locked():   # a capture or a profile watches the launch function
            for kernel, _, global_size, local_size, args, slots in self._launches:
                args = list(args)
                for pos, role in slots:
                    args[pos] = buffers[role]
                kernel(queue, global_size, local_size, *args)
            return
        with self._lock:
            for _, preset, global_size, local_size, _, slots in self._launches:
                if slots:
                    bind = []
                    for pos, role in slots:
                        bind += (pos, buffers[role])
                    preset._set_arg_multi(tuple(bind))
                _enqueue(queue, preset, global_size, local_size)


class Bound:
    """One launch of a family whose arguments but its buffers are fixed by a call's signature: a copy of
    the kernel with every other argument set once (scalars, packed meta, scratch, the absent operands'
    NULLs), its buffers bound per call to ``positions``.

    It is called as a deferred launch is (``bound(queue, global_size, local_size, binding)``, binding
    the flat ``(position, buffer, ...)`` tuple of :meth:`binding`), so it can wait in
    :meth:`tunecl.runtime.Device.defer`'s list like any launch: the buffers are bound when it is enqueued
    (OpenCL captures argument values at the enqueue). While a graph capture or a KernelProfile holds
    pyopencl's launch function (``profiling.swap_lock``) a caller launches :attr:`kernel` on
    :meth:`arguments` instead, so the capture records and the profile sees the family's own launch.
    """

    __slots__ = ("args", "function_name", "global_size", "kernel", "local_size", "positions", "preset", "_lock")

    def __init__(self, kernel: cl.Kernel, global_size: tuple[int, ...], local_size: tuple[int, ...] | None,
                 args: Sequence[Any], positions: Sequence[int], preset: cl.Kernel) -> None:
        self.kernel, self.global_size, self.local_size = kernel, global_size, local_size
        self.args, self.positions, self.preset = tuple(args), tuple(positions), preset
        self.function_name = kernel.function_name
        self._lock = threading.Lock()   # one binding and its enqueue stay together

    @classmethod
    def build(cls, kernel: cl.Kernel, global_size: tuple[int, ...], local_size: tuple[int, ...] | None,
              args: Sequence[Any], positions: Sequence[int]) -> Bound | None:
        """``kernel`` launched over the grid on ``args``, whose entries at ``positions`` (None here) each
        call binds; None for a kernel that cannot be copied with its arguments (see :func:`preset_kernel`)."""
        preset = preset_kernel(kernel, args)
        return None if preset is None else cls(kernel, global_size, local_size, args, positions, preset)

    def binding(self, buffers: Sequence[Any]) -> tuple:
        """The flat ``(position, buffer, ...)`` tuple that binds ``buffers`` (one per position, in order)."""
        bind: list[Any] = []
        for pos, buffer in zip(self.positions, buffers, strict=True):
            bind += (pos, buffer)
        return tuple(bind)

    def arguments(self, binding: tuple) -> list:
        """The full argument list of the launch with ``binding``'s buffers in their slots."""
        args = list(self.args)
        for i in range(0, len(binding), 2):
            args[binding[i]] = binding[i + 1]
        return args

    def __call__(self, queue: cl.CommandQueue, global_size: Any, local_size: Any, binding: tuple,
                 scalars: tuple = ()) -> None:
        """Bind ``binding``'s buffers (and ``scalars``: a flat ``(position, packed bytes, ...)`` tuple of
        by-value arguments) and enqueue the launch."""
        preset = self.preset
        with self._lock:
            preset._set_arg_multi(binding)
            if scalars:
                preset._set_arg_buf_multi(scalars)
            _enqueue(queue, preset, global_size, local_size)


class Twin:
    """The fused twins of a held launch (its op and the in-place op after it in one kernel, with the same
    grid and arguments, see :meth:`tunecl.runtime.Device.hold`): :attr:`kernel` ``(op)`` gives the kernel
    for the kernel's own launch, a call ``(op)`` its :class:`Bound`; None for an op the launch cannot take.
    Each is built when that op first folds into the launch."""

    __slots__ = ("_bound", "_made", "kernel")

    def __init__(self, bound: Bound, kernel: Any) -> None:
        self._bound, self.kernel = bound, kernel
        self._made: dict[str, Bound | None] = {}

    def __call__(self, op: str) -> Bound | None:
        made = self._made.get(op, self)
        if made is self:
            bound = self._bound
            kernel = self.kernel(op)
            made = None if kernel is None else Bound.build(kernel, bound.global_size, bound.local_size, bound.args,
                                                           bound.positions)
            if kernel is not None and made is None:
                raise RuntimeError(f"the fused twin of {bound.function_name} cannot be pre-built")
            self._made[op] = made
        return made
