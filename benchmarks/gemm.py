"""GEMM benchmark: tunecl default and tuned GFLOP/s next to a peer timed in the same run.

The peer is numpy (OpenBLAS/MKL sgemm) for a CPU OpenCL device and ``torch.mm`` on CUDA for an NVIDIA
device (when torch sees CUDA), at the same precision: ``--precision fp32`` (default) compares strict fp32
with TF32 off; ``--precision tf32`` lets tunecl choose TF32 algorithms (tensor cores, where the device
grants them) and turns TF32 on for the peer; ``--precision fp16`` makes every shape a float16 GEMM (half
A, B and C, fp32 accumulation: the f16 tensor-core families, where the device grants them) and times
``torch.mm`` on float16 tensors. The default column is the strict-fp32 default (for fp16: the first
float16 family's default). Every tunecl number is a verified plan timed by device
events (median, see ``tunecl/search/measure.py``); the peer is timed the same way (median of repeats
until a minimum total time; CUDA events for torch). Default, tuned and peer are measured in
``--rounds`` interleaved rounds and each reports its best round median. "tuned" is the tuning DB's entry for the shape on
this device when there is one (``--retune`` to tune anyway), else a fresh ``tune`` stored in the DB.

    python benchmarks/gemm.py --device 0 --quick              # CPU-sized subset
    python benchmarks/gemm.py --device nvidia --trials 150    # the full list on a GPU
    python benchmarks/gemm.py --shapes 1024,1024,1024 --json out.json
    python benchmarks/gemm.py --device nvidia --shapes 4096,4096,4096 --record benchmarks/results/results.csv
    python benchmarks/gemm.py --device nvidia --precision tf32 --shapes 4096,4096,4096
    python benchmarks/gemm.py --device nvidia --precision fp16 --shapes 4096,4096,4096 1024,1024,1024
    python benchmarks/gemm.py --device nvidia --retune --algorithms gemm_simt gemm_simt:MAXRREG=0

``--algorithms NAME[:KEY=VALUE,...]`` also times the named algorithms' default configs (with the given
parameters changed) in the same interleaved rounds, one line each under the shape's row: a new family
is measured untuned next to the tuned winner and the peer without a tuning run of its own.

Shapes are M,N,K (C = A @ B, row-major, no transposes); the ResNet-like ones are convolutions as GEMMs
(M = batch*P*Q, N = output channels, K = C*R*S).
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from tunecl import runtime
from tunecl.cli.tune import progress_line
from tunecl.db import TuningDB
from tunecl.kernels import algorithms
from tunecl.precision import algorithm_precision, at_least
from tunecl.problems import GemmProblem
from tunecl.search.evaluate import evaluate
from tunecl.search.harness_registry import harness_for
from tunecl.search.measure import TimingPolicy
from tunecl.search.result import Result
from tunecl.search.space import parse_named
from tunecl.tools import record
from tunecl.tune import tune_problem

SHAPES = ["4096,4096,4096", "1024,1024,1024", "512,512,512", "3136,64,576", "196,1024,256", "49,2048,512",
          "64,1000,2048"]
QUICK = ["512,512,512", "3136,64,576", "196,1024,256", "49,2048,512"]


def time_peer(fn: Any, min_time: float, max_repeats: int = 200) -> list[float]:
    """Seconds per call of ``fn`` (which returns when the work is done): warm-up, then repeats."""
    fn()
    samples: list[float] = []
    while len(samples) < max_repeats and (len(samples) < 3 or sum(samples) < min_time):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def numpy_peer(problem: GemmProblem, min_time: float) -> tuple[str, float]:
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (problem.m, problem.k)).astype(np.float32)
    b = rng.uniform(-1, 1, (problem.k, problem.n)).astype(np.float32)
    c = np.empty((problem.m, problem.n), np.float32)
    return "numpy", statistics.median(time_peer(lambda: np.matmul(a, b, out=c), min_time))


def torch_cuda_peer(problem: GemmProblem, min_time: float, precision: str = "fp32") -> tuple[str, float] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"  # the precision tunecl was allowed
    dtype = torch.float16 if problem.dtype == "float16" else torch.float32
    a = (torch.rand(problem.m, problem.k, device="cuda") * 2 - 1).to(dtype)
    b = (torch.rand(problem.k, problem.n, device="cuda") * 2 - 1).to(dtype)
    c = torch.empty(problem.m, problem.n, device="cuda", dtype=dtype)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once() -> float:
        start.record()
        torch.mm(a, b, out=c)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    once()
    samples = [once() for _ in range(3)]
    while sum(samples) < min_time and len(samples) < 200:
        samples.append(once())
    kind = "float16" if problem.dtype == "float16" else f"TF32 {'on' if precision == 'tf32' else 'off'}"
    return f"torch.mm (CUDA, {kind})", statistics.median(samples)


def peer(device: runtime.Device, problem: GemmProblem, min_time: float,
         precision: str = "fp32") -> tuple[str, float] | None:
    """The fastest library for this device's kind, timed now; None when there is none to compare."""
    fp = device.fingerprint
    if fp.device_type == "cpu":
        return None if problem.dtype == "float16" else numpy_peer(problem, min_time)  # (no fast fp16 BLAS)
    if "nvidia" in fp.vendor.lower():
        return torch_cuda_peer(problem, min_time, precision)
    return None


