"""Op coverage: which ATen ops a model asks of the opencl device, and which of them would run on the
CPU fallback, found by a *dry run* of the real backend that launches nothing.

Why not check op names: what reaches the backend is not what a model calls. Many functional ops
(``aten::sqrt``, ``addmm``, ``convolution``, ``clone``, ...) have default PrivateUse1 kernels that
decompose them (into ``sqrt.out``, ``convolution_overrideable``, ``empty_strided`` + ``_copy_from``),
so a walk on the meta device lists ops the backend never sees and misses those it does. And an adapter
may refuse one case (a dtype, a rank, a convolution no algorithm applies to) by raising ``Unsupported``:
that call runs on the CPU although the op has a kernel.

So :func:`dry_run` keeps the backend as it is down to the device and replaces only the device:

- every op goes through the real PrivateUse1 dispatch to the real adapters, views and fallback, which
  do all their host-side work: output shapes and allocation, dtype/layout/rank checks, the problem
  of each conv/GEMM, kernel-family planning with its ``Unsupported`` checks;
- storages get no ``cl.Buffer`` (a DLPack storage of the right size at a pseudo address, so views and
  ``as_strided`` behave as usual): no device memory is used, whatever the model's size;
- the kernel families get kernel caches whose kernels do nothing: nothing is compiled or launched;
- a conv/GEMM plan is "the first registered algorithm that applies", as on a tuning-DB miss, without
  the DB and without building it;
- host↔device copies move nothing (device→host reads give zeros) and are counted;
- a fallback is recorded with its reason instead of warning or raising, then runs on the CPU over
  those zeros as it would over real data.

What the dry run sees: every op that reaches the backend and every call that takes the CPU fallback,
with the reason, including each ``Unsupported`` raised by an adapter or a kernel family from shapes,
dtypes, strides and the device's limits (algorithm applicability is per device: the answer holds for
the device the run selected). What it cannot see: anything decided by values (there is no data:
``.item()`` gives 0), kernels that fail to compile or compute wrong results, a default conv/GEMM
config that cannot be made or built (the op tests, the families' tests and ``tunecl validate`` check
those), and stored tuned configs that fail to build (the backend then runs the default plan, still
on the device).

A dry run must not overlap real device work in the same process (it swaps the backend's device state),
and no tensor made during it may outlive it: its storage has no buffer. :func:`dry_run` checks that.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gc
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# the nets of issue 7 and the smallest image each takes in a batch-2 training step (alexnet needs 63,
# inception_v3 75; 32 keeps every other net's last feature map non-empty)
NETS: dict[str, int] = {
    "alexnet": 64, "resnet18": 32, "resnet50": 32, "vgg16": 32, "squeezenet1_0": 32, "googlenet": 32,
    "densenet161": 32, "inception_v3": 75, "shufflenet_v2_x1_0": 32, "mobilenet_v2": 32,
    "mobilenet_v3_large": 32, "mobilenet_v3_small": 32, "resnext50_32x4d": 32, "wide_resnet50_2": 32,
    "mnasnet1_0": 32, "efficientnet_b0": 32, "efficientnet_b4": 32, "regnet_y_400mf": 32,
}

# the transformers, ConvNeXts and language models beyond them, at the smallest input each takes (an image
# side; the sequence length of the hf: models); vit_b_16 is built for its image size
BEYOND_CNNS: dict[str, int] = {
    "convnext_tiny": 32, "convnext_small": 32, "vit_b_16": 32, "swin_t": 32, "hf:bert": 8, "hf:gpt2": 8,
}

ADAM_LR = 1e-3


def _optimizers() -> dict[str, Callable[[Any], Any]]:
    import torch

    return {
        # the default (foreach) Adam, as ``tunecl validate`` and most training loops use it
        "adam": lambda params: torch.optim.Adam(params, lr=ADAM_LR),
        "adam_fused": lambda params: torch.optim.Adam(params, lr=ADAM_LR, fused=True),
        "adam_for_loop": lambda params: torch.optim.Adam(params, lr=ADAM_LR, foreach=False),
    }


OPTIMIZERS = ("adam", "adam_fused", "adam_for_loop")


@dataclasses.dataclass(frozen=True)
class Fallback:
    """Calls of ``op`` in ``phase`` that took the CPU fallback, for one ``reason``."""

    phase: str
    op: str
    reason: str
    calls: int


@dataclasses.dataclass
class Coverage:
    """What one model asked of the backend in a dry run.

    Attributes:
        ops: per phase (``eval``, ``train``, then one per optimizer), calls per ATen overload that
            reached the backend: device kernels, view ops and fallbacks alike.
        fallbacks: the calls that would run on the CPU, with the reason each was refused.
        launches: kernel launches and device-to-device copies the run would have enqueued.
        transfers: ``host_to_device`` and ``device_to_host`` copies (CPU fallbacks add their own).
        plans: conv/GEMM problem key → the algorithm whose default plan would serve it.
        error: what the walk raised, if it did not finish (then the other fields are partial).
        input_shape: the shape of the batch the model took (images, or token ids).
    """

    net: str
    image_size: int
    batch: int
    ops: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    fallbacks: list[Fallback] = dataclasses.field(default_factory=list)
    launches: int = 0
    transfers: dict[str, int] = dataclasses.field(default_factory=dict)
    plans: dict[str, str] = dataclasses.field(default_factory=dict)
    error: str | None = None
    input_shape: tuple[int, ...] = ()

    @property
    def all_ops(self) -> dict[str, int]:
        """Calls per op over every phase."""
        total: collections.Counter[str] = collections.Counter()
        for counts in self.ops.values():
            total.update(counts)
        return dict(sorted(total.items()))

    @property
    def fallback_ops(self) -> list[str]:
        """The ops that took the fallback at least once, sorted."""
        return sorted({f.op for f in self.fallbacks})

    def summary(self) -> str:
        """One line: distinct ops, calls, launches and what fell back (or the error)."""
        ops = self.all_ops
        shape = "x".join(map(str, self.input_shape)) or f"{self.batch}x3x{self.image_size}x{self.image_size}"
        line = (f"{self.net} {shape}: {len(ops)} ops, "
                f"{sum(ops.values())} calls, {self.launches} launches, {len(self.plans)} conv/GEMM plans, "
                f"fallbacks: {', '.join(self.fallback_ops) or 'none'}")
        return line + (f"; ERROR {self.error}" if self.error else "")


# -- the dry device ------------------------------------------------------------------------------------
class _DryKernels:
    """Stands in for a kernel family's ``KernelCache``: every kernel is a counted no-op."""

    def __init__(self, run: DryRun):
        self._run = run

    def _launch(self, *args: Any, **kwargs: Any) -> None:
        self._run.launches += 1

    def get(self, key: Any) -> Callable[..., None]:
        return self._launch

    def build(self, key: Any, options: Any, name: str, scalar_dtypes: Any) -> Callable[..., None]:
        return self._launch

    def __len__(self) -> int:
        return 0


