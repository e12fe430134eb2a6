"""Device time per kernel: every OpenCL kernel launch and copy in a block, timed by its profiling event.

::

    with KernelProfile() as profile:
        run_some_iterations()
    rows = profile.summary()          # per kernel name: launches, device seconds

Every launch goes through ``pyopencl.Kernel.__call__`` (every copy through ``pyopencl.enqueue_copy``), so
the block swaps those two for versions that keep the event of each command, and puts every open device
on its profiling queue (:meth:`tunecl.runtime.Device.profiling`: the backend's queue does not profile
by default); nothing else changes and nothing waits early but that switch. Events are read when the summary is
asked for. Copies are named by direction (``copy host→device`` ...). The sum of the rows is the time the
device spent executing commands; next to the block's wall time it tells whether a run is bound by the
device or by the host (the queue is in order, so commands never overlap).

Only one profile may be active at a time (the swap is process-wide).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

# held while pyopencl's launch and copy functions are swapped, by a KernelProfile or a graph capture
# (tunecl.backend.graphs): one at a time, since each swaps them process-wide
swap_lock = threading.Lock()


@dataclass(frozen=True)
class ProfileRow:
    name: str
    launches: int
    seconds: float


def _copy_name(dest: Any, src: Any) -> str:
    to_device, from_device = isinstance(dest, cl.MemoryObjectHolder), isinstance(src, cl.MemoryObjectHolder)
    if to_device and from_device:
        return "copy device→device"
    return "copy host→device" if to_device else "copy device→host"


class KernelProfile:
    """Context manager recording the profiling event of every kernel launch and copy in its block."""

    def __init__(self) -> None:
        self._events: list[tuple[str, cl.Event]] = []
        self._names: dict[int, str] = {}
        self._saved: tuple[Any, Any] | None = None
        self._queues = contextlib.ExitStack()

    def __enter__(self) -> KernelProfile:  # noqa: PYI034 (final class in use)
        if not swap_lock.acquire(blocking=False):
            raise RuntimeError("a KernelProfile or a graph capture is already active")
        from tunecl import runtime

        for device in runtime.open_devices():
            self._queues.enter_context(device.profiling())
            # Launches deferred before the block belong to what ran before it: enqueued now, unrecorded. (A
            # switch to the profiling queue does this; a queue that profiles already would otherwise send
            # them from inside the block, where they were counted as its commands.)
            device.flush()
        call, copy = cl.Kernel.__call__, cl.enqueue_copy
        self._saved = call, copy
        events, names = self._events, self._names

        def profiled_call(kernel: cl.Kernel, *args: Any, **kwargs: Any) -> cl.Event:
            event = call(kernel, *args, **kwargs)
            name = names.get(id(kernel))
            if name is None:
                name = names[id(kernel)] = kernel.function_name
            events.append((name, event))
            return event

        def profiled_copy(queue: cl.CommandQueue, dest: Any, src: Any, **kwargs: Any) -> Any:
            event = copy(queue, dest, src, **kwargs)
            if isinstance(event, cl.Event):
                events.append((_copy_name(dest, src), event))
            return event

        cl.Kernel.__call__ = profiled_call
        cl.enqueue_copy = profiled_copy
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._saved is not None
        cl.Kernel.__call__, cl.enqueue_copy = self._saved
        self._saved = None
        try:
            self._queues.close()
        finally:
            swap_lock.release()

    @property
    def commands(self) -> int:
        return len(self._events)

    def summary(self) -> list[ProfileRow]:
        """Launches and device seconds per kernel (or copy direction), most time first.

        Waits for every recorded command to finish.
        """
        launches: dict[str, int] = {}
        seconds: dict[str, float] = {}
        for name, event in self._events:
            event.wait()
            launches[name] = launches.get(name, 0) + 1
            seconds[name] = seconds.get(name, 0.0) + (event.profile.end - event.profile.start) * 1e-9
        return sorted((ProfileRow(name, launches[name], seconds[name]) for name in launches),
                      key=lambda row: -row.seconds)
