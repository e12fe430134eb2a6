"""The eager launch savings, on and off, alternating: ``tunecl bench`` of a training step with the backend as it
is ("on") and with the savings that remove launches turned off ("off": batch norm's reductions finished in
separate launches, ``tunecl.kernels.ops.norm.ONE_LAUNCH``; a relu's or relu6's backward launched by
itself, ``tunecl.backend.ops.pointwise.FOLD_MASKS``; the step count's increment launched by itself,
``FOLD_STEP_COUNTS``; a residual's add launched by itself, ``FOLD_RESIDUALS``). Each run is its own process
(``tunecl bench --json``, with its own peer when ``--compare cuda``); on and off alternate for ``--rounds``
rounds per net, so a noisy host disturbs both alike. Prints every run's median step time (and the peer's, and
their ratio), then per net the median of each side over the rounds with its spread, and the median of the
per-round ratios on ÷ off.

``--in-process`` runs both sides in one process instead, on one model: blocks of ``--repeats`` steps with
the savings on and off alternate (the batch norm's pre-built calls dropped at each switch, and the first
step after it untimed), so what differs between processes (memory placement, a first run after kernel
builds) cannot tell the sides apart; there is no peer then (torch's CUDA training cannot share the process).
It also prints each side's host time until a step's work was enqueued (before the wait for the device; on a
CPU device, whose kernels run on the host's own cores, that time includes waiting for a core).

    TUNECL_DEVICE=nvidia python benchmarks/launch_savings.py --nets resnet18,mobilenet_v2 --rounds 3
    TUNECL_DEVICE=nvidia python benchmarks/launch_savings.py --nets resnet18 --compare cuda --rounds 3
    TUNECL_DEVICE=nvidia python benchmarks/launch_savings.py --nets resnet18,mobilenet_v2 --in-process --rounds 6
    TUNECL_DEVICE=nvidia python benchmarks/launch_savings.py --in-process --switches tunecl.backend.direct_calls.ENABLED
    TUNECL_DEVICE=nvidia python benchmarks/launch_savings.py --in-process --switches none --flush-every 4

``--switches`` names other module constants to turn off on the off side (each True on the on side; ``none``:
no constant); ``--flush-every N`` (in-process) has the off side submit the queue every N uses instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the module switches of the launch savings (each True when on): (module, name)
SWITCHES = (("tunecl.kernels.ops.norm", "ONE_LAUNCH"), ("tunecl.backend.ops.pointwise", "FOLD_MASKS"),
            ("tunecl.backend.ops.pointwise", "FOLD_STEP_COUNTS"), ("tunecl.backend.ops.pointwise", "FOLD_RESIDUALS"))


def _off_code(switches: tuple[tuple[str, str], ...]) -> str:
    """The CLI in a process whose ``switches`` are off (set before any call builds its launches)."""
    return ("import sys, importlib; "
            + "; ".join(f"setattr(importlib.import_module({m!r}), {n!r}, False)" for m, n in switches)
            + "; from tunecl.cli import main; sys.exit(main(sys.argv[1:]))")


_ON = "import sys; from tunecl.cli import main; sys.exit(main(sys.argv[1:]))"


def run(side: str, net: str, args: argparse.Namespace) -> dict:
    """One ``tunecl bench --json`` run of ``net``'s training step with the savings ``side`` ("on" or "off")."""
    code = _ON if side == "on" else _off_code(args.switches)
    command = [sys.executable, "-c", code, "bench", "--net", net, "--batch",
               str(args.batch), "--image-size", str(args.image_size), "--train", "--repeats", str(args.repeats),
               "--compare", args.compare, "--json"]
    if args.compare == "cuda":
        command += ["--cudnn-benchmark", args.cudnn_benchmark]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"{side} {net}: tunecl bench failed (exit {done.returncode}):\n"
                         + "\n".join(done.stderr.strip().splitlines()[-6:]))
    return json.loads(done.stdout)


