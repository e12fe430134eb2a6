"""Where the warm-up of a ``torch.compile(backend="tunecl")`` training step goes: its first calls by phase.

A compiled training step (forward + cross-entropy, backward, a capturable Adam step, each compiled, as
``tunecl bench --train --compile`` runs it) does its work up front: the first call traces the model and
the optimizer step (Dynamo), splits and functionalizes the graphs (AOTAutograd), rewrites them (our
folding, fusion and copy-back grouping) and runs each graph eagerly, building its kernels; the second
call captures each graph into a device graph; from the third on, the graphs replay. This prints, for each
of the first ``--steps`` calls, its wall time (until the device finished) and the time spent in:

- ``dynamo``: Dynamo's tracing and guards (its compile time without the backend's);
- ``aot``: AOTAutograd, the backend's compile without our graph compilers (forward and the lazily
  compiled backward; before torch 2.12 only the forward's, the backward's own part then counts in ``other``);
- ``ours: rewrites``: our graph rewrites (:func:`tunecl.backend.compile._rewrite`);
- ``ours: compilers``: the rest of our graph compilers (setting a graph up);
- ``warm-up runs``: the graphs' first, eager runs (their ops' plans and kernels are made there);
- ``captures``: the graphs' second runs, recorded into device graphs;
- ``replays``: the graphs' replays, with their input copies and handed-out outputs;
- ``kernel builds`` (inside the runs): OpenCL program builds that no in-process cache served (each a
  compile or a load from the on-disk caches), with their count;
- ``plan choices`` (inside the runs): choosing each new conv/GEMM problem's plan (the tuning DB's lookup
  chain, a family's heuristic default, building the plan: its kernel builds included), with their count;
- ``other``: the step outside the compiled graphs (autograd, the loss, ``zero_grad``, the batch's copies).

Kernel builds of the process's first eager step are not the compile's: ``--eager-first`` runs one eager
step before compiling (warming the in-process caches) so that only the compile's own cost remains.
``--profile N``: cProfile over the first ``--steps`` calls, the N functions with the most cumulative time.

    python benchmarks/compile_warmup.py --net resnet18 --batch 2 --image-size 32
    TUNECL_DEVICE=nvidia python benchmarks/compile_warmup.py --net resnet50 --batch 16 --eager-first
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import functools
import hashlib
import pstats
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

PHASES = ("dynamo", "aot", "ours: rewrites", "ours: compilers", "warm-up runs", "captures", "replays",
          "other")


class Clock:
    """Seconds and counts per phase of the current step, from wrapped functions (outermost call only per
    phase, from any thread)."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()
        self._depth: collections.Counter[str] = collections.Counter()
        self._wrapped: list[tuple[Any, str, Any]] = []

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        self._depth[phase] += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._depth[phase] -= 1
            if not self._depth[phase]:
                self.seconds[phase] += time.perf_counter() - start
                self.counts[phase] += 1

    def wrap(self, owner: Any, name: str, phase: str | Callable[..., str | None]) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            which = phase(*args, **kwargs) if callable(phase) else phase
            if which is None:
                return original(*args, **kwargs)
            with self.timing(which):
                return original(*args, **kwargs)

        self._wrapped.append((owner, name, original))
        setattr(owner, name, timed)

    def restore(self) -> None:
        """Put every wrapped function back."""
        while self._wrapped:
            owner, name, original = self._wrapped.pop()
            setattr(owner, name, original)


def instrument(clock: Clock) -> None:
    """Wrap the functions each phase is timed by."""
    from torch._dynamo import output_graph
    from torch._functorch._aot_autograd import runtime_wrappers

    from tunecl import runtime
    from tunecl.backend import compile as tunecl_compile
    from tunecl.backend import plans

    # the backend's compile: from Dynamo's compile of a frame (AOTAutograd, our forward compiler inside it),
    # and the backward's, compiled lazily by AOTAutograd at its first call
    clock.wrap(output_graph.OutputGraph, "call_user_compiler", "backend")
    for name in ("_forward_compiler", "_backward_compiler"):
        clock.wrap(tunecl_compile, name, "compilers")
    lazy = getattr(runtime_wrappers, "_AutogradBackwardCompiler", None)   # torch >= 2.12
    if lazy is not None:
        clock.wrap(lazy, "get_or_compile",
                   lambda compiler, **_: None if compiler.compiled_bw is not None else "backward compile")
    else:   # older torch compiles the backward inside its autograd function: only our compiler is seen there
        clock.wrap(tunecl_compile, "_backward_compiler", "backward compile")
    clock.wrap(tunecl_compile, "_rewrite", "rewrites")

    def phase_of_call(replayed: Any, args: Any) -> str:
        if replayed.reason or replayed.calls == 0:
            return "warm-up runs"   # (or a graph that runs eagerly for good)
        return "captures" if replayed.graph is None else "replays"

    clock.wrap(tunecl_compile._Replayed, "__call__", phase_of_call)

    def build_phase(device: Any, source: str, options: Any = ()) -> str | None:
        options = tuple(options) + tuple(o for o in device._default_options if o not in options)
        cached = (hashlib.sha256(source.encode()).hexdigest(), options) in device._programs
        return None if cached else "kernel builds"

    clock.wrap(runtime.Device, "build", build_phase)
    clock.wrap(plans, "_choose_plan", "plan choices")


