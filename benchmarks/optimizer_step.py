"""Host time of one optimizer step over a net's parameters on the opencl device.

Builds a net's parameters on the device with a gradient each (random, fixed), then times ``opt.step()``:
per round, ``--steps`` steps back to back, the host time until each returned (the device is synchronized
between rounds, not between steps); prints the median per-step time over ``--repeats`` rounds with the
spread (min-max of the rounds' medians), the CPU time of the calling thread per step (``time.thread_time``:
on a shared or PoCL machine, whose device threads compete for the cores, the steadiest measure of host
cost), and the wall time per step including the final synchronize.

- ``--optimizer adam|adamw|sgd``, ``--impl fused|foreach|single`` (torch's ``fused=True``, its default
  multi-tensor path, or ``foreach=False``);
- ``--stub-launches``: kernel launches are not sent to the driver (the backend's Python path stays the same,
  results are garbage): the host cost of the backend and torch's optimizer code, without the driver's enqueue;
- ``--profile N``: cProfile over more steps, the N functions with the most self time;
- ``--record FILE.csv``: append the three figures to a host-time results CSV (``benchmarks/results/host.csv``'s
  columns, ``tunecl.tools.record.HOST_COLUMNS``), each with the rounds' spread and the load average.

    python benchmarks/optimizer_step.py --net resnet50 --impl fused --stub-launches
    python benchmarks/optimizer_step.py --net resnet50 --impl foreach --stub-launches --profile 30
    python benchmarks/optimizer_step.py --net resnet18 --steps 5 --repeats 5 --record benchmarks/results/host.csv
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from tunecl.tools import record


def host_rows(per_step: dict[str, list[float]], case: str, *, device: str, load: float | None, command: str,
              commit: str) -> list[dict[str, str]]:
    """The host-time rows of one run: ``per_step`` maps each measure to its rounds' seconds per step."""
    return [record.host_row(device=device, benchmark="optimizer_step", case=case, measure=measure,
                            samples_us=[t * 1e6 for t in seconds], load=load, command=command, commit=commit)
            for measure, seconds in per_step.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet50")
    parser.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default="adam")
    parser.add_argument("--impl", choices=("fused", "foreach", "single"), default="fused")
    parser.add_argument("--steps", type=int, default=20, help="steps per round (default 20)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--stub-launches", action="store_true")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--record", metavar="FILE.csv",
                        help="append the figures to a host-time results CSV (benchmarks/results/host.csv)")
    args = parser.parse_args(argv)
    if args.record:
        record.check_file(args.record, record.HOST_COLUMNS)
    if args.stub_launches:   # before tunecl binds the launch functions
        from tunecl.tools.launch_stub import stub_launches

        stub_launches()
    import torch

    import tunecl.backend  # noqa: F401
    from tunecl.tools import load_model

    dev = torch.device("opencl")
    torch.manual_seed(0)
    model = load_model(args.net).to(dev)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = (torch.randn(p.shape) * 1e-3).to(dev)
    flags = {"fused": {"fused": True}, "foreach": {}, "single": {"foreach": False}}[args.impl]
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flags)
    else:
        cls = torch.optim.Adam if args.optimizer == "adam" else torch.optim.AdamW
        optimizer = cls(params, lr=1e-3, **flags)
    sync = torch.opencl.synchronize
    for _ in range(3):
        optimizer.step()
    sync()
    load = record.load_average()
    host, thread, wall = [], [], []
    for _ in range(args.repeats):
        times = []
        start, cpu_start = time.perf_counter(), time.thread_time()
        for _ in range(args.steps):
            t0 = time.perf_counter()
            optimizer.step()
            times.append(time.perf_counter() - t0)
        thread.append((time.thread_time() - cpu_start) / args.steps)
        sync()
        wall.append((time.perf_counter() - start) / args.steps)
        host.append(statistics.median(times))
    print(f"{args.net}: {len(params)} parameter tensors, {sum(p.numel() for p in params) / 1e6:.1f}M elements; "
          f"{args.optimizer} {args.impl} on {torch.opencl.get_device_name()}, launches "
          f"{'stubbed' if args.stub_launches else 'real'}; {args.repeats} rounds of {args.steps} steps")
    print(f"  host µs per step: median {statistics.median(host) * 1e6:8.1f}  spread "
          f"{min(host) * 1e6:.1f}-{max(host) * 1e6:.1f}")
    print(f"  thread CPU µs per step: median {statistics.median(thread) * 1e6:8.1f}  spread "
          f"{min(thread) * 1e6:.1f}-{max(thread) * 1e6:.1f}")
    print(f"  wall µs per step (synchronized per round): median {statistics.median(wall) * 1e6:8.1f}  spread "
          f"{min(wall) * 1e6:.1f}-{max(wall) * 1e6:.1f}")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.steps):
            optimizer.step()
        profile.disable()
        sync()
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
    if args.record:
        case = (f"{args.net} ({len(params)} tensors) {args.optimizer} {args.impl}, launches "
                f"{'stubbed' if args.stub_launches else 'real'}")
        rows = host_rows({"host": host, "thread CPU": thread, "wall (synchronized per round)": wall}, case,
                         device=torch.opencl.get_device_name(), load=load,
                         command=record.script_command(__file__, argv),
                         commit=record.code_version())
        record.append(args.record, rows, record.HOST_COLUMNS)
        print(f"recorded {len(rows)} rows in {args.record}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