def _switches(text: str) -> tuple[tuple[str, str], ...]:
    if text == "none":
        return ()
    pairs = tuple(tuple(item.rsplit(".", 1)) for item in text.split(",") if item)
    if not pairs or any(len(pair) != 2 for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected MODULE.NAME[,MODULE.NAME...], got {text!r}")
    return pairs


def in_process(nets: list[str], args: argparse.Namespace) -> int:
    """Both sides in this process: per net, --rounds rounds of a block of --repeats timed steps per side."""
    import importlib
    import time

    import torch

    import tunecl.backend  # noqa: F401
    from tunecl.backend import state
    from tunecl.tools import model_and_inputs

    modules = [(importlib.import_module(m), n) for m, n in args.switches]
    dev = torch.device("opencl")
    sync = torch.opencl.synchronize

    device = state.get().device
    flush_every = {True: device.flush_every,
                   False: device.flush_every if args.flush_every is None else args.flush_every}

    def switch(on: bool) -> None:
        for module, name in modules:
            setattr(module, name, on)
        device.flush_every = flush_every[on]
        state.get().norm.forget_launches()   # its pre-built calls were planned with the other side's switches

    print(f"launch savings on/off in one process on {torch.opencl.get_device_name()}: {', '.join(nets)}, batch "
          f"{args.batch}, image {args.image_size}, train (Adam), {args.rounds} rounds of {args.repeats} timed steps "
          f"a side; ms per step, median [min-max]")
    for net in nets:
        model, xc, yc = model_and_inputs(net, args.batch, args.image_size, train=True)
        model = model.to(dev)
        x, y = xc.to(dev), yc.to(dev)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step() -> None:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        for on in (True, False):   # each side's kernels built before any timing
            switch(on)
            for _ in range(3):
                step()
            sync()
        times: dict[bool, list[float]] = {True: [], False: []}
        issued: dict[bool, list[float]] = {True: [], False: []}   # host ms until the step was enqueued
        ratios = []
        for round_index in range(args.rounds):
            medians = {}
            for on in (True, False) if round_index % 2 == 0 else (False, True):
                switch(on)
                step()
                sync()
                block = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    step()
                    t1 = time.perf_counter()
                    sync()
                    block.append((time.perf_counter() - t0) * 1e3)
                    issued[on].append((t1 - t0) * 1e3)
                times[on] += block
                medians[on] = statistics.median(block)
            ratios.append(medians[True] / medians[False])
            print(f"  round {round_index + 1}  {net:14s} on {medians[True]:8.3f}  off {medians[False]:8.3f}  "
                  f"on / off {ratios[-1]:.3f}", flush=True)
        print(f"  {net:14s} on {_spread(times[True])}  off {_spread(times[False])}  on / off per round "
              f"{_spread(ratios)}")
        print(f"  {net:14s} enqueued (host ms until a step's work was enqueued): on {_spread(issued[True])}  "
              f"off {_spread(issued[False])}")
        switch(True)
    return 0


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.3f} [{min(values):.3f}-{max(values):.3f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="resnet18,mobilenet_v2", help="comma-separated (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="on/off pairs per net (default %(default)s)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per run (default %(default)s)")
    parser.add_argument("--compare", choices=("none", "cuda", "cpu"), default="none",
                        help="each run's peer, as tunecl bench --compare (default %(default)s)")
    parser.add_argument("--cudnn-benchmark", choices=("on", "off"), default="on",
                        help="the CUDA peer's cudnn.benchmark (default %(default)s)")
    parser.add_argument("--switches", type=_switches, default=SWITCHES, metavar="MODULE.NAME[,...]",
                        help="the module constants that the off side sets False (default: the launch savings, "
                             + ", ".join(f"{m}.{n}" for m, n in SWITCHES) + ")")
    parser.add_argument("--flush-every", type=int, metavar="N",
                        help="with --in-process: the off side submits the queue every N uses instead of the device's "
                             "TUNECL_FLUSH_EVERY (with --switches none, the only difference)")
    parser.add_argument("--in-process", action="store_true",
                        help="both sides in this process, alternating blocks of --repeats steps (no peer)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1:
        parser.error("--rounds and --repeats must be at least 1")
    nets = [n for n in args.nets.split(",") if n]
    if args.flush_every is not None and (not args.in_process or args.flush_every < 0):
        parser.error("--flush-every takes a count >= 0 and needs --in-process")
    if args.in_process:
        if args.compare != "none":
            parser.error("--in-process has no peer (--compare none)")
        return in_process(nets, args)
    print(f"launch savings on/off: {', '.join(nets)}, batch {args.batch}, image {args.image_size}, train, "
          f"{args.rounds} alternating rounds of {args.repeats} timed steps; ms, median per run [min-max]")
    results: dict[str, dict[str, list[dict]]] = {net: {"on": [], "off": []} for net in nets}
    for round_index in range(args.rounds):
        for net in nets:
            for side in ("on", "off") if round_index % 2 == 0 else ("off", "on"):
                result = run(side, net, args)
                results[net][side].append(result)
                ours = result["ours"]
                peer = result.get("peer")
                line = (f"  round {round_index + 1}  {net:14s} {side:3s}  ours {ours['median_ms']:8.3f} "
                        f"[{min(ours['times_ms']):.2f}-{max(ours['times_ms']):.2f}]")
                if peer:
                    line += f"  peer {peer['median_ms']:8.3f}  ratio {result['ratio']:.3f}"
                print(line, flush=True)
    print("per net: median over the rounds [min-max]; on / off: the median of each round's ratio")
    for net, sides in results.items():
        on = [r["ours"]["median_ms"] for r in sides["on"]]
        off = [r["ours"]["median_ms"] for r in sides["off"]]
        ratios = [a / b for a, b in zip(on, off)]
        print(f"  {net:14s} on {_spread(on)}  off {_spread(off)}  on / off {_spread(ratios)}")
        if sides["on"][0].get("peer"):
            print(f"  {'':14s} ours / peer: on {_spread([r['ratio'] for r in sides['on']])}  "
                  f"off {_spread([r['ratio'] for r in sides['off']])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
