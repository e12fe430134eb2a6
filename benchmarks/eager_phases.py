"""Where an eager training step's time goes on the opencl device: host time per phase, and the step's wall.

Runs a net's training step (forward + cross-entropy, backward, Adam; any net ``tunecl bench`` takes) and
prints, per phase, the host time until the phase returned, and the step's wall time until the device
finished, median of ``--repeats`` steps after a warm-up, in three rounds: no synchronize between phases, one
synchronize after each phase, and no synchronize again (a round that differs from the others was disturbed).
Options:

- ``--stub-launches``: kernel launches are not sent to the driver (the backend's Python path stays the same,
  results are garbage): the host cost of the backend itself, without the driver's enqueue;
- ``--autograd caller|worker``: backward on the calling thread (the backend's default) or on torch's worker
  thread for the device (``TUNECL_BACKWARD_THREAD``); without it, as that variable says;
- ``--copy-inputs``: the batch is copied from the CPU in every step, as ``tunecl bench`` does;
- ``--plans-of DEVICE`` (with ``--stub-launches``): the step runs with the plans the shipped tuning results
  hold for another device (a selector as ``tunecl db list --device`` takes: ``h200``), and with that kind of
  device's launch settings (a GPU's: no launch batching), so this machine shows the host cost of that
  device's plan mix without the device: the backend looks the plans up under that device's fingerprint and
  builds their kernels here (a config this device cannot build falls back to the default plan, with a
  warning); capability probes are skipped (no tensor-core kernels: fp32 plans only);
- the ``thread CPU`` line under each round: the calling thread's CPU time per phase (``time.thread_time``),
  steadier than wall time on a shared or CPU-OpenCL machine; backward's counts only on the calling thread;
- ``--launches`` (with ``--stub-launches``): the kernel launches of one more step, by kernel; with
  ``--compute-units N`` the batch norm splits its channels as on a device with N compute units (what its
  launch count depends on: an H100 or H200 has 132), the rest of the run as on this one;
- ``--profile N``: Python's cProfile over three more steps, the N functions with the most self time and the
  N with the most cumulative time (cProfile sees the calling thread only);
- ``--record FILE.csv``: append the first two rounds to a host-time results CSV (``benchmarks/results/host.csv``'s
  columns, ``tunecl.tools.record.HOST_COLUMNS``): per phase and the whole step, the wall and thread CPU time in
  µs, with their spread over the steps and the load average (the third round, a check, is printed only).

    TUNECL_DEVICE=nvidia python benchmarks/eager_phases.py --net resnet18 --batch 16
    TUNECL_DEVICE=nvidia python benchmarks/eager_phases.py --net resnet50 --batch 16 --stub-launches --profile 60
    python benchmarks/eager_phases.py --net resnet50 --batch 16 --stub-launches --plans-of h200
    python benchmarks/eager_phases.py --batch 2 --image-size 32 --record benchmarks/results/host.csv
    python benchmarks/eager_phases.py --net mobilenet_v2 --stub-launches --plans-of h100 --compute-units 132 \
        --launches --repeats 1
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from tunecl.tools import record

PHASES = ("forward + loss", "backward", "optimizer", "step")
RECORDED_ROUNDS = ("no sync", "sync per phase")


def host_rows(rounds: dict[str, tuple[list, list]], config: str, *, device: str, load: float | None, command: str,
              commit: str) -> list[dict[str, str]]:
    """The host-time rows of the rounds in :data:`RECORDED_ROUNDS`: ``rounds`` maps a round's label to its
    steps' (wall, thread CPU) seconds, each a tuple per step in the order of :data:`PHASES`."""
    rows = []
    for label in RECORDED_ROUNDS:
        for kind, steps in zip(("wall", "thread CPU"), rounds[label]):
            for phase, seconds in zip(PHASES, zip(*steps)):
                rows.append(record.host_row(device=device, benchmark="eager_phases", case=f"{config}: {phase}",
                                            measure=f"{label}: {kind}", samples_us=[t * 1e6 for t in seconds],
                                            load=load, command=command, commit=commit))
    return rows


