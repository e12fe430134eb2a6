"""Eager runs of ``_foreach_*`` calls as one multi-tensor kernel: what :mod:`foreach_fusion` does for
compiled graphs, done while the calls are made.

torch.optim's default (foreach) optimizers make a handful of ``_foreach_*`` calls per step over the same
lists (Adam: lerp_, mul_, addcmul_, sqrt, div_, add_, addcdiv_), each otherwise a launch per
``Optim.slots`` tensors that stores its result and has the next call load it again. Here such a call made
without grad mode (optimizers step under ``torch.no_grad``) is not launched but *joins the pending run*: its
expression becomes the next step of one :class:`Chain` over the run's *columns* (the tensor lists it reads
or writes, at most 8), its numbers become the chain's by-value numbers ``K(q)``, and a functional call's
new outputs, allocated at once and returned, become a column it writes. The run is launched as
``optim.cl``'s ``foreach_chain`` (a launch per ``Optim.slots`` tensors: each work-item loads its element of
every column, computes the steps in order in registers, stores every column written) by :func:`flush`,
which runs before anything else can touch the device's memory:

- every other op of the backend (its kernel's entry: :mod:`tunecl.backend.registration`), its CPU fallback
  and its autograd kernels; a ``_foreach_*`` call that cannot join;
- ``torch.opencl.synchronize``, events and streams; a device graph's capture or replay, and a compiled
  graph's call;
- the end of a ``torch.optim`` optimizer's step (so each step is a run of its own).

Results are the per-call results bit for bit: each step is the float expression the call's own kernel
computes, in the same order, and each value is rounded to float32 between steps as a store would round it.

A call joins while: ``TUNECL_FOREACH_RUNS`` is ``on``; grad mode is off; no graph capture or kernel
profile watches launches; every tensor list is a list of contiguous float32 opencl tensors with the run's
numel at each index (none empty); each number is one value for every tensor; the run stays within
``foreach_chain``'s columns, steps and numbers; and no list the run writes shares a storage with another of
its lists (or holds one storage twice). Otherwise the run is launched first and the call runs as before.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyopencl as cl
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from tunecl import config, profiling
from tunecl.backend import state
from tunecl.backend.ops import optim_calls
from tunecl.errors import BuildError, Unsupported
from tunecl.kernels.ops.fused import Chain, Step
from tunecl.kernels.ops.optim import CHAIN_COLUMNS, CHAIN_CONSTANTS, CHAIN_STEPS
from tunecl.kernels.ops.pointwise import EXPRESSIONS

_enabled = config.Derived(lambda cfg: cfg.foreach_runs == "on", "TUNECL_FOREACH_RUNS")
_grad_enabled = torch.is_grad_enabled
_swap_lock = profiling.swap_lock
_lock = threading.RLock()

pending: _Run | None = None   # the run waiting to be launched (read without the lock by every op's entry)
_paused = 0                   # paused() blocks open
_counts = {"runs": 0, "calls": 0}


def stats() -> dict[str, int]:
    """Runs launched since the last :func:`reset_counts` and the calls they held."""
    return dict(_counts)


def reset_counts() -> None:
    _counts.update(runs=0, calls=0)


def can_join() -> bool:
    """Whether a call made now may join a run (before the call allocates anything for it)."""
    return not _grad_enabled() and not _paused and not _swap_lock.locked() and _enabled()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """A block whose calls do not join runs (a compiled graph's, whose own rewrites launch kernels directly
    and fuse its foreach runs themselves); the pending run is launched first."""
    global _paused
    flush()
    with _lock:
        _paused += 1
    try:
        yield
    finally:
        with _lock:
            _paused -= 1


class _Run:
    """The calls of one pending run (see the module docstring)."""

    __slots__ = ("addresses", "buffers", "calls", "constants", "current", "held", "keys", "numels", "offsets",
                 "optim", "plan", "steps", "writes")

    def __init__(self, numels: list[int]) -> None:
        self.optim = state.get().optim   # (the device of the State in use when the run began)
        self.numels = numels
        self.keys: dict[tuple, int] = {}          # a column's data_ptrs -> the column
        self.buffers: list[list] = []             # per column: each tensor's buffer
        self.offsets: list[list[int]] = []        # and element offset
        self.addresses: list[set[int]] = []       # and the storages' addresses
        self.current: list[str] = []              # per column: its value now (v<j>, or the step that wrote it)
        self.held: list[Sequence[torch.Tensor]] = []   # the lists, alive until the launch
        self.steps: list[Step] = []
        self.constants: list[float] = []
        self.writes: dict[int, int] = {}          # column -> the last step that writes it
        # per step, for launching the steps one by one: (expr, operands (a column or a number each),
        # parameters, the column written)
        self.plan: list[tuple[str, tuple, tuple[float, ...], int]] = []
        self.calls = 0

    def join(self, expr: str, in_place: bool, self_list: Sequence[torch.Tensor], inputs: Sequence[Sequence[Any]],
             params: Sequence[Sequence[float]], outs: tuple[Sequence[torch.Tensor], list] | None) -> bool:
        """Take the call in (``outs``: a functional call's new outputs and their buffers); False, the run
        unchanged, if it cannot join."""
        spec = EXPRESSIONS.get(expr)
        if spec is None or not spec.code or spec.special or len(self.steps) >= CHAIN_STEPS:
            return False
        operands = ([self_list] if expr != "fill" else []) + list(inputs)
        if spec.nin != len(operands) or spec.nparams != len(params):
            return False
        new: list[tuple] = []   # columns this call adds: (key, tensors, buffers, offsets, addresses, fresh)
        args: list[str] = []
        constants: list[float] = []
        for operand in operands:
            if operand and isinstance(operand[0], torch.Tensor):
                column = self._column_of(operand, new)
                if column is None:
                    return False
                args.append(column)
            else:
                number = _one_number(operand)
                if number is None:
                    return False
                args.append(f"K({len(self.constants) + len(constants)})")
                constants.append(number)
        step_params = []
        for numbers in params:
            number = _one_number(numbers)
            if number is None:
                return False
            step_params.append(f"K({len(self.constants) + len(constants)})")
            constants.append(number)
        n_old = len(self.buffers)
        if outs is not None:
            if len(outs[0]) != len(self.numels):
                return False
            new.append(self._fresh(outs))
            target = n_old + len(new) - 1
        else:
            column = self._column_of(self_list, new)   # (found among the operands, but for fill)
            if column is None:
                return False
            target = int(column[1:])
        if n_old + len(new) > CHAIN_COLUMNS or len(self.constants) + len(constants) > CHAIN_CONSTANTS:
            return False
        addresses = self.addresses + [c[4] for c in new]
        # a written column shares no storage with another column, nor holds one twice: the new columns
        # against those written, and a column written from now on against every other
        written = set(self.writes) | {target}
        for k, c in enumerate(new):
            if not c[5] and any(j != n_old + k and not c[4].isdisjoint(addresses[j]) for j in written):
                return False
        if target not in self.writes and (
                len(addresses[target]) != len(self.numels)
                or any(i != target and not addresses[target].isdisjoint(addresses[i]) for i in range(len(addresses)))):
            return False
        # the call joins
        for key, tensors, buffers, offsets, found, _ in new:
            self.keys[key] = len(self.buffers)
            self.current.append(f"v{len(self.buffers)}")
            self.buffers.append(buffers)
            self.offsets.append(offsets)
            self.addresses.append(found)
            self.held.append(tensors)
        step = len(self.steps)
        self.steps.append(Step(expr, tuple(self.current[int(a[1:])] if a[0] == "c" else a for a in args),
                               tuple(step_params)))
        numbers = iter(constants)
        operands = tuple(int(a[1:]) if a[0] == "c" else float(next(numbers)) for a in args)
        self.plan.append((expr, operands, tuple(numbers), target))
        self.constants += constants
        self.current[target] = f"t{step}"
        self.writes[target] = step
        self.calls += 1
        return True

    def _column_of(self, tensors: Sequence[torch.Tensor], new: list[tuple]) -> str | None:
        """``c<j>``, the column of ``tensors`` (a new one appended to ``new`` if the run has none)."""
        if len(tensors) != len(self.numels):
            return None
        key = _key(tensors)
        column = self.keys.get(key)
        if column is not None:
            return f"c{column}"
        for j, c in enumerate(new):
            if c[0] == key:
                return f"c{len(self.buffers) + j}"
        found = optim_calls.dense_column(tensors, self.numels, list(key))
        if found is None:
            return None
        buffers, offsets, addresses = found
        new.append((key, tensors, buffers, offsets, set(addresses), False))
        return f"c{len(self.buffers) + len(new) - 1}"

    def _fresh(self, outs: tuple[Sequence[torch.Tensor], list]) -> tuple:
        """The column of a functional call's new outputs ((tensors, their buffers): new storages)."""
        tensors, buffers = outs
        ptrs = list(map(torch.Tensor.data_ptr, tensors))
        optim_calls.remember_fresh(tensors, ptrs)
        return tuple(ptrs), tensors, buffers, [0] * len(ptrs), set(ptrs), True

    def launch(self) -> None:
        ncol = len(self.buffers)
        chain = Chain(ncol, tuple(self.steps))
        try:
            chunks = self.optim.chain_chunks(chain, (False,) * ncol, tuple(sorted(self.writes.items())),
                                             self.numels, len(self.constants))
        except (Unsupported, BuildError, cl.Error) as error:   # a device that cannot build the chain
            _warn_once(f"a run of foreach calls could not be built as one kernel ({error}); its calls are "
                       f"launched one by one")
            self.launch_step_by_step()
            return
        self.optim.launch_chain(chunks, self.buffers, self.offsets, self.constants)
        _counts["runs"] += 1
        _counts["calls"] += self.calls


    def launch_step_by_step(self) -> None:
        """Each call's own multi-tensor launches, in order (the chain's steps, stored as they go)."""
        pairs = [list(zip(buffers, offsets)) for buffers, offsets in zip(self.buffers, self.offsets)]
        count = len(self.numels)
        for expr, operands, params, target in self.plan:
            inputs = [pairs[o] if isinstance(o, int) else [o] * count for o in operands]
            self.optim.map(expr, pairs[target], inputs, [[p] * count for p in params], self.numels)
        _counts["runs"] += 1
        _counts["calls"] += self.calls


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _key(tensors: Sequence[torch.Tensor]) -> tuple:
    return tuple(map(torch.Tensor.data_ptr, tensors))


def _one_number(numbers: Sequence[Any]) -> float | None:
    """The one value of a per-tensor number list (None if they differ or are not floats)."""
    if not numbers:
        return None
    first = numbers[0]
    if type(first) is not float or numbers.count(first) != len(numbers):   # (NaN never counts as equal)
        return None
    return first


def join(expr: str, in_place: bool, self_list: Sequence[torch.Tensor], inputs: Sequence[Sequence[Any]],
         params: Sequence[Sequence[float]], outs: tuple[Sequence[torch.Tensor], list] | None = None) -> bool:
    """Join the call to the pending run (or start one); False where it cannot (the pending run is then
    launched, and the caller runs the call itself). ``outs``: a functional call's new outputs and their
    buffers (:func:`tunecl.backend.memory.empty_dense_many`; the caller returns them)."""
    global pending
    with _lock:
        run = pending
        if run is not None and run.join(expr, in_place, self_list, inputs, params, outs):
            return True
        if run is not None:
            _launch_pending()
        numels = list(map(torch.Tensor.numel, self_list))
        if not numels or 0 in numels:
            return False
        run = _Run(numels)
        if not run.join(expr, in_place, self_list, inputs, params, outs):
            return False
        pending = run
        return True


def flush() -> None:
    """Launch the pending run, if any."""
    if pending is not None:
        with _lock:
            _launch_pending()


def launching_first(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel``, launching the pending run before each call."""
    @functools.wraps(kernel)
    def launching(*args: Any, **kwargs: Any) -> Any:
        if pending is not None:
            flush()
        return kernel(*args, **kwargs)

    return launching


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """An optimizer step's run is launched as the step returns: each step is one run, of one kernel
    signature (joined to the next step's calls, a run would take a different prefix of them each time,
    a kernel build each)."""
    if pending is not None:
        flush()


register_optimizer_step_post_hook(_after_optimizer_step)


def _launch_pending() -> None:   # with the lock held
    global pending
    run, pending = pending, None
    if run is not None:
        run.launch()