def gflops(problem: GemmProblem, seconds: float | None) -> float | None:
    return None if seconds is None or not math.isfinite(seconds) else problem.flops / seconds * 1e-9


def measure_config(device: runtime.Device, problem: GemmProblem, name: str, config: dict[str, int],
                   harness: Any, policy: TimingPolicy) -> Result:
    algorithm = {a.name: a for a in algorithms("gemm")}[name]
    return evaluate(algorithm, problem, device, config, harness=harness, policy=policy)


def named_configs(device: runtime.Device, problem: GemmProblem,
                  specs: list[str]) -> list[tuple[str, str, dict[str, int] | None, str]]:
    """(label, algorithm, config or None, why not) for each ``--algorithms`` entry: the algorithm's
    default for ``problem`` with the overrides applied; None where it does not apply or the config is
    invalid (the reason is reported, nothing is compiled)."""
    known = {a.name: a for a in algorithms("gemm")}
    found = []
    for spec in specs:
        name, overrides = parse_named(spec)
        algorithm = known.get(name)
        if algorithm is None:
            raise SystemExit(f"--algorithms: unknown GEMM algorithm {name!r}; known: {', '.join(sorted(known))}")
        if not algorithm.applies(problem, device):
            found.append((spec, name, None, "does not apply"))
            continue
        config = {**algorithm.default(problem, device), **overrides}
        broken = algorithm.space(problem, device).violations(config)
        found.append((spec, name, None if broken else config, f"invalid: {', '.join(broken)}" if broken else ""))
    return found


def tune_shape(device: runtime.Device, db: TuningDB, problem: GemmProblem, args: argparse.Namespace,
               policy: TimingPolicy, precision: str) -> Any:
    """Tune ``problem`` and store the result, with tune's progress line on stderr when it is a terminal
    (a log file gets no redraws) and ``--no-progress`` is not given."""
    progress = progress_line(args, sys.stderr, problem.flops)
    try:
        return tune_problem(problem, device, db, trials=args.trials, time_limit=args.time_limit,
                            sampler=args.sampler, storage_url=args.storage, progress=progress,
                            policy=policy, precision=precision)
    finally:
        if progress is not None:
            progress.close()


