"""``tunecl bench``: ms per batch of a whole model on the opencl device next to torch on CPU or CUDA.

The work is :func:`tunecl.tools.bench.bench_net`; this module parses arguments, prints progress on
stderr and the outcome on stdout (a summary, or one JSON object with ``--json``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from tunecl.cli.nets import NET_HELP, size_help
from tunecl.cli.output import print_json
from tunecl.cli.tune import non_negative_int, positive_int
from tunecl.errors import TuneclError

COMPARE = ("cpu", "cuda", "none")  # tunecl.tools.bench.COMPARE, repeated so --help imports no torch
PRECISIONS = ("fp32", "tf32")      # tunecl.tools.bench.PRECISIONS, likewise
CUDNN_BENCHMARK = ("off", "on", "both")   # tunecl.tools.bench.CUDNN_BENCHMARK, likewise
PROFILE_ROWS = 15                  # kernels listed by the summary (--json has them all)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench", help="ms per batch of a model on the opencl device, next to torch on CPU or CUDA",
        description="Time a model the way the dlprimitives seed table did. Inference: copy the batch to "
                    "the device, forward (eval mode, no_grad), copy the result back. Train (--train): copy "
                    "batch and labels, zero_grad, forward, cross-entropy loss, backward, Adam step, wait "
                    "for the device. Prints the median of --repeats iterations after --warmup untimed ones "
                    "for tunecl's opencl device and for the peer, and their ratio. The CUDA peer "
                    "runs in a separate process that never imports tunecl.backend: with a "
                    "PrivateUse1 backend loaded, CUDA backward() can fail (pytorch#161129). Weights are "
                    "random.")
    parser.add_argument("--net", metavar="NAME", required=True,
                        help=NET_HELP)
    parser.add_argument("--device", metavar="SEL",
                        help="OpenCL device for opencl:0: index, name part or platform:device "
                             "(default: TUNECL_DEVICE or 0)")
    parser.add_argument("--batch", type=positive_int, default=16, help="batch size (default 16)")
    parser.add_argument("--image-size", type=positive_int, default=224, help=size_help(224))
    parser.add_argument("--train", action="store_true", help="time training iterations instead of inference")
    parser.add_argument("--compare", choices=COMPARE,
                        help="peer: torch CPU in this process, torch CUDA in a separate process, or none "
                             "(default: cuda when torch.cuda.is_available(), else cpu)")
    parser.add_argument("--cudnn-benchmark", choices=CUDNN_BENCHMARK, default="both",
                        help="the CUDA peer's torch.backends.cudnn.benchmark: off (PyTorch's default), on (cuDNN "
                             "picks its fastest algorithm per shape first) or both (two peers, two ratios; "
                             "default)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="torch's TF32 flags on both sides: fp32 (default; strict fp32, TF32 off) or "
                             "tf32 (TF32 allowed for convolutions and matmuls: tunecl may serve tuned TF32 "
                             "tensor-core plans, CUDA uses TF32)")
    parser.add_argument("--warmup", type=non_negative_int, default=3, metavar="N",
                        help="untimed iterations first (default 3)")
    parser.add_argument("--repeats", type=positive_int, default=10, metavar="N",
                        help="timed iterations; the median is reported (default 10)")
    parser.add_argument("--profile", type=non_negative_int, default=0, metavar="N",
                        help="after the timed iterations, run N more with every kernel launch and copy timed "
                             "by its device event; prints device-busy time next to wall time and the "
                             "kernels that took the most (default 0: no profile)")
    parser.add_argument("--compile", action="store_true",
                        help="run our side's model and Adam step (capturable) through torch.compile(..., "
                             "backend='tunecl'): their graphs are captured during the warm-up and replayed (the "
                             "peer stays eager)")
    parser.add_argument("--graph", action="store_true",
                        help="after the warm-up, capture one step (forward, loss, backward and a fused Adam "
                             "step; inference: the forward) into a device graph and time its replays, each with "
                             "the batch copied in; the CUDA peer does the same with torch.cuda.graph, a CPU peer "
                             "runs the same fused Adam eagerly")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    parser.add_argument("--record", metavar="FILE.csv",
                        help="append the result to a results CSV (benchmarks/results/results.csv's columns; "
                             "created when missing): one row per peer, with the date, this command line and "
                             "the code's git commit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tunecl.tools import record

    if args.record:   # checked before measuring: a long run must not end on a file it cannot extend
        if args.compare == "none":
            raise TuneclError("--record needs a peer to compare with: leave out --compare none")
        record.check_file(args.record)
    from tunecl.tools.bench import bench_net

    result = bench_net(args.net, device=args.device, batch=args.batch, image_size=args.image_size,
                       train=args.train, compare=args.compare, warmup=args.warmup, repeats=args.repeats,
                       seed=args.seed, precision=args.precision, profile=args.profile, graph=args.graph, compiled=args.compile,
                       cudnn_benchmark=args.cudnn_benchmark,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print_json(result)
    else:
        print_result(result)
    if args.record:
        command = record.command_line("tunecl", getattr(args, "argv", []))
        rows = result_rows(result, command, record.code_version())
        record.append(args.record, rows)
        print(f"recorded {len(rows)} {'row' if len(rows) == 1 else 'rows'} in {args.record}", file=sys.stderr)
    return 0


def result_rows(result: dict[str, Any], command: str, commit: str) -> list[dict[str, str]]:
    """The results-CSV rows of :func:`tunecl.tools.bench.bench_net`'s result: one per peer."""
    from tunecl.tools import record

    workload = f"{result['net']} batch {result['batch']} {result['mode']}"
    if result["image_size"] != 224:
        workload += f" image {result['image_size']}"
    workload += " compiled" * bool(result.get("compiled")) + " graph" * bool(result.get("graph"))
    device = result["ours"]["device"].removeprefix("opencl:0 ")
    rows = []
    for peer in (result["peer"], result.get("peer_cudnn_benchmark")):
        if peer is None:
            continue
        if peer["kind"] == "cuda":
            name = "torch CUDA " + ("graph" if peer.get("graph") else "eager")
            name += " (cudnn.benchmark)" if "cudnn.benchmark on" in peer.get("settings", "") else ""
        else:
            name = f"torch CPU ({peer['threads']} threads)" if "threads" in peer else "torch CPU"
        rows.append(record.row(device=device, benchmark="net", workload=workload,
                               precision=result.get("precision", "fp32"), unit="ms",
                               ours=result["ours"]["median_ms"], peer=peer["median_ms"], peer_name=name,
                               command=command, commit=commit))
    return rows


