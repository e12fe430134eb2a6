"""Events and streams of the opencl device: ``torch.opencl.Event``/``Stream``, and
``torch.Event``/``torch.Stream`` for ``device="opencl"``.

**One stream.** The device has one in-order command queue, and every ``Stream`` of ``opencl:0`` stands
for it (``stream_id`` 0): work "on a side stream" runs in submission order with everything else, so
code written for several CUDA streams stays correct, only without overlap. ``wait_stream`` and
``wait_event`` therefore have nothing to wait for; ``synchronize`` and ``query`` look at the whole queue.

**Events** are OpenCL markers enqueued on that queue. A timing event (``enable_timing=True``) adds an
empty one-work-item kernel on a profiling queue of its own that waits for the marker: its start timestamp
is the device clock once everything before the record had finished, and ``elapsed_time`` subtracts two of
them. (A kernel, not a second marker: NVIDIA's driver gives markers that wait on another queue's event
timestamps out of order. The backend's queue does not profile: a profiling queue costs host time on
every launch, see :class:`tunecl.runtime.Device`.)

**Why torch.Event is replaced.** The DeviceGuard that ``torch._C._acc`` gives a Python backend has
fixed no-op ``record``/``block`` and lacks ``synchronizeEvent``, ``elapsedTime`` and
``synchronizeDevice`` (torch raises "Backend doesn't support synchronizing events"); Python cannot
override them. So :func:`patch_torch_event_and_stream` makes ``torch.Event`` and ``torch.Stream``
classes whose constructors return :class:`Event`/:class:`Stream` for an opencl device and torch's own
objects otherwise; ``isinstance(x, torch.Event)`` keeps holding for both. Events and streams that
torch's C++ code creates for opencl (none of tunecl's paths) remain torch's no-op ones.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pyopencl as cl
import torch

from tunecl.backend import foreach_runs, graphs, state

BACKEND = "opencl"
_TorchEvent = torch.Event      # torch's classes, kept before patch_torch_event_and_stream replaces the names
_TorchStream = torch.Stream
QUERY_WAIT_S = 0.002    # Stream.query waits this long for its marker
_timing_queue: tuple[cl.CommandQueue, cl.Kernel] | None = None
_timing_lock = threading.Lock()
_TIMESTAMP_SOURCE = "__kernel void tunecl_timestamp(void) {}"


def _timing() -> tuple[cl.CommandQueue, cl.Kernel]:
    """The profiling queue that times events and its empty timestamp kernel (made on first use)."""
    global _timing_queue
    with _timing_lock:
        if _timing_queue is None:
            device = state.get().device
            queue = cl.CommandQueue(device.context, device.cl_device,
                                    properties=cl.command_queue_properties.PROFILING_ENABLE)
            kernel = cl.Program(device.context, _TIMESTAMP_SOURCE).build().tunecl_timestamp
            _timing_queue = (queue, kernel)
        return _timing_queue


def _opencl_device(device: Any) -> torch.device:
    """``device`` (None, an index, a string or a torch.device) as ``opencl:0``; other indices raise."""
    if device is None or isinstance(device, int):
        state.check_index(device)
        return torch.device(BACKEND, 0)
    device = torch.device(device)
    if device.type != BACKEND:
        raise ValueError(f"expected an opencl device, got {device}")
    state.check_index(device)
    return torch.device(BACKEND, 0)


def _check_stream(stream: Any) -> None:
    if stream is not None and not (isinstance(stream, _TorchStream) and stream.device.type == BACKEND):
        raise TypeError(f"expected a stream of the opencl device (torch.opencl.Stream), got {stream!r}")


def _status_complete(event: cl.Event) -> bool:
    status = event.command_execution_status
    if status < 0:
        raise RuntimeError(f"an OpenCL command before this event failed (status {status})")
    return status == cl.command_execution_status.COMPLETE


class Event(_TorchEvent):
    """``torch.cuda.Event`` for the opencl device: a marker in the device's queue.

    Args:
        device: ``opencl``/``opencl:0``/0 or None (only ``opencl:0`` exists).
        enable_timing: whether :meth:`elapsed_time` may use this event.
        blocking: accepted for ``torch.cuda.Event``'s signature; :meth:`synchronize` always blocks.
        interprocess: must be False: OpenCL events cannot be shared between processes.
    """

    def __new__(cls, device: Any = None, *, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False) -> Event:
        if interprocess:
            raise RuntimeError("opencl events cannot be shared between processes (interprocess=True): OpenCL "
                               "has no IPC for events")
        self = super().__new__(cls, device=_opencl_device(device), enable_timing=enable_timing,
                               blocking=blocking, interprocess=False)
        self._enable_timing = bool(enable_timing)
        self._marker: cl.Event | None = None   # in the device's queue
        self._timer: cl.Event | None = None    # the timestamp kernel in the timing queue, after the marker
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass   # (all done in __new__; torch.Event has no __init__ of its own)

    def record(self, stream: Stream | None = None) -> None:
        """Record the event after everything enqueued so far (on the one stream)."""
        _check_stream(stream)
        if graphs.capturing():
            raise graphs.GraphCaptureError("an event cannot be recorded in a graph capture (a replay would "
                                           "not record it); record events around the replay")
        foreach_runs.flush()
        queue = state.get().queue   # (the property enqueues the deferred launches first)
        self._marker = cl.enqueue_marker(queue)
        if self._enable_timing:
            queue.flush()   # the timing queue waits on this marker: it must reach the device
            timing, timestamp = _timing()
            self._timer = cl.enqueue_nd_range_kernel(timing, timestamp, (1,), None, wait_for=[self._marker])
            timing.flush()

    def query(self) -> bool:
        """Whether the work recorded before this event has finished (True if never recorded)."""
        if self._marker is None:
            return True
        if _status_complete(self._marker):
            return True
        state.get().device.queue.flush()   # let a polling loop make progress
        return False

    def synchronize(self) -> None:
        """Wait until the work recorded before this event has finished (returns at once if never recorded)."""
        if self._marker is not None:
            self._marker.wait()
            _status_complete(self._marker)

    def wait(self, stream: Stream | None = None) -> None:
        """Make future work on ``stream`` wait for this event: already so, with one in-order queue."""
        _check_stream(stream)

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds of device time from this event's record to ``end_event``'s (waits for both).

        Raises:
            RuntimeError: either event was made without ``enable_timing=True`` or never recorded, or the
                driver keeps no timestamps for them.
        """
        if not isinstance(end_event, Event):
            raise TypeError(f"expected a torch.opencl.Event, got {end_event!r}")
        if not (self._enable_timing and end_event._enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._timer is None or end_event._timer is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        try:
            end_event._timer.wait()
            self._timer.wait()
            return (end_event._timer.profile.start - self._timer.profile.start) * 1e-6
        except cl.Error as error:
            raise RuntimeError(f"the OpenCL driver gave no timestamps for the events: "
                               f"{error}") from None

    def ipc_handle(self) -> Any:
        raise RuntimeError("opencl events cannot be shared between processes: OpenCL has no IPC for events")

    def __repr__(self) -> str:
        state_ = "unrecorded" if self._marker is None else "recorded"
        return f"torch.opencl.Event(device=opencl:0, enable_timing={self._enable_timing}, {state_})"


class Stream(_TorchStream):
    """``torch.cuda.Stream`` for the opencl device. Every stream is the device's one in-order queue (see the
    module docstring), so they compare equal; ``priority`` is accepted and has no effect."""

    def __new__(cls, device: Any = None, priority: int = 0) -> Stream:
        return super().__new__(cls, device=_opencl_device(device), priority=priority)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def query(self) -> bool:
        """Whether all work enqueued so far has finished.

        OpenCL can only tell by a marker enqueued now, which even an idle queue completes a little later
        (tens of µs on PoCL), so this waits for it up to ``QUERY_WAIT_S`` before answering False."""
        marker = self.record_event()._marker
        state.get().queue.flush()
        deadline = time.perf_counter() + QUERY_WAIT_S
        while not _status_complete(marker):
            if time.perf_counter() > deadline:
                return False
        return True

    def synchronize(self) -> None:
        """Wait until all work enqueued so far has finished."""
        foreach_runs.flush()
        state.get().device.synchronize()

    def wait_event(self, event: Event) -> None:
        """Make future work wait for ``event``: already so, with one in-order queue."""
        if not isinstance(event, Event):
            raise TypeError(f"expected a torch.opencl.Event, got {event!r}")

    def wait_stream(self, stream: Stream) -> None:
        """Make future work wait for ``stream``'s: already so, every stream being the same queue."""
        _check_stream(stream)

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) on this stream and return it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def native_handle(self) -> int:
        """The ``cl_command_queue`` in use, as an integer (like ``torch.cuda.Stream.cuda_stream``)."""
        return state.get().device.queue.int_ptr

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:
        return "torch.opencl.Stream(device=opencl:0, the device's one queue)"