class _DryPlan:
    """A conv/GEMM plan that enqueues nothing (only counted)."""

    def __init__(self, run: DryRun):
        self._run = run

    def run(self, *args: Any, **kwargs: Any) -> None:
        self._run.launches += 1


class _DryOpenCL:
    """The OpenCL API a dry run's State enqueues buffer-to-buffer copies through: each copy does nothing
    (counted as a launch)."""

    def __init__(self, run: DryRun):
        self._run = run

    def enqueue_copy(self, *args: Any, **kwargs: Any) -> None:
        self._run.launches += 1


class DryDevice:
    """The device of a dry run's State: the real device's properties, limits and capabilities (what the
    adapters, kernel families and algorithms check), with launches that run the (do-nothing) kernel at
    once, deferred or held alike, so none waits for a fused twin either."""

    launch_batch = 0

    def __init__(self, device: Any):
        self._device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._device, name)

    def defer(self, kernel: Any, global_size: Any, local_size: Any, args: list) -> None:
        kernel(self._device.queue, global_size, local_size, *args)

    def hold(self, kernel: Any, global_size: Any, local_size: Any, args: list, tag: Any, fused: Any,
             payload: Any = None) -> None:
        kernel(self._device.queue, global_size, local_size, *args)

    def replace_held(self, tag: Any, op: str = "relu") -> bool:
        return False

    holding = False

    def peek_held(self, tag: Any) -> Any:
        return None

    def take_held(self, tag: Any) -> Any:
        return None