def bench_shape(device: runtime.Device, db: TuningDB, problem: GemmProblem, args: argparse.Namespace,
                policy: TimingPolicy) -> dict[str, Any]:
    tune_precision = tuning_precision(args.precision)
    accepted = at_least(tune_precision)
    candidates = [a for a in algorithms("gemm")
                  if algorithm_precision(a) in accepted and a.applies(problem, device)]
    if not candidates:  # reported in the shape's row; the other shapes still run
        return {"shape": f"{problem.m}x{problem.n}x{problem.k}", "problem": problem.key, "precision": args.precision,
                "error": "no GEMM algorithm applies on this device"
                         + (" (float16 GEMMs need the mma_f16 or wgmma capability)" if problem.dtype == "float16" else "")}
    harness = harness_for(problem, device)
    baseline = next(a for a in candidates if algorithm_precision(a) == "fp32")  # the untuned default

    versions = {a.name: a.version for a in candidates}
    hit = None if args.retune else db.lookup(device.fingerprint, problem, versions=versions, precision=accepted)
    source = f"db ({hit.source})" if hit is not None else "tuned now"
    tune_seconds = None
    if hit is None:
        started = time.monotonic()
        outcome = tune_shape(device, db, problem, args, policy, tune_precision)
        tune_seconds = time.monotonic() - started
        if outcome.winner is None:
            raise SystemExit(f"no verified candidate for {problem.key}")
        name, config = outcome.winner.algorithm, dict(outcome.winner.config)
    else:
        name, config = hit.algorithm, dict(hit.params)
    # Default, tuned and peer are measured in interleaved rounds and each keeps its best round median:
    # on a shared machine a burst of load hits whichever is measured at that moment, and all three get
    # the same treatment. Plans are verified again in every round.
    default_t, tuned_t, peer_t, peer_name = [], [], [], None
    named = named_configs(device, problem, args.algorithms or [])
    named_results: dict[str, list[Result]] = {label: [] for label, _, cfg, _ in named if cfg is not None}
    for _ in range(args.rounds):
        for label, algorithm_name, named_config, _ in named:
            if named_config is not None:
                named_results[label].append(measure_config(device, problem, algorithm_name, named_config,
                                                           harness, policy))
        default = measure_config(device, problem, baseline.name, dict(baseline.default(problem, device)),
                                 harness, policy)
        tuned = measure_config(device, problem, name, config, harness, policy)
        found = peer(device, problem, policy.min_time, args.precision)
        default_t.append(default.time)
        tuned_t.append(tuned.time)
        if found is not None:
            peer_name = found[0]
            peer_t.append(found[1])
    found = (peer_name, min(peer_t)) if peer_t else None
    default = dataclasses.replace(default, times=(min(default_t),)) if default.ok else default
    tuned = dataclasses.replace(tuned, times=(min(tuned_t),)) if tuned.ok else tuned
    tuned_algorithm = {a.name: a for a in candidates}[name]
    row = {
        "shape": f"{problem.m}x{problem.n}x{problem.k}", "problem": problem.key,
        "default_gflops": gflops(problem, default.time), "default_status": default.status.value,
        "tuned_gflops": gflops(problem, tuned.time), "tuned_status": tuned.status.value,
        "precision": args.precision, "tuned_precision": algorithm_precision(tuned_algorithm),
        "tuned_algorithm": name, "tuned_config": config, "tuned_from": source, "tune_seconds": tune_seconds,
        "peer": found[0] if found else None, "peer_gflops": gflops(problem, found[1]) if found else None,
    }
    row["tuned_vs_default"] = (row["tuned_gflops"] / row["default_gflops"]
                               if row["tuned_gflops"] and row["default_gflops"] else None)
    row["tuned_vs_peer"] = (row["tuned_gflops"] / row["peer_gflops"]
                            if row["tuned_gflops"] and row["peer_gflops"] else None)
    row["named"] = []
    for label, algorithm_name, named_config, why in named:
        results = named_results.get(label, [])
        best = min((r.time for r in results if r.ok), default=None)
        status = "ok" if best is not None else (results[-1].status.value if results else "not run")
        message = why or next((r.message for r in results if not r.ok and r.message), "")
        speed = gflops(problem, best)
        row["named"].append({
            "label": label, "algorithm": algorithm_name, "config": named_config, "gflops": speed, "status": status,
            "message": message, "vs_peer": speed / row["peer_gflops"] if speed and row["peer_gflops"] else None,
            "vs_tuned": speed / row["tuned_gflops"] if speed and row["tuned_gflops"] else None})
    return row