def current_stream(device: Any = None) -> Stream:
    """The stream work is enqueued on: the device's one queue."""
    return Stream(device)


default_stream = current_stream


def set_stream(stream: Stream) -> None:
    """Select ``stream`` (every opencl stream is the same queue: only checks it is one)."""
    _check_stream(stream)


class StreamContext:
    """``torch.cuda.StreamContext``: selects ``stream`` for a block (None: no change). Every opencl stream
    is the same queue, so entering only checks it is one."""

    def __init__(self, stream: Stream | None):
        _check_stream(stream)
        self.stream = stream

    def __enter__(self) -> Stream | None:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        return None


def stream(stream: Stream | None) -> StreamContext:
    """``torch.cuda.stream(s)``: a context manager selecting ``s`` (see :class:`StreamContext`)."""
    return StreamContext(stream)


# -- torch.Event and torch.Stream ------------------------------------------------------------------------
def _is_opencl(device: Any) -> bool:
    """Whether a ``device=`` argument of torch.Event/torch.Stream means the opencl device (None: when opencl
    is the current accelerator, as torch picks; an index is one of the current accelerator's)."""
    if device is None or isinstance(device, int):
        current = torch.accelerator.current_accelerator()
        return current is not None and current.type == BACKEND
    return torch.device(device).type == BACKEND