def use_plans_of(selector: str) -> str:
    """Make the opencl device look its plans up as the shipped results' device ``selector`` names, with that
    device type's launch settings and no capability probes; the device's label. Call before the first op."""
    from tunecl.backend import state
    from tunecl.db import selection, shipped
    from tunecl.runtime import AUTO_FLUSH_EVERY, AUTO_LAUNCH_BATCH

    stored = shipped.index().devices()
    if not stored:
        raise SystemExit("--plans-of: no shipped results are read (TUNECL_SHIPPED_DB is empty or its folder "
                         "holds none)")
    matches = selection.stored_matches(selector, stored)
    if len(matches) != 1:
        raise SystemExit(f"--plans-of {selector!r} names {len(matches)} of the shipped results' devices; "
                         f"{selection.describe(stored)}")
    device = state.get().device
    device.fingerprint = fingerprint = matches[0]
    cpu = fingerprint.device_type == "cpu"
    device.launch_batch, device.flush_every = (AUTO_LAUNCH_BATCH, 0) if cpu else (0, AUTO_FLUSH_EVERY)
    device._capabilities = frozenset()   # the probes would try that device's PTX here
    return fingerprint.label


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet18")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--stub-launches", action="store_true")
    parser.add_argument("--autograd", choices=("caller", "worker"))
    parser.add_argument("--copy-inputs", action="store_true")
    parser.add_argument("--plans-of", metavar="DEVICE",
                        help="with --stub-launches: run the plans the shipped results hold for DEVICE (e.g. h200)")
    parser.add_argument("--launches", action="store_true",
                        help="with --stub-launches: the kernel launches of one step, by kernel")
    parser.add_argument("--compute-units", type=int, metavar="N",
                        help="with --stub-launches: the batch norm splits channels as on N compute units")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--record", metavar="FILE.csv",
                        help="append the figures to a host-time results CSV (benchmarks/results/host.csv)")
    args = parser.parse_args(argv)
    if args.record:
        record.check_argument(parser.prog, args.record, record.HOST_COLUMNS)
    if (args.plans_of or args.launches or args.compute_units) and not args.stub_launches:
        parser.error("--plans-of, --launches and --compute-units need --stub-launches")
    launches: Counter[str] = Counter()
    if args.stub_launches:   # before tunecl binds the launch functions
        from tunecl.tools.launch_stub import stub_launches

        stub_launches(launches)
    import torch

    if args.autograd:
        os.environ["TUNECL_BACKWARD_THREAD"] = args.autograd
    import tunecl.backend  # noqa: F401
    from tunecl.backend import autograd_engine
    from tunecl.tools import model_and_inputs
    plans_of = use_plans_of(args.plans_of) if args.plans_of else None
    if args.compute_units:
        from tunecl.backend import state
        state.get().norm.compute_units = args.compute_units
    dev = torch.device("opencl")
    model, xc, yc = model_and_inputs(args.net, args.batch, args.image_size, train=True)
    model = model.to(dev)
    x, y = xc.to(dev), yc.to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sync = torch.opencl.synchronize

    clock = time.thread_time

    def step(times: list | None, sync_each: bool = False, cpu: list | None = None) -> None:
        t0, c0 = time.perf_counter(), clock()
        xd, yd = (xc.to(dev), yc.to(dev)) if args.copy_inputs else (x, y)
        loss = torch.nn.functional.cross_entropy(model(xd), yd)
        if sync_each:
            sync()
        t1, c1 = time.perf_counter(), clock()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if sync_each:
            sync()
        t2, c2 = time.perf_counter(), clock()
        optimizer.step()
        if sync_each:
            sync()
        t3, c3 = time.perf_counter(), clock()
        sync()
        if times is not None:
            times.append((t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t0))
            cpu.append((c1 - c0, c2 - c1, c3 - c2, c3 - c0))

    for _ in range(3):
        step(None)
    mode = (f"launches {'stubbed' if args.stub_launches else 'real'}, autograd on the "
            f"{'caller' if autograd_engine.runs_on_caller() else 'worker'} thread"
            f"{', inputs copied' if args.copy_inputs else ''}"
            f"{f', plans of {plans_of}' if plans_of else ''}")
    print(f"{args.net} batch {args.batch} image {args.image_size} train on {torch.opencl.get_device_name()}: {mode}; "
          f"ms, median of {args.repeats}")
    load = record.load_average()
    rounds = {}
    for label, each in (("no sync", False), ("sync per phase", True), ("no sync again", False)):
        times: list = []
        cpu: list = []
        for _ in range(args.repeats):
            step(times, each, cpu)
        rounds[label] = (times, cpu)
        f, b, o, w = (statistics.median(c) * 1e3 for c in zip(*times))
        print(f"  {label:15s} forward {f:7.2f}  backward {b:7.2f}  optimizer {o:7.2f}  step wall {w:7.2f}")
        f, b, o, w = (statistics.median(c) * 1e3 for c in zip(*cpu))
        print(f"  {'  thread CPU':15s} forward {f:7.2f}  backward {b:7.2f}  optimizer {o:7.2f}  step host {w:7.2f}")
    if args.launches:
        launches.clear()
        step(None)
        print(f"  launches in one step: {sum(launches.values())}"
              f"{f' (batch norm split for {args.compute_units} compute units)' if args.compute_units else ''}")
        for name, count in sorted(launches.items(), key=lambda item: (-item[1], item[0])):
            print(f"    {count:6d}  {name}")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(3):
            step(None)
        profile.disable()
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(args.profile)
        stats.sort_stats("cumulative").print_stats(args.profile)
    if args.record:
        rows = host_rows(rounds, f"{args.net} batch {args.batch} image {args.image_size} train, {mode}",
                         device=torch.opencl.get_device_name(), load=load,
                         command=record.script_command(__file__, argv),
                         commit=record.code_version())
        record.append(args.record, rows, record.HOST_COLUMNS)
        print(f"recorded {len(rows)} rows in {args.record}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
