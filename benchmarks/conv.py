"""Convolution benchmark: every conv layer of a net, tunecl default and tuned next to a peer.

For each unique convolution of the net (forward; ``--train`` adds backward-data and backward-weight)
the tuned plan (the tuning DB's entry for this device, else a fresh ``tune`` stored in the DB), the
untuned default (the first applicable fp32 algorithm's heuristic default) and a peer are timed in the
same run: torch's CPU convolution for a CPU device, cuDNN through torch CUDA for an NVIDIA device. Per
layer and summed over the net (times × occurrences), with the ratios.

``--precision`` picks what tunecl may compute at and what the peer runs: ``fp32`` (default; cuDNN with
TF32 off), ``tf32`` (tunecl may choose TF32 tensor-core algorithms where the device has them, results
looked up and tuned at TF32; cuDNN with TF32 on), ``fp16`` (float16 tensors: float16 algorithms only,
fp32 accumulation; cuDNN on float16 tensors). The algorithm column carries the precision it computed at.

    python benchmarks/conv.py --device 0 --net resnet18 --batch 1 --image-size 64 --trials 6
    python benchmarks/conv.py --device nvidia --net resnet50 --batch 16 --trials 12 --json out.json
    python benchmarks/conv.py --device nvidia --net resnet50 --batch 16 --precision tf32
    python benchmarks/conv.py --device nvidia --net resnet50 --batch 64 --train \
        --record benchmarks/results/results.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from tunecl import runtime
from tunecl.db import TuningDB
from tunecl.kernels import algorithms
from tunecl.precision import algorithm_precision, at_least
from tunecl.problems import ConvProblem
from tunecl.search.evaluate import evaluate
from tunecl.search.harness_registry import harness_for
from tunecl.search.measure import TimingPolicy
from tunecl.search.workload import net_problems
from tunecl.tools import record
from tunecl.tune import tune_problem


def torch_peer(problem: ConvProblem, device_kind: str, min_time: float,
               precision: str = "fp32") -> tuple[str, float] | None:
    """Seconds of torch's own convolution for ``problem`` on ``device_kind`` ("cpu" or "cuda"), at
    ``precision`` (TF32 allowed or not; float16 tensors for "fp16")."""
    import torch
    import torch.nn.functional as F

    if device_kind == "cuda":
        if not torch.cuda.is_available():
            return None
        torch.backends.cudnn.allow_tf32 = precision == "tf32"  # what tunecl was allowed
        torch.backends.cudnn.benchmark = True  # cuDNN's own algorithm search, as a fair peer
    elif precision == "fp16":
        return None   # torch's CPU convolution in float16 is no peer anyone uses
    dev = torch.device(device_kind)
    dtype = torch.float16 if problem.dtype == "float16" else torch.float32
    x = torch.randn(problem.input_shape, device=dev, dtype=dtype)
    w = torch.randn(problem.weight_shape, device=dev, dtype=dtype)
    dy = torch.randn(problem.output_shape, device=dev, dtype=dtype)
    kw = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation, groups=problem.groups)
    if problem.direction == "fwd":
        def op() -> Any:
            return F.conv2d(x, w, **kw)
    elif problem.direction == "bwd_data":
        def op() -> Any:
            return torch.nn.grad.conv2d_input(problem.input_shape, w, dy, **kw)
    else:
        def op() -> Any:
            return torch.nn.grad.conv2d_weight(x, problem.weight_shape, dy, **kw)

    def once() -> float:
        if device_kind == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            op()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3
        t0 = time.perf_counter()
        op()
        return time.perf_counter() - t0

    for _ in range(3):  # warm-up (and cuDNN's benchmark search)
        once()
    samples = [once() for _ in range(3)]
    while sum(samples) < min_time and len(samples) < 200:
        samples.append(once())
    name = (f"cuDNN (torch CUDA, {dict(fp32='TF32 off', tf32='TF32 on', fp16='float16')[precision]})"
            if device_kind == "cuda" else "torch CPU")
    return name, statistics.median(samples)


def peer_kind(device: runtime.Device) -> str | None:
    fp = device.fingerprint
    if fp.device_type == "cpu":
        return "cpu"
    if "nvidia" in fp.vendor.lower():
        return "cuda"
    return None


def bench_problem(device: runtime.Device, db: TuningDB, problem: ConvProblem, args: argparse.Namespace,
                  policy: TimingPolicy) -> dict[str, Any]:
    accepted = at_least("tf32" if args.precision == "tf32" else "fp32")
    candidates = [a for a in algorithms("conv")
                  if algorithm_precision(a) in accepted and a.applies(problem, device)]
    if not candidates:
        return {"problem": problem.key, "direction": problem.direction,
                "error": f"no {problem.dtype} conv algorithm applies on this device"}
    # the untuned default: the first applicable algorithm that computes at fp32
    baseline = next((a for a in candidates if algorithm_precision(a) == "fp32"), candidates[0])
    by_name = {a.name: a for a in candidates}
    harness = harness_for(problem, device)
    versions = {a.name: a.version for a in candidates}
    hit = None if args.retune else db.lookup(device.fingerprint, problem, versions=versions, precision=accepted)
    source = f"db ({hit.source})" if hit else "tuned now"
    if hit is None:
        outcome = tune_problem(problem, device, db, trials=args.trials, time_limit=args.time_limit,
                               storage_url=args.storage, policy=policy,
                               precision="tf32" if args.precision == "tf32" else "fp32")
        if outcome.winner is None:
            return {"problem": problem.key, "error": "no verified candidate"}
        name, config = outcome.winner.algorithm, dict(outcome.winner.config)
    else:
        name, config = hit.algorithm, dict(hit.params)
    default = evaluate(baseline, problem, device, baseline.default(problem, device),
                       harness=harness, policy=policy)
    tuned = evaluate(by_name[name], problem, device, config, harness=harness, policy=policy)
    kind = peer_kind(device)
    found = torch_peer(problem, kind, policy.min_time, args.precision) if kind else None
    return {"problem": problem.key, "direction": problem.direction,
            "default_s": default.time if default.ok else None, "default_algorithm": baseline.name,
            "tuned_s": tuned.time if tuned.ok else None, "tuned_algorithm": name,
            "tuned_precision": algorithm_precision(by_name[name]), "tuned_config": config,
            "tuned_from": source, "peer": found[0] if found else None, "peer_s": found[1] if found else None}


def _ms(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value * 1e3:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", metavar="SEL")
    parser.add_argument("--net", default="resnet50")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--train", action="store_true", help="add backward-data and backward-weight")
    parser.add_argument("--trials", type=int, default=12, help="trials per problem when tuning")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds of tuning per problem")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds of samples per measurement")
    parser.add_argument("--retune", action="store_true")
    parser.add_argument("--db", metavar="URL")
    parser.add_argument("--storage", metavar="URL")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "fp16"),
                        help="what tunecl may compute at and the peer runs (default fp32; see above)")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--record", metavar="FILE.csv",
                        help="append a row per direction (the tuned sum over the net against the peer's) "
                             "to a results CSV (benchmarks/results/results.csv's columns) with this command "
                             "and the commit")
    args = parser.parse_args(argv)
    if args.record:
        record.check_argument(parser.prog, args.record)

    device = runtime.select_device(args.device)
    counts = net_problems(args.net, args.batch, args.image_size, train=args.train)
    problems = [(p, n) for p, n in counts.items() if isinstance(p, ConvProblem)]
    if args.precision == "fp16":
        problems = [(dataclasses.replace(p, dtype="float16"), n) for p, n in problems]
    policy = TimingPolicy(min_time=args.min_time)
    print(f"device: {device.fingerprint.label}; {args.net} batch {args.batch} image {args.image_size}: "
          f"{len(problems)} unique convolutions ({sum(n for _, n in problems)} calls); precision "
          f"{args.precision}", flush=True)
    print(f"{'#':>3} {'dir':>10} {'shape':<44} {'default':>9} {'tuned':>9} {'peer':>9} {'tuned/peer':>10}  "
          f"algorithm")
    rows = []
    with TuningDB(args.db) as db:
        for i, (problem, count) in enumerate(problems):
            row = bench_problem(device, db, problem, args, policy)
            row["count"] = count
            rows.append(row)
            shape = (f"n{problem.n} c{problem.c} {problem.h}x{problem.w} k{problem.k} {problem.r}x{problem.s}"
                     f" s{problem.stride[0]} p{problem.padding[0]} g{problem.groups}")
            ratio = (f"{row['tuned_s'] / row['peer_s']:.2f}" if row.get("tuned_s") and row.get("peer_s")
                     else "-")
            print(f"{i:>3} {problem.direction:>10} {shape:<44} {_ms(row.get('default_s')):>9} "
                  f"{_ms(row.get('tuned_s')):>9} {_ms(row.get('peer_s')):>9} {ratio:>10}  "
                  f"{row.get('tuned_algorithm', row.get('error'))}"
                  f"{' [' + row['tuned_precision'] + ']' if 'tuned_precision' in row else ''} x{count}", flush=True)
    summary = {}
    for direction in ("fwd", "bwd_data", "bwd_weight"):
        sel = [r for r in rows if r.get("direction") == direction and r.get("tuned_s") and r.get("default_s")]
        if not sel:
            continue
        total = {key: sum(r[key] * r["count"] for r in sel) for key in ("default_s", "tuned_s")}
        with_peer = [r for r in sel if r.get("peer_s")]
        total["peer_s"] = sum(r["peer_s"] * r["count"] for r in with_peer) if with_peer else None
        speedups = [r["default_s"] / r["tuned_s"] for r in sel]
        total["geomean_tuned_vs_default"] = math.exp(sum(map(math.log, speedups)) / len(speedups))
        summary[direction] = total
        peer_text = (f"peer {_ms(total['peer_s'])} ms, tuned/peer {total['tuned_s'] / total['peer_s']:.2f}x"
                     if total["peer_s"] and len(with_peer) == len(sel) else "no peer")
        print(f"sum {direction:>10}: default {_ms(total['default_s'])} ms, tuned {_ms(total['tuned_s'])} ms, "
              f"{peer_text}; default/tuned geomean {total['geomean_tuned_vs_default']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device.fingerprint.to_dict(), "net": args.net,
                                               "batch": args.batch, "image_size": args.image_size,
                                               "precision": args.precision,
                                               "rows": rows, "summary": summary}, indent=2, default=str))
    if args.record:
        record_sums(args, argv, device.fingerprint.name, rows, summary)
    return 0


def record_sums(args: argparse.Namespace, argv: list[str] | None, device: str, rows: list[dict[str, Any]],
                summary: dict[str, dict[str, Any]]) -> None:
    """Append each direction whose every layer has a peer time to ``--record``'s CSV, in ms per net."""
    command = record.script_command(__file__, argv)
    commit = record.code_version()
    image = f" image {args.image_size}" if args.image_size != 224 else ""
    recorded = []
    for direction, total in summary.items():
        layers = [r for r in rows
                  if r.get("direction") == direction and r.get("tuned_s") and r.get("default_s")]
        if not total["peer_s"] or not all(r.get("peer_s") for r in layers):
            continue
        recorded.append(record.row(
            device=device, benchmark="conv", workload=f"{args.net} batch {args.batch}{image} {direction} "
                                                      "(sum of layers)",
            precision=args.precision, unit="ms", ours=total["tuned_s"] * 1e3, peer=total["peer_s"] * 1e3,
            peer_name=layers[0]["peer"], command=command, commit=commit))
    record.append(args.record, recorded)
    print(f"recorded {len(recorded)} rows in {args.record}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