class DryRun:
    """The recorder of an active :func:`dry_run`: ops, fallbacks, launches and transfers by phase."""

    def __init__(self, device: Any):
        self.device = device
        self.phase = ""
        self._choices: dict[Any, Any] = {}  # problem -> algorithm (or None: none applies)
        self.start()

    def start(self) -> None:
        """Forget what was recorded (each walk records one model)."""
        self.ops: dict[str, collections.Counter[str]] = {}
        self.fallbacks: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.launches = 0
        self.transfers: collections.Counter[str] = collections.Counter()
        self.plans: dict[str, str] = {}

    def fill(self, coverage: Coverage) -> Coverage:
        """``coverage`` with what was recorded since :meth:`start`."""
        coverage.ops = {phase: dict(sorted(counts.items())) for phase, counts in self.ops.items()}
        coverage.fallbacks = [Fallback(phase, op, reason, calls)
                              for (phase, op, reason), calls in self.fallbacks.items()]
        coverage.launches = self.launches
        coverage.transfers = dict(self.transfers)
        coverage.plans = dict(self.plans)
        return coverage

    @contextlib.contextmanager
    def record(self, phase: str) -> Iterator[None]:
        """Attribute what the block asks of the backend to ``phase``."""
        from tunecl.backend import counters

        before = collections.Counter(counters.op_counts)
        self.phase = phase
        try:
            yield
        finally:
            self.phase = ""
            self.ops.setdefault(phase, collections.Counter()).update(collections.Counter(counters.op_counts) - before)

    # the dry State's seams (tunecl.backend.state.State)
    def fallback(self, name: str, reason: str = "") -> None:
        """``on_fallback``: record, then let the CPU run it (over zeros)."""
        self.fallbacks[(self.phase, name, reason)] += 1

    def plan(self, problem: Any) -> _DryPlan:
        """``plan``: the algorithm of the default plan on a DB miss, without building it."""
        from tunecl import kernels
        from tunecl.errors import Unsupported

        if problem not in self._choices:
            # (not the default config: working it out enumerates a GEMM space, ~50 ms a shape, and
            # would halve the walk's speed to check what the family's own tests check)
            self._choices[problem] = next(
                (a for a in kernels.algorithms(problem.kind) if a.applies(problem, self.device)), None)
        first = self._choices[problem]
        if first is None:
            raise Unsupported(f"no {problem.kind} algorithm applies to {problem.key}")
        self.plans[problem.key] = first.name
        return _DryPlan(self)

    def write_bytes(self, buffer: Any, offset: int, data: Any) -> None:
        """``write_bytes``: counted, nothing moves."""
        if data.nbytes:
            self.transfers["host_to_device"] += 1

    def read_bytes(self, data: Any, buffer: Any, offset: int) -> None:
        """``read_bytes``: counted; the host gets zeros."""
        if data.nbytes:
            self.transfers["device_to_host"] += 1
            data[...] = 0


_active = threading.Lock()


def _dry_state(run: DryRun) -> Any:
    """A backend State whose seams are ``run``'s, on a :class:`DryDevice` of the real device, and whose
    kernel families have :class:`_DryKernels` caches."""
    from tunecl.backend import state
    from tunecl.kernels.strided import KernelCache

    dry = state.State(DryDevice(run.device))
    dry.allocates = False
    dry.write_bytes, dry.read_bytes, dry.cl = run.write_bytes, run.read_bytes, _DryOpenCL(run)
    dry.plan, dry.on_fallback = run.plan, run.fallback
    for name, attribute in vars(state.State).items():
        if isinstance(attribute, functools.cached_property):
            family = getattr(dry, name)
            if not isinstance(getattr(family, "cache", None), KernelCache):
                raise TypeError(f"the dry run cannot stub the {name} kernel family: it launches through "
                                f"something other than a KernelCache called `cache`")
            family.cache = _DryKernels(run)
    return dry