def dynamo_seconds() -> float:
    """Dynamo's compile time so far (its frames' compiles, the backend's included)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(sum(compilation_time_metrics.get(key, ())) for key in ("_compile.compile_inner",))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet18")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="compiled steps to time (the third replays)")
    parser.add_argument("--eager-first", action="store_true",
                        help="one eager step before compiling (the in-process kernel caches warm)")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    import torch

    import tunecl.backend  # noqa: F401

    clock = Clock()
    instrument(clock)
    try:
        measure(args, clock)
    finally:
        clock.restore()
        torch._dynamo.reset()   # (frees the compiled graphs)
    return 0


def measure(args: argparse.Namespace, clock: Clock) -> None:
    """Compile the training step and print its first ``args.steps`` calls by phase."""
    import torch
    import torch.nn.functional as F

    import tunecl.backend
    from tunecl.backend.compile import tunecl_backend
    from tunecl.tools import model_and_inputs

    dev = torch.device("opencl")
    model, xc, yc = model_and_inputs(args.net, args.batch, args.image_size, train=True)
    model = model.to(dev).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)

    def step(forward: Callable[..., Any], optimizer_step: Callable[[], Any]) -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(forward(xc.to(dev)), yc.to(dev)).backward()
        optimizer_step()
        torch.opencl.synchronize()

    if args.eager_first:
        start = time.perf_counter()
        step(model, optimizer.step)
        print(f"eager step first: {time.perf_counter() - start:.2f} s, kernel builds "
              f"{clock.seconds['kernel builds']:.2f} s ({clock.counts['kernel builds']}), plan choices "
              f"{clock.seconds['plan choices']:.2f} s ({clock.counts['plan choices']})")
        clock.seconds.clear()
        clock.counts.clear()
    forward = torch.compile(model, backend=tunecl_backend)
    optimizer_step = torch.compile(optimizer.step, backend=tunecl_backend)
    print(f"{args.net} batch {args.batch} image {args.image_size} compiled train step on "
          f"{torch.opencl.get_device_name()}: seconds per phase of each call")
    print(f"{'call':>4} {'wall':>7} " + " ".join(f"{p:>15}" for p in PHASES) + f" {'kernel builds':>18}"
          f" {'plan choices':>18}")
    profile = cProfile.Profile() if args.profile else None
    totals: collections.Counter[str] = collections.Counter()
    for call in range(1, args.steps + 1):
        clock.seconds.clear()
        clock.counts.clear()
        dynamo_before = dynamo_seconds()
        start = time.perf_counter()
        with profile if profile is not None and call <= 3 else contextlib.nullcontext():
            step(forward, optimizer_step)
        wall = time.perf_counter() - start
        s = clock.seconds
        # Dynamo's compile time holds the backend's forward compile; the backend's, our compilers'; and
        # our compilers', the rewrites
        phase = {"dynamo": dynamo_seconds() - dynamo_before - s["backend"],
                 "aot": s["backend"] + s["backward compile"] - s["compilers"], "ours: rewrites": s["rewrites"],
                 "ours: compilers": s["compilers"] - s["rewrites"], "warm-up runs": s["warm-up runs"],
                 "captures": s["captures"], "replays": s["replays"]}
        phase["other"] = wall - sum(phase.values())
        print(f"{call:>4} {wall:7.3f} " + " ".join(f"{phase[p]:15.3f}" for p in PHASES)
              + f" {s['kernel builds']:12.2f} ({clock.counts['kernel builds']:3d})"
              + f" {s['plan choices']:12.2f} ({clock.counts['plan choices']:3d})")
        if call <= 3:
            totals.update({"wall": wall, **phase, "kernel builds": s["kernel builds"],
                           "plan choices": s["plan choices"]})
    print(f"{'1-3':>4} {totals['wall']:7.3f} " + " ".join(f"{totals[p]:15.3f}" for p in PHASES)
          + f" {totals['kernel builds']:12.2f}       {totals['plan choices']:12.2f}")
    print("warm-up (the first call to the third, replayed): "
          f"{totals['wall']:.2f} s; {tunecl.backend.compile.stats()}")
    if profile is not None:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.profile)


if __name__ == "__main__":
    sys.exit(main())