def _spread(timing: dict[str, Any]) -> str:
    times = timing["times_ms"]
    return f"[{min(times):.4g}-{max(times):.4g}]"


def print_result(result: dict[str, Any], out: TextIO | None = None) -> None:
    """The human summary of :func:`tunecl.tools.bench.bench_net`'s result."""
    out = out or sys.stdout

    def line(label: str, text: str) -> None:
        print(f"{label:<10}{text}", file=out)

    print(f"{result['net']}, batch {result['batch']}, image {result['image_size']}, {result['mode']}, "
          f"{result.get('precision', 'fp32')}: "
          f"median ms per batch [min-max] of {result['repeats']} after {result['warmup']} warm-up", file=out)
    ours = result["ours"]
    line("ours", f"{ours['median_ms']:10.3f} ms  {_spread(ours)}  {ours['device']}")
    for peer, ratio in ((result["peer"], result["ratio"]), (result.get("peer_cudnn_benchmark"),
                                                             result.get("ratio_cudnn_benchmark"))):
        if peer is None:
            continue
        where = ("this process" if peer["process"] == "same"
                 else "a separate process without tunecl.backend")
        details = [where] + ([f"{peer['threads']} threads"] if "threads" in peer else []) \
            + ([peer["settings"]] if "settings" in peer else [])
        line("peer", f"{peer['median_ms']:10.3f} ms  {_spread(peer)}  {peer['device']} "
                     f"({', '.join(details)})")
        line("ratio", f"{ratio:10.3f}     ours / peer (above 1: slower than the peer)")
    issued = [f"ours {ours['issued_median_ms']:.3f} ms"] + [
        f"{label} {peer['issued_median_ms']:.3f} ms" for label, peer in (
            ("peer", result["peer"]), ("peer (cudnn.benchmark)", result.get("peer_cudnn_benchmark")))
        if peer is not None and "issued_median_ms" in peer]
    line("enqueued", ", ".join(issued) + ": host time to enqueue a batch (median; then it waits)")
    if result.get("shared_cores"):
        line("note", "the OpenCL device is this machine's CPU: ours and the peer ran one after the other on "
                     "the same cores")
    if result.get("graph"):
        line("graph", "one step captured after the warm-up; the timed iterations replay it")
    warmup = ours.get("warmup_ms")
    if warmup:
        line("warm-up", f"{sum(warmup) / 1e3:10.3f} s   the {len(warmup)} untimed iterations: "
                        + ", ".join(f"{t / 1e3:.3g}" for t in warmup) + " s"
                        + (" (compiled: the first is traced and runs eagerly, the second is captured, "
                           "the others replay)"
                           if result.get("compiled") else ""))
    if result.get("compiled"):
        line("compile", "torch.compile(backend='tunecl'): " + ", ".join(
            f"{key} {value}" for key, value in sorted(result["compile"].items())))
    batches = result.get("stats_batches", result["repeats"])
    fallback = result["fallback_ops"]
    if fallback:
        ops = ", ".join(f"{op} {n / batches:g}" for op, n in fallback.items())
        line("fallback", f"{result['fallback_calls_per_batch']:g} CPU-fallback calls per batch "
                         f"(ran on the CPU): {ops}")
    else:
        line("fallback", "0 CPU-fallback calls: every op ran on the device")
    sources = result["plan_sources"]
    if sources:
        line("plans", ", ".join(f"{source} {n / batches:g}" for source, n in sources.items())
             + " conv/GEMM calls per batch" + (" (in the captured step)" if result.get("graph") else ""))
    profile = result.get("profile")
    if profile:
        busy, wall = profile["device_busy_ms"], profile["wall_ms"]
        line("profile", f"{profile['iterations']} more iterations: {wall:.3f} ms wall per batch, device busy "
                        f"{busy:.3f} ms ({busy / wall:.0%}), {profile['commands']:g} commands per batch")
        kernels = profile["kernels"]
        for row in kernels[:PROFILE_ROWS]:
            print(f"{'':10}{row['ms']:10.3f} ms {row['share']:6.1%} {row['launches']:8g}x  {row['name']}",
                  file=out)
        if len(kernels) > PROFILE_ROWS:
            rest = kernels[PROFILE_ROWS:]
            print(f"{'':10}{sum(row['ms'] for row in rest):10.3f} ms {sum(row['share'] for row in rest):6.1%} "
                  f"{sum(row['launches'] for row in rest):8g}x  ({len(rest)} other kernels; all in --json)",
                  file=out)