class _InstancesOf(type):
    """Metaclass keeping ``isinstance``/``issubclass`` against the replaced torch class true for torch's own
    objects and subclasses (``torch.cuda.Event`` and events made by C++)."""

    _wraps: type

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._wraps)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._wraps)


def _dispatching(name: str, torch_class: type, ours: type) -> type:
    """A stand-in for ``torch_class`` (``torch.<name>``) whose constructor makes ``ours`` for the opencl
    device and ``torch_class``'s own object for any other."""
    def __new__(cls: type, device: Any = None, **kwargs: Any) -> Any:
        if _is_opencl(device):
            return ours(device, **kwargs)
        return torch_class(**kwargs) if device is None else torch_class(device, **kwargs)

    return _InstancesOf(name, (torch_class,), {"__new__": __new__, "__doc__": torch_class.__doc__,
                                               "_wraps": torch_class, "__module__": "torch", "__qualname__": name})


_DeviceEvent = _dispatching("Event", _TorchEvent, Event)
_DeviceStream = _dispatching("Stream", _TorchStream, Stream)


def patch_torch_event_and_stream() -> None:
    """Make ``torch.Event(device="opencl")`` and ``torch.Stream(device="opencl")`` the device's (once)."""
    if torch.Event is _TorchEvent:
        torch.Event = _DeviceEvent
    if torch.Stream is _TorchStream:
        torch.Stream = _DeviceStream