@contextlib.contextmanager
def dry_run() -> Iterator[DryRun]:
    """Run the backend without a device for the block (see the module docstring); yields the recorder.

    The backend's op and fallback counters (``tunecl.backend.stats()``) and the allocator's statistics
    are restored afterwards, so a dry run leaves no trace in them.

    Raises:
        RuntimeError: another dry run is active, or a tensor made in the block outlived it.
    """
    import tunecl.backend  # noqa: F401  (registers the opencl device)
    from tunecl.backend import counters, memory, state

    if not _active.acquire(blocking=False):
        raise RuntimeError("a dry run is already active in this process")
    survivors = 0
    try:
        run = DryRun(state.get().device)
        allocator = memory.allocator
        saved_counts = (collections.Counter(counters.op_counts), collections.Counter(counters.fallback_counts))
        saved_memory = (allocator.peak_allocated, allocator.peak_reserved, collections.Counter(allocator.counts),
                        allocator.freed, allocator.revived, allocator.revived_empty, allocator.allocated_total,
                        allocator.reserved_total)
        first_address = allocator._next_address  # pseudo addresses only grow: later ones are ours
        run.device.flush()  # the real launches still waiting (Device.defer) go before the dry ones
        try:
            with state.installed(_dry_state(run)):
                try:
                    yield run
                finally:
                    gc.collect()
                    survivors = _bufferless_blocks(first_address)
        finally:
            for counter, saved in zip((counters.op_counts, counters.fallback_counts), saved_counts):
                counter.clear()
                counter.update(saved)
            (allocator.peak_allocated, allocator.peak_reserved, allocator.counts,
             allocator.freed, allocator.revived, allocator.revived_empty, allocator.allocated_total,
             allocator.reserved_total) = saved_memory
    finally:
        _active.release()
    if survivors:  # only reached without an exception (one in flight keeps its frames' tensors alive)
        raise RuntimeError(f"{survivors} storage(s) made in a dry run outlived it; they have no device buffer, "
                           f"so their tensors must never reach a kernel")


def _bufferless_blocks(first_address: int) -> int:
    """Live storages without a device buffer allocated at or after ``first_address``."""
    from tunecl.backend import memory

    memory.memory_stats()  # reclaims the blocks of dead storages
    return sum(1 for b in list(memory.allocator._blocks.values())
               if b.buffer is None and b.reserved and b.address >= first_address)


# -- walking models --------------------------------------------------------------------------------------
def _build_without_weights(net: str | Callable[[], Any], image_size: int) -> Any:
    """The model with parameters on the meta device (no initialisation: a dry run needs no values)."""
    from tunecl.search.workload import build_on_meta
    from tunecl.tools import load_model

    return build_on_meta(net if callable(net) else functools.partial(load_model, net, image_size))


def run_phases(model: Any, x: Any, optimizers: Iterable[str],
               record: Callable[[str], contextlib.AbstractContextManager[Any]]) -> None:
    """What :func:`walk` runs, each phase inside ``record(phase)``, on an opencl ``model``: ``eval`` (a
    no-grad eval-mode forward and the output's copy to the host), ``train`` (a train-mode forward,
    cross-entropy of each row of logits against class 0, backward and ``loss.item()``), then one
    ``step()`` of each optimizer in ``optimizers`` (names from :data:`OPTIMIZERS`) over those gradients."""
    import torch
    import torch.nn.functional as F

    factories = _optimizers()
    with record("eval"), torch.no_grad():
        model.eval()(x.to("opencl")).cpu()
    with record("train"):
        out = model.train()(x.to("opencl"))
        loss = F.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long).to("opencl"))
        loss.backward()
        loss.item()
        del out, loss
    for optimizer in optimizers:
        with record(optimizer):
            factories[optimizer](model.parameters()).step()