def tuning_precision(precision: str) -> str:
    """The precision the tuner is held to: fp16 shapes are float16 problems whose families verify at
    fp32 (fp32 accumulation, one rounding to half)."""
    return "fp32" if precision == "fp16" else precision


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", metavar="SEL", help="device index, name part or platform:device")
    parser.add_argument("--shapes", nargs="+", metavar="M,N,K", help=f"default: {' '.join(SHAPES)}")
    parser.add_argument("--quick", action="store_true", help=f"a CPU-sized subset: {' '.join(QUICK)}")
    parser.add_argument("--trials", type=int, default=None, help="trials per shape (default 100; 20 with --quick)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds of tuning per shape")
    parser.add_argument("--sampler", default="tpe", choices=("tpe", "random", "grid"))
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds of samples per measurement")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved measurement rounds of default, tuned and peer; the best round "
                             "median of each is reported (default 3)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "fp16"),
                        help="fp32: strict, peer with TF32 off (default); tf32: TF32 algorithms allowed, "
                             "peer with TF32 on; fp16: float16 GEMMs, peer on float16 tensors")
    parser.add_argument("--retune", action="store_true", help="tune even when the DB has the shape")
    parser.add_argument("--algorithms", nargs="+", metavar="NAME[:K=V,...]",
                        help="also time these algorithms' default configs (parameters K changed to V), e.g. "
                             "gemm_simt gemm_simt:MAXRREG=0")
    parser.add_argument("--db", metavar="URL", help="tuning DB (default: TUNECL_DB)")
    parser.add_argument("--storage", metavar="URL", help="Optuna storage (default: TUNECL_STORAGE)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    parser.add_argument("--no-progress", action="store_true",
                        help="do not draw the tuning progress line (it is drawn only when stderr is a terminal)")
    parser.add_argument("--record", metavar="FILE.csv",
                        help="append a row per timed shape (tuned against the peer) to a results CSV "
                             "(benchmarks/results/results.csv's columns) with this command and the commit")
    args = parser.parse_args(argv)
    if args.record:
        record.check_argument(parser.prog, args.record)
    if args.trials is None and args.time_limit is None:
        args.trials = 20 if args.quick else 100
    specs = args.shapes or (QUICK if args.quick else SHAPES)
    try:
        problems = [GemmProblem.from_spec(s) for s in specs]
        if args.precision == "fp16":
            problems = [dataclasses.replace(p, dtype="float16") for p in problems]
    except ValueError as error:
        parser.error(str(error))

    device = runtime.select_device(args.device)
    policy = TimingPolicy(min_time=args.min_time)
    print(f"device: {device.fingerprint.label}  [{device.entry.platform}]  precision: {args.precision}")
    header = f"{'shape':>16} {'default':>9} {'tuned':>9} {'peer':>9} {'tuned/peer':>10} {'tuned/def':>9}  chosen"
    print(f"{'':16} {'GFLOP/s':>9} {'GFLOP/s':>9} {'GFLOP/s':>9}")
    print(header)
    rows = []
    with TuningDB(args.db) as db:
        for problem in problems:
            row = bench_shape(device, db, problem, args, policy)
            rows.append(row)
            if "error" in row:
                print(f"{row['shape']:>16}   {row['error']}", flush=True)
                continue
            print(f"{row['shape']:>16} {_fmt(row['default_gflops']):>9} {_fmt(row['tuned_gflops']):>9} "
                  f"{_fmt(row['peer_gflops']):>9} {_fmt(row['tuned_vs_peer'], '.2f'):>10} "
                  f"{_fmt(row['tuned_vs_default'], '.2f'):>9}  {row['tuned_algorithm']} "
                  f"[{row['tuned_precision']}] ({row['tuned_from']})",
                  flush=True)
            for entry in row["named"]:
                if entry["gflops"] is None:
                    print(f"{'':16}   {entry['label']} default: {entry['status']} {entry['message']}", flush=True)
                else:
                    print(f"{'':16}   {entry['label']} default: {_fmt(entry['gflops'])} GFLOP/s, "
                          f"{_fmt(entry['vs_peer'], '.2f')}x peer, {_fmt(entry['vs_tuned'], '.2f')}x tuned  "
                          f"{entry['config']}", flush=True)
    timed = [r for r in rows if "error" not in r]
    peer_name = next((r["peer"] for r in timed if r["peer"]), "no peer for this device")
    vs_peer = geomean([r["tuned_vs_peer"] for r in timed])
    vs_default = geomean([r["tuned_vs_default"] for r in timed])
    print(f"summary: {len(timed)} of {len(rows)} shapes timed on {device.fingerprint.label}; tuned vs {peer_name}: geomean "
          f"{_fmt(vs_peer, '.2f')}x; tuned vs default: geomean {_fmt(vs_default, '.2f')}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device.fingerprint.to_dict(), "peer": peer_name,
                                               "precision": args.precision,
                                               "rows": rows, "geomean_tuned_vs_peer": vs_peer,
                                               "geomean_tuned_vs_default": vs_default}, indent=2))
    if args.record:
        command = record.script_command(__file__, argv)
        commit = record.code_version()
        recorded = [record.row(device=device.fingerprint.name, benchmark="gemm", workload=r["shape"],
                               precision=args.precision, unit="GFLOP/s", ours=r["tuned_gflops"],
                               peer=r["peer_gflops"], peer_name=r["peer"], command=command, commit=commit)
                    for r in timed if r["tuned_gflops"] and r["peer_gflops"]]
        record.append(args.record, recorded)
        print(f"recorded {len(recorded)} rows in {args.record}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
