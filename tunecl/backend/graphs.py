"""Graphs: record the device work of a block of Python once, replay it without running the Python again.

The opencl counterpart of ``torch.cuda.CUDAGraph``. Every op of the backend pays for torch's dispatch,
its Python implementation and a pyopencl call; a replay pays only for the enqueue of each recorded
command, so a step bound by the host (small batches, a slow host, a fast GPU) runs as fast as the device
allows::

    optimizer = torch.optim.Adam(model.parameters(), fused=True)   # its step count lives on the device
    static_x, static_y = x.to("opencl"), y.to("opencl")
    train_step(static_x, static_y)               # warm up eagerly: the optimizer creates its state
    g = torch.opencl.Graph()
    optimizer.zero_grad(set_to_none=True)
    with torch.opencl.graph(g):                  # runs the block once, recording its commands
        static_loss = F.cross_entropy(model(static_x), static_y)
        static_loss.backward()
        optimizer.step()
    for x, y in loader:
        static_x.copy_(x); static_y.copy_(y)     # new inputs into the same tensors, outside the graph
        g.replay()                               # the recorded kernels and copies, on the same buffers

What is recorded: every kernel launch and device→device copy enqueued while the block runs, from any
thread (autograd's backward thread included), with the arguments they had: the same buffers, sizes and
scalars. The block itself runs eagerly, so its results are real. A replay enqueues those commands in
order on the device's queue and returns without waiting, like any op.

So, as with CUDA graphs:

- Keep the tensors the block reads (its static inputs, the weights) alive: a tensor that dies during the
  capture lends its buffer to later temporaries of the block, which every replay then writes.
- Tensors created in the block (outputs, the gradients a backward creates while ``.grad`` is None) are
  rewritten in place by every replay; keep references to them and do not zero or replace the gradients
  between replays (a backward into existing ``.grad`` records the accumulation, which every replay
  repeats).
- Python numbers and CPU scalars given to ops, shapes, and every choice the backend made (plans,
  kernels) are frozen at capture.
- The buffers the recording touches stay reserved for the graph while it lives: the allocator never gives
  them to another tensor, which a replay would overwrite. :meth:`Graph.reset` (or dropping the graph)
  gives them back.

Warm up before capturing (run the step eagerly once): state created inside the block (an optimizer's
moments, lazily built buffers) would be initialised again by every replay. An optimizer step may be
captured when its step count lives on the device (``fused=True``, or ``capturable=True``) and it has run
before; otherwise the capture refuses it (a host-side count would freeze its bias correction). A learning
rate given as a Python number is frozen like any other.

Random numbers: outside graphs the backend draws them from torch's CPU generator and uploads them (dropout's
masks and ``bernoulli_(p)``: on the device under a key from that generator, see
:mod:`tunecl.backend.random_draws`). Inside
a capture, ``bernoulli_`` with a float probability on a contiguous float32 tensor (dropout's masks,
stochastic depth) draws on the device instead, from the graph's own Philox generator (keyed from torch's
CPU generator at capture, its counter advanced on the device), so every replay draws new masks; the
capture's and the replays' numbers differ from what the CPU generator would have given. A graph made
with ``Graph(random_on_host=True)`` (the compiled graphs of :mod:`tunecl.backend.compile`) draws dropout's
masks and ``bernoulli_`` on the host instead, from torch's CPU generator as eager ops do, and uploads them
before each replay (outside its recorded commands): a replay draws what an eager run would, at the cost
of the host's draw and upload.

Not capturable (the capture raises :class:`GraphCaptureError` and records nothing): copies from or to
host memory (``x.to("opencl")``, ``.cpu()``, ``.item()``, printing a tensor, the CPU fallback) and the
other random ops (they draw on the host and upload: a replay would repeat the same numbers), a capture inside a
capture or while a :class:`tunecl.profiling.KernelProfile` is active (both swap pyopencl's launch and
copy functions process-wide). Nothing else may use the device while a block is captured. Weights'
A Winograd convolution that reads its weight's cached transform records that read only; every replay
first checks the weight's version counter and transforms it again if it was written since. A transform
made during the capture (the weight was written after it was cached, as by an optimizer step between the
warm-up and the capture; or an inference tensor, which has no counter) is recorded in the graph instead,
and every replay makes it at that point, with no check before.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyopencl as cl
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from tunecl import profiling
from tunecl.backend import foreach_runs, memory, state
from tunecl.kernels.launches import preset_kernel


class GraphCaptureError(RuntimeError):
    """The block being captured did something a replay could not repeat (see the module docstring)."""


_active: Graph | None = None        # the graph being captured (set and cleared under profiling's lock)


def capturing() -> bool:
    """Whether a graph capture is in progress."""
    return _active is not None


def active() -> Graph | None:
    """The graph being captured, if any."""
    return _active


def check_not_capturing(what: str) -> None:
    """Raise :class:`GraphCaptureError` naming ``what`` when a capture is in progress."""
    if _active is not None:
        raise GraphCaptureError(f"{what} cannot be captured in a graph (it moves data between the host and "
                                f"the device); do it before the capture or after the replay")


class Graph:
    """Recorded device commands and the buffers they use (see the module docstring)."""

    def __init__(self, random_on_host: bool = False) -> None:
        self.random_on_host = random_on_host   # random numbers drawn on the host each replay (see draw_on_host)
        self._commands: list[tuple] = []
        self._buffers: list[cl.MemoryObjectHolder] = []   # each once; reserved with the allocator
        self._presets: list[cl.Kernel | None] = []        # per command: its kernel with its arguments set
        self._before_replay: list[Callable[[], None]] = []   # run before each replay (see before_each_replay)
        self._random: cl.Buffer | None = None               # key and counter of the graph's random numbers
        self._captured = False
        self._device: Any = None
        self.replays = 0                                     # replays so far (see uses_buffer)
        self._buffer_ids: frozenset[int] = frozenset()

    # -- capture -----------------------------------------------------------------------------------
    def capture_begin(self) -> None:
        """Start recording (prefer the :func:`graph` context manager)."""
        global _active
        if self._captured:
            raise GraphCaptureError("this graph already holds a capture; reset() it first")
        device = state.get().device
        foreach_runs.flush()   # (a run of foreach calls made before the capture is not part of it)
        if not profiling.swap_lock.acquire(blocking=False):
            raise GraphCaptureError("cannot capture while another graph is being captured or a KernelProfile "
                                    "is active")
        try:
            device.flush()   # launches deferred before the capture are not part of it
            self._optimizer_hooks = (register_optimizer_step_pre_hook(_check_optimizer),
                                     register_optimizer_step_post_hook(_check_optimizer_state))
        except BaseException:
            profiling.swap_lock.release()
            raise
        _active = self
        self._device = device
        self._commands = []
        self._before_replay = []
        self._saved = cl.Kernel.__call__, cl.enqueue_copy
        call, copy = self._saved
        commands = self._commands
        context = device.context.int_ptr

        def recording_call(kernel: cl.Kernel, queue: cl.CommandQueue, global_size: Any, local_size: Any,
                           *args: Any, **kwargs: Any) -> Any:
            event = call(kernel, queue, global_size, local_size, *args, **kwargs)
            if queue.context.int_ptr != context:   # another context's work (a capability probe's): not ours
                return event
            kwargs.pop("wait_for", None)   # the queue is in order; events of the capture are long gone
            # by-value structs may be numpy arrays a caller reuses: keep their bytes as they were
            args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
            commands.append((True, kernel, global_size, local_size, args, kwargs))
            return event

        def recording_copy(queue: cl.CommandQueue, dest: Any, src: Any, **kwargs: Any) -> Any:
            if queue.context.int_ptr != context:
                return copy(queue, dest, src, **kwargs)
            if not (isinstance(dest, cl.MemoryObjectHolder) and isinstance(src, cl.MemoryObjectHolder)):
                raise GraphCaptureError("a copy between host memory and the device (.to(), .cpu(), .item(), "
                                        "printing, the CPU fallback) cannot be captured in a graph; copy "
                                        "inputs into static device tensors before the capture and read "
                                        "results after the replay")
            event = copy(queue, dest, src, **kwargs)
            kwargs.pop("wait_for", None)
            kwargs.pop("is_blocking", None)
            commands.append((False, dest, src, None, (), kwargs))
            return event

        cl.Kernel.__call__ = recording_call
        cl.enqueue_copy = recording_copy

    def capture_end(self, keep: bool = True) -> None:
        """Stop recording; with ``keep`` False (the block raised) the recording is dropped."""
        global _active
        try:
            if keep:
                self._device.flush()   # deferred launches of the block are recorded as they enqueue
        finally:
            cl.Kernel.__call__, cl.enqueue_copy = self._saved
            del self._saved
            for hook in self._optimizer_hooks:
                hook.remove()
            _stateless.clear()
            _active = None
            profiling.swap_lock.release()
        if not keep:
            self._commands, self._before_replay = [], []
            return
        seen: dict[int, cl.MemoryObjectHolder] = {}
        for is_launch, a, b, _, args, _ in self._commands:
            for obj in (args if is_launch else (a, b)):   # (a host write: a is its function, b its buffer)
                if isinstance(obj, cl.MemoryObjectHolder):
                    seen.setdefault(id(obj), obj)
        self._buffers = list(seen.values())
        self._buffer_ids = frozenset(seen)
        memory.allocator.reserve_for_graph(self._buffers)
        self._presets = [_preset(command) for command in self._commands]
        self._captured = True
        _captured.add(self)

    def uses_buffer(self, buffer: cl.MemoryObjectHolder) -> bool:
        """Whether the recorded commands read or write ``buffer`` (so a replay may have written it: a
        replay passes no torch op, so it moves no version counter)."""
        return id(buffer) in self._buffer_ids

    def random_state(self) -> cl.Buffer:
        """The device buffer of this graph's random numbers (Philox key and counter, ``random.cl``), keyed
        from torch's CPU generator when the capture first needs it."""
        if self._random is None:
            seed = int(torch.randint(0, 2**62, (1,), dtype=torch.int64, device="cpu").item())
            self._random = state.get().random.new_state(seed)
        return self._random

    # -- replay ------------------------------------------------------------------------------------
    def replay(self) -> None:
        """Enqueue the recorded commands again, in order (returns without waiting for the device)."""
        if not self._captured:
            raise GraphCaptureError("nothing to replay: capture the graph first")
        if _active is self:
            raise GraphCaptureError("a graph cannot replay inside its own capture")
        self.replays += 1
        foreach_runs.flush()
        for hook in self._before_replay:   # e.g. weights changed in place since: their cached transforms first
            hook()
        queue = self._device.queue   # (enqueues launches deferred before the replay first)
        call, copy = cl.Kernel.__call__, cl.enqueue_copy   # looked up now: a KernelProfile sees replays
        # a KernelProfile (or a capture) watches pyopencl's launch and copy functions: then go through them
        watched = profiling.swap_lock.locked()
        enqueue = cl.enqueue_nd_range_kernel
        # submit every few commands, as the device's queue does (NVIDIA's driver otherwise holds them back
        # while the host goes on enqueueing; 0 on CPU devices)
        every, pending = self._device.flush_every, 0
        for (is_launch, a, b, c, args, kwargs), preset in zip(self._commands, self._presets):
            if preset is not None and not watched:   # the kernel's copy with this launch's arguments set
                enqueue(queue, preset, b, c)
            elif is_launch:
                call(a, queue, b, c, *args, **kwargs)
            elif is_launch is None:   # numbers drawn on the host and written into buffer b (draw_on_host)
                a()
            else:
                copy(queue, a, b, **kwargs)
            if every:
                pending += 1
                if pending >= every:
                    queue.flush()
                    pending = 0
        if every:
            queue.flush()

    def reset(self) -> None:
        """Drop the recording and give its buffers back to the allocator."""
        if _active is self:
            raise GraphCaptureError("cannot reset a graph while it is being captured")
        if self._captured:
            memory.allocator.release_from_graph(self._buffers)
        self._commands, self._buffers, self._presets, self._before_replay, self._captured = [], [], [], [], False
        self._buffer_ids = frozenset()
        _captured.discard(self)

    @property
    def commands(self) -> int:
        """How many commands a replay enqueues."""
        return len(self._commands)

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers the graph keeps reserved (some may also belong to live tensors)."""
        return sum(b.size for b in self._buffers)

    def __del__(self) -> None:
        # (never the locking release: a garbage collection inside an allocation would wait for its own lock)
        # (nor contextlib's suppress: at interpreter exit this module's globals may be gone already)
        if getattr(self, "_captured", False) and _active is not self:
            try:
                memory.allocator.release_from_graph_soon(self._buffers)
            except Exception:  # noqa: BLE001  (a destructor must not raise)
                pass


_captured: weakref.WeakSet[Graph] = weakref.WeakSet()   # the graphs holding a capture


def captured_graphs() -> list[Graph]:
    """The graphs that hold a capture now."""
    return list(_captured)


def bernoulli_(t: Any, p: float) -> bool:
    """In a capture, fill float32 or bool contiguous ``t`` with 1 (probability ``p``) or 0 from the graph's
    device generator, so every replay draws anew; False (nothing done) where that does not apply."""
    if _active is None or t.dtype not in _DRAWN or not t.is_contiguous() or not 0.0 <= p <= 1.0:
        return False
    state.get().random.bernoulli(memory.buffer_of(t), t.storage_offset(), t.numel(), p, _active.random_state(),
                                 _DRAWN[t.dtype])
    return True


_DRAWN = {torch.float32: "float32", torch.bool: "bool"}   # the dtypes a capture's Bernoulli draw fills


def draw_on_host(t: torch.Tensor, draw: Callable[[], torch.Tensor],
                 write_bytes: Callable[[cl.Buffer, int, np.ndarray], None]) -> bool:
    """In the capture of a graph that draws its random numbers on the host (``Graph(random_on_host=True)``):
    write ``draw()`` (a CPU tensor of contiguous ``t``'s shape and dtype, drawn from torch's CPU generator
    as the eager op draws it) into ``t`` now, and record a command that draws and writes again at this
    point of every replay; False (nothing done) otherwise. A replay then reads what an eager run would
    have drawn. ``write_bytes(buffer, byte_offset, data)`` uploads host bytes (the caller passes
    :func:`tunecl.backend.copies.write_bytes`, which refuses to run while a graph captures)."""
    global _active
    graph = _active
    if graph is None or not graph.random_on_host or not t.is_contiguous():
        return False
    buffer, offset = memory.buffer_of(t), t.storage_offset() * t.element_size()

    def write() -> None:   # (holds the buffer, not the tensor: the tensor may die before the graph)
        write_bytes(buffer, offset, draw().reshape(-1).view(torch.uint8).numpy())

    graph._device.flush()   # (launches deferred so far are recorded first: the write enqueues them)
    graph._commands.append((None, write, buffer, None, (), {}))
    recording = cl.Kernel.__call__, cl.enqueue_copy
    _active, (cl.Kernel.__call__, cl.enqueue_copy) = None, graph._saved   # (its upload is not recorded)
    try:
        write()
    finally:
        _active, (cl.Kernel.__call__, cl.enqueue_copy) = graph, recording
    return True


def before_each_replay(hook: Callable[[], None]) -> None:
    """Run ``hook`` before every replay of the graph being captured (the weight cache: a weight whose cached
    transform the graph reads is transformed again first if it was written since; see
    :func:`tunecl.backend.weight_cache.run_conv`)."""
    _active._before_replay.append(hook)


def _preset(command: tuple) -> cl.Kernel | None:
    """A new kernel object for a recorded launch, its arguments set once, so a replay only enqueues it
    (a quarter to a half less host time per command than pyopencl's call, which sets every argument each
    time); None for copies, launches with options, and kernels that cannot be copied so."""
    is_launch, kernel, _, _, args, kwargs = command
    if not is_launch or kwargs:
        return None
    return preset_kernel(kernel, args)


def _check_optimizer(optimizer: Any, args: Any, kwargs: Any) -> None:
    """An optimizer step in a capture: refuse the ones that keep their step count on the host (torch's
    Adam, AdamW, ... with ``capturable=False`` and not ``fused``): their bias corrections are Python numbers
    that every replay would repeat. (SGD and the others without a ``capturable`` option keep no count.)"""
    name = type(optimizer).__name__
    for group in optimizer.param_groups:
        if "capturable" in group and not group["capturable"] and not group.get("fused"):
            raise GraphCaptureError(f"{name}.step() keeps its step count on the host (capturable=False, "
                                    f"fused=False): every replay would repeat the captured step's bias "
                                    f"correction; create it with fused=True or capturable=True")
    _stateless[id(optimizer)] = [p for group in optimizer.param_groups for p in group["params"]
                                 if not optimizer.state.get(p)]


def _check_optimizer_state(optimizer: Any, args: Any, kwargs: Any) -> None:
    """After an optimizer step in a capture: refuse one that created state (moments, step counts,
    momentum buffers) there, which every replay would initialise again."""
    if any(optimizer.state.get(p) for p in _stateless.pop(id(optimizer), ())):
        raise GraphCaptureError(f"{type(optimizer).__name__}.step() created its state (moments, step counts, "
                                f"momentum buffers) inside the graph, and every replay would initialise it "
                                f"again; run a step before capturing")


_stateless: dict[int, list] = {}   # optimizer -> its parameters without state when its captured step began


@contextlib.contextmanager
def graph(g: Graph) -> Iterator[Graph]:
    """Capture the block into ``g`` (the block runs once; see the module docstring)."""
    g.capture_begin()
    try:
        yield g
    except BaseException:
        g.capture_end(keep=False)
        raise
    g.capture_end()
