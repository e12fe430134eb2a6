"""Host time of one optimizer step over a net's parameters on the opencl device.

Builds a net's parameters on the device with a gradient each (random, fixed), then times ``opt.step()``:
per round, ``--steps`` steps back to back, the host time until each returned (the device is synchronized
between rounds, not between steps); prints the median per-step time over ``--repeats`` rounds with the
spread (min-max of the rounds' medians), the CPU time of the calling thread per step (``time.thread_time``:
on a shared or PoCL machine, whose device threads compete for the cores, the steadiest measure of host
cost), and the wall time per step including the final synchronize.

Where torch has CUDA, the same optimizer over the same parameters and gradients on CUDA is timed the same
way in the same run (torch CUDA's host cost for the step, the peer a user compares with), each figure
printed with ours ÷ CUDA and recorded as the rows' peer; ``--no-cuda`` skips it.

- ``--optimizer adam|adamw|sgd``, ``--impl fused|foreach|single`` (torch's ``fused=True``, its default
  multi-tensor path, or ``foreach=False``);
- ``--items N``: work-items per tensor of the multi-tensor kernels at most (larger tensors are strided over;
  the family's default: 65536 on GPUs, one per element on CPU devices), to compare grids on a device;
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

MEASURES = ("host", "thread CPU", "wall (synchronized per round)")


def host_rows(per_step: dict[str, list[float]], case: str, *, device: str, load: float | None, command: str,
              commit: str, peer: dict[str, list[float]] | None = None) -> list[dict[str, str]]:
    """The host-time rows of one run: ``per_step`` maps each measure to its rounds' seconds per step;
    ``peer`` the same for torch CUDA, timed in the same run (its medians become the rows' peer figures)."""
    return [record.host_row(device=device, benchmark="optimizer_step", case=case, measure=measure,
                            samples_us=[t * 1e6 for t in seconds], load=load, command=command, commit=commit,
                            **({"peer_us": statistics.median(peer[measure]) * 1e6, "peer_name": "torch CUDA"}
                               if peer and measure in peer else {}))
            for measure, seconds in per_step.items()]


def make_optimizer(params: list, name: str, impl: str) -> object:
    import torch

    flags = {"fused": {"fused": True}, "foreach": {"foreach": True}, "single": {"foreach": False}}[impl]
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flags)
    cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    return cls(params, lr=1e-3, **flags)


def time_steps(optimizer: object, sync: object, steps: int, repeats: int) -> dict[str, list[float]]:
    """Per round of ``steps`` steps: the median host seconds per step, the thread's CPU seconds per step and
    the wall seconds per step with the round's closing synchronize; after 3 untimed steps."""
    for _ in range(3):
        optimizer.step()
    sync()
    host, thread, wall = [], [], []
    for _ in range(repeats):
        times = []
        start, cpu_start = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            t0 = time.perf_counter()
            optimizer.step()
            times.append(time.perf_counter() - t0)
        thread.append((time.thread_time() - cpu_start) / steps)
        sync()
        wall.append((time.perf_counter() - start) / steps)
        host.append(statistics.median(times))
    return dict(zip(MEASURES, (host, thread, wall)))


def _line(label: str, ours: list[float], peer: list[float] | None) -> str:
    text = (f"  {label}: median {statistics.median(ours) * 1e6:8.1f}  spread "
            f"{min(ours) * 1e6:.1f}-{max(ours) * 1e6:.1f}")
    if peer:
        cuda = statistics.median(peer)
        text += (f"   torch CUDA {cuda * 1e6:8.1f} (spread {min(peer) * 1e6:.1f}-{max(peer) * 1e6:.1f})"
                 f"   ratio {statistics.median(ours) / cuda:.2f}x")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet50")
    parser.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default="adam")
    parser.add_argument("--impl", choices=("fused", "foreach", "single"), default="fused")
    parser.add_argument("--steps", type=int, default=20, help="steps per round (default 20)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--items", type=int, metavar="N",
                        help="work-items per tensor of the multi-tensor kernels, at most (default: the family's)")
    parser.add_argument("--stub-launches", action="store_true")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--no-cuda", action="store_true", help="skip the torch CUDA peer where CUDA exists")
    parser.add_argument("--record", metavar="FILE.csv",
                        help="append the figures to a host-time results CSV (benchmarks/results/host.csv)")
    args = parser.parse_args(argv)
    if args.record:
        record.check_argument(parser.prog, args.record, record.HOST_COLUMNS)
    if args.stub_launches:   # before tunecl binds the launch functions
        from tunecl.tools.launch_stub import stub_launches

        stub_launches()
    import torch

    import tunecl.backend  # noqa: F401
    from tunecl.tools import load_model

    dev = torch.device("opencl")
    from tunecl.backend import state

    optim = state.get().optim
    if args.items:
        optim.items = args.items
    torch.manual_seed(0)
    model = load_model(args.net).to(dev)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = (torch.randn(p.shape) * 1e-3).to(dev)
    optimizer = make_optimizer(params, args.optimizer, args.impl)
    load = record.load_average()
    measured = time_steps(optimizer, torch.opencl.synchronize, args.steps, args.repeats)
    peer = None
    if not args.no_cuda and torch.cuda.is_available():   # the same step on CUDA, same parameters and gradients
        cuda_params = [p.detach().to("cuda").requires_grad_() for p in params]
        for p, q in zip(cuda_params, params):
            p.grad = q.grad.to("cuda")
        peer = time_steps(make_optimizer(cuda_params, args.optimizer, args.impl), torch.cuda.synchronize,
                          args.steps, args.repeats)
    binding = (f"{optim.slots} tensors per launch, {optim.items} work-items per tensor at most, "
               + ("by address" if optim.by_address() else "a pointer argument per tensor"))
    print(f"{args.net}: {len(params)} parameter tensors, {sum(p.numel() for p in params) / 1e6:.1f}M elements; "
          f"{args.optimizer} {args.impl} on {torch.opencl.get_device_name()}, launches "
          f"{'stubbed' if args.stub_launches else 'real'}, {binding}; {args.repeats} rounds of {args.steps} steps"
          + (f"; torch CUDA on {torch.cuda.get_device_name()} in the same run" if peer else ""))
    for measure, label in zip(MEASURES, ("host µs per step", "thread CPU µs per step",
                                         "wall µs per step (synchronized per round)")):
        print(_line(label, measured[measure], peer[measure] if peer else None))
    sync = torch.opencl.synchronize
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
                f"{'stubbed' if args.stub_launches else 'real'}, {binding}")
        rows = host_rows(measured, case, device=torch.opencl.get_device_name(), load=load, peer=peer,
                         command=record.script_command(__file__, argv),
                         commit=record.code_version())
        record.append(args.record, rows, record.HOST_COLUMNS)
        print(f"recorded {len(rows)} rows in {args.record}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