def walk(net: str | Callable[[], Any], *, image_size: int, batch: int = 2, name: str | None = None,
         optimizers: Iterable[str] = OPTIMIZERS, run: DryRun | None = None) -> Coverage:
    """Dry-run one model on the opencl device and report what it asked of the backend.

    The phases are those of :func:`run_phases`, on the model's architecture with parameters that hold
    no data (built on the meta device, then given buffer-less opencl storages). The input is a batch of
    random images, or what the model's ``example_batch`` makes (token ids of length ``image_size``).

    Args:
        net: torchvision model name, ``hf:`` name, ``package.module:factory``, or a callable that builds
            the model.
        run: the active dry run to record into; without one, the walk opens its own.

    Returns:
        The coverage; an exception inside the model's run is recorded in ``error``, not raised.
    """
    optimizers = tuple(optimizers)
    unknown = [o for o in optimizers if o not in OPTIMIZERS]
    if unknown:
        raise ValueError(f"unknown optimizers {unknown}; known: {', '.join(OPTIMIZERS)}")
    if run is None:
        with dry_run() as own:
            return walk(net, image_size=image_size, batch=batch, name=name, optimizers=optimizers, run=own)
    import torch

    label = name or (net if isinstance(net, str) else getattr(net, "__name__", repr(net)))
    coverage = Coverage(label, image_size, batch)
    run.start()
    model = _build_without_weights(net, image_size)
    example = getattr(model, "example_batch", None)
    x = torch.randn(batch, 3, image_size, image_size) if example is None else \
        example(batch, image_size, torch.Generator().manual_seed(0))[0]
    coverage.input_shape = tuple(x.shape)
    try:
        model = model.to_empty(device="opencl")
        run_phases(model, x, optimizers, run.record)
    except Exception as error:  # noqa: BLE001  (an adapter bug may raise anything: report it, walk on)
        frames = traceback.extract_tb(error.__traceback__)[-3:]
        where = "; ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in frames)
        coverage.error = f"in {run.phase or 'setup'}: {type(error).__name__}: {error} (at {where})"
    finally:
        del model, x
    return run.fill(coverage)


def walk_nets(nets: dict[str, int] | Iterable[str] = NETS, *, batch: int = 2,
              optimizers: Iterable[str] = OPTIMIZERS) -> dict[str, Coverage]:
    """:func:`walk` over several nets in one dry run; ``nets`` maps names to image sizes (a list of
    names takes the sizes of :data:`NETS` and :data:`BEYOND_CNNS`, 32 for a net in neither)."""
    known = NETS | BEYOND_CNNS
    sizes = nets if isinstance(nets, dict) else {n: known.get(n, 32) for n in nets}
    optimizers = tuple(optimizers)
    with dry_run() as run:
        return {net: walk(net, image_size=size, batch=batch, optimizers=optimizers, run=run)
                for net, size in sizes.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m tunecl.tools.coverage [NET ...]``: one line per net (default: :data:`NETS` and
    :data:`BEYOND_CNNS`); exit code 1 if any falls back (2 for a usage error)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tunecl.tools.coverage",
        description="Walk each net's forward, backward and optimizer steps as a dry run of the opencl "
                    "backend that compiles and launches nothing; print the ops each net asks for and "
                    "which of them would run on the CPU fallback. The exit code is 1 if any would.")
    parser.add_argument("nets", nargs="*", metavar="NET",
                        help=f"torchvision model name, hf:NAME or package.module:factory (default: "
                             f"{', '.join([*NETS, *BEYOND_CNNS])})")
    names = parser.parse_args(argv).nets or [*NETS, *BEYOND_CNNS]
    results = walk_nets(names)
    for coverage in results.values():
        print(coverage.summary())
        for f in coverage.fallbacks:
            print(f"    {f.phase}: {f.op} x{f.calls} ({f.reason})")
    return 1 if any(c.fallbacks or c.error for c in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
