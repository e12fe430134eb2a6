"""How fast the tuner converges: best-so-far after each trial, per sampler and seed.

Each run is a fresh study of the real tuner (``tunecl.tune.tune_problem``) in a temporary Optuna
storage, with a temporary tuning DB, so nothing touches the user's. Early stopping is off (no
patience) and the small-space exhaustive switch is off, so every run does its N trials with the
sampler asked for. A trial is one evaluation of the search, in the order the tuner made them: the
defaults enqueued first count, as they do in the tuner; invalid or repeated proposals (never
measured) do not. Only verified OK results count towards best-so-far. "Final best" is the best
search measurement of the run (the tuner's re-measurement round is skipped: it adds no trials).

"Within X%" means best-so-far GFLOP/s >= (1 - X/100) x the reference GFLOP/s, at a 1-based trial
index. References: the run's own final best; the best over all runs (those of --include too); and, with
``--exhaustive-reference``, the optimum of the reduced space found by ``benchmarks/gemm_space.py``.

    python benchmarks/tuner_convergence.py --shape 256,256,256 --trials 60 --min-time 0.01
    python benchmarks/tuner_convergence.py --device nvidia --shape 4096,4096,4096 --sampler tpe --jobs 8 \
        --json tpe.json
    python benchmarks/tuner_convergence.py --device nvidia --shape 4096,4096,4096 --sampler random --jobs 8 \
        --include tpe.json --exhaustive-reference space.json --json both.json

``--include`` adds the runs of an earlier ``--json`` output (one sampler per invocation keeps each under
a time limit) to the table and the references; ``--report-only`` measures nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from tunecl import config, runtime
from tunecl.problems import GemmProblem
from tunecl.search.budget import Progress
from tunecl.search.measure import TimingPolicy
from tunecl.search.result import Result
from tunecl.tune import tune_problem

SAMPLERS = ("tpe", "random")
CURVE_AT = (10, 25, 50, 100, 200, 300)
TOLERANCES = (0.05, 0.01)


def best_so_far(results: Sequence[Result]) -> list[float | None]:
    """Seconds of the fastest OK result after each trial (None until the first OK one)."""
    curve: list[float | None] = []
    best: float | None = None
    for result in results:
        if result.ok and (best is None or result.time < best):
            best = result.time
        curve.append(best)
    return curve


def first_within(curve: Sequence[float | None], reference_s: float | None, tolerance: float) -> int | None:
    """The first 1-based trial whose best-so-far reaches ``(1 - tolerance)`` x the reference's speed."""
    if reference_s is None:
        return None
    limit = reference_s / (1 - tolerance)
    for index, best in enumerate(curve):
        if best is not None and best <= limit:
            return index + 1
    return None


def run_once(device: runtime.Device, problem: GemmProblem, sampler: str, seed: int, trials: int,
             policy: TimingPolicy, jobs: int, workdir: Path,
             time_limit: float | None = None) -> dict[str, Any]:
    """One fresh tuning run; returns its curve and summary (the convergence points come later)."""
    storage = f"sqlite:///{workdir / f'studies-{sampler}-{seed}.sqlite'}"  # a fresh study per run

    def progress(update: Progress) -> None:
        if update.phase == "search" and (update.done % 25 == 0 or update.done == update.total):
            best = f"{problem.flops / update.best.time * 1e-9:.1f}" if update.best else "-"
            print(f"    {sampler} seed {seed}: {update.done}/{update.total}  best {best} GFLOP/s  "
                  f"{update.elapsed:.0f} s", flush=True)

    # patience=None: no early stop, every run does its N trials; exhaustive_limit=0: the sampler asked
    # for even on a small space; top_k=0: no re-measurement round (it adds no trials to the curve)
    outcome = tune_problem(problem, device, db=None, trials=trials, time_limit=time_limit, sampler=sampler,
                           storage_url=storage, progress=progress, seed=seed, policy=policy, jobs=jobs,
                           patience=None, top_k=0, exhaustive_limit=0)
    curve = best_so_far(outcome.results)
    ok = [r for r in outcome.results if r.ok]
    best = min(ok, key=lambda r: r.time) if ok else None
    return {"sampler": sampler, "seed": seed, "trials": len(outcome.results), "strategy": outcome.strategy,
            "stop_reason": outcome.stop_reason, "invalid_skipped": outcome.invalid,
            "statuses": outcome.statuses, "elapsed_s": outcome.elapsed,
            "final_best_s": best.time if best else None,
            "final_gflops": problem.flops / best.time * 1e-9 if best else None,
            "final_algorithm": best.algorithm if best else None,
            "final_config": dict(best.config) if best else None,
            "default_s": curve[0] if curve else None,
            "device": device.fingerprint.label,
            "trial_s": [r.time if r.ok else None for r in outcome.results],
            "best_so_far_s": curve}


def add_convergence(run: dict[str, Any], references: dict[str, float | None]) -> None:
    """Fill ``run["within"][reference][tolerance]`` with the first trial that reaches it."""
    run["within"] = {name: {f"{round(t * 100)}%": first_within(run["best_so_far_s"], ref, t)
                            for t in TOLERANCES}
                     for name, ref in references.items() if ref is not None}


def read_exhaustive(path: str, problem: GemmProblem) -> dict[str, Any]:
    """The reduced-space optimum from a ``benchmarks/gemm_space.py --json`` file."""
    data = json.loads(Path(path).read_text())
    if data.get("problem") != problem.key:
        raise SystemExit(f"{path} is for {data.get('problem')}, not {problem.key}")
    if not data.get("exhaustive_best_s"):
        raise SystemExit(f"{path} holds no exhaustive best (nothing verified?)")
    return {"file": path, "best_s": data["exhaustive_best_s"], "config": data.get("exhaustive_best_config"),
            "device": data.get("device"), "reduced_space": data.get("reduced_space"),
            "measured": data.get("measured")}


def read_runs(path: str, problem: GemmProblem) -> list[dict[str, Any]]:
    """The runs of an earlier ``--json`` output (their convergence points are recomputed)."""
    data = json.loads(Path(path).read_text())
    if data.get("problem") != problem.key:
        raise SystemExit(f"{path} is for {data.get('problem')}, not {problem.key}")
    return [{**run, "from": run.get("from") or path, "device": data.get("device")}
            for run in data.get("runs", [])]


def _cell(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def print_report(runs: list[dict[str, Any]], problem: GemmProblem, references: dict[str, float | None],
                 trials: int) -> None:
    def gflops(seconds: float | None) -> float | None:
        return problem.flops / seconds * 1e-9 if seconds else None

    names = [name for name, ref in references.items() if ref is not None and name != "own"]
    print(f"\nreferences: overall best {_cell(gflops(references['overall']), '.1f')} GFLOP/s"
          + (f"; reduced-space exhaustive optimum {gflops(references['exhaustive']):.1f} GFLOP/s"
             if references.get("exhaustive") else ""))
    print("trial (1-based) at which best-so-far first reaches 95% / 99% of the reference's GFLOP/s:")
    head = f"{'sampler':>7} {'seed':>4} {'trials':>6} {'final':>9} {'own 5%':>6} {'own 1%':>6}"
    head += "".join(f" {name[:7] + ' 5%':>10} {name[:7] + ' 1%':>10}" for name in names)
    print(head + "  best algorithm")
    print(f"{'':>7} {'':>4} {'':>6} {'GFLOP/s':>9}")
    for run in runs:
        within, final = run["within"], _cell(run["final_gflops"], ".1f")
        line = (f"{run['sampler']:>7} {run['seed']:>4} {run['trials']:>6} {final:>9} "
                f"{_cell(within.get('own', {}).get('5%')):>6} {_cell(within.get('own', {}).get('1%')):>6}")
        line += "".join(f" {_cell(within.get(n, {}).get('5%')):>10} {_cell(within.get(n, {}).get('1%')):>10}"
                        for n in names)
        print(line + f"  {run['final_algorithm'] or '-'}")
    points = sorted({n for n in CURVE_AT if n <= trials} | {trials})
    print("\nbest-so-far GFLOP/s at trial:")
    print(f"{'sampler':>7} {'seed':>4}" + "".join(f" {n:>8}" for n in points))
    for run in runs:
        curve = run["best_so_far_s"]
        cells = [gflops(curve[n - 1]) if n <= len(curve) else None for n in points]
        print(f"{run['sampler']:>7} {run['seed']:>4}" + "".join(f" {_cell(c, '.1f'):>8}" for c in cells))
    if references.get("exhaustive"):
        ratios = [references["exhaustive"] / r["final_best_s"] if r["final_best_s"] else None for r in runs]
        print("\nfinal best / reduced-space exhaustive optimum (GFLOP/s ratio): " + ", ".join(
            f"{r['sampler']}#{r['seed']} {_cell(ratio, '.3f')}" for r, ratio in zip(runs, ratios)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", metavar="SEL", help="device index, name part or platform:device")
    parser.add_argument("--shape", default="4096,4096,4096", metavar="M,N,K[,ta,tb]")
    parser.add_argument("--trials", type=int, default=300, help="trials per run (default 300)")
    parser.add_argument("--sampler", choices=SAMPLERS, help="one sampler (default: each of tpe, random)")
    parser.add_argument("--seeds", type=int, default=1, help="runs per sampler, seeds 0..S-1 (default 1)")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds of samples per trial")
    parser.add_argument("--time-limit", type=float, metavar="S",
                        help="stop a run after this many seconds of searching (it reports fewer trials)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="compile this many candidates at once")
    parser.add_argument("--exhaustive-reference", metavar="FILE",
                        help="JSON written by benchmarks/gemm_space.py --json for the same shape")
    parser.add_argument("--include", metavar="FILE", action="append", default=[],
                        help="add the runs of an earlier --json output for the same shape (repeatable)")
    parser.add_argument("--report-only", action="store_true", help="run nothing; report the --include runs")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.seeds < 1 or args.jobs < 1:
        parser.error("--trials, --seeds and --jobs must be at least 1")

    device = runtime.select_device(args.device)
    problem = GemmProblem.from_spec(args.shape)
    exhaustive = read_exhaustive(args.exhaustive_reference, problem) if args.exhaustive_reference else None
    policy = TimingPolicy(min_time=args.min_time)
    samplers = [] if args.report_only else [args.sampler] if args.sampler else list(SAMPLERS)
    included = [run for path in args.include for run in read_runs(path, problem)]
    if samplers:
        print(f"{problem.key} on {device.fingerprint.label}: {args.trials} trials per run, samplers "
              f"{', '.join(samplers)}, seeds 0..{args.seeds - 1}, min-time {args.min_time} s, "
              f"jobs {args.jobs}; early stopping off (no patience), so every run does all its trials",
              flush=True)
    else:
        print(f"{problem.key}: {len(included)} earlier runs, measured with early stopping off", flush=True)
    for path in dict.fromkeys(r["from"] for r in included):
        others = {r["device"] for r in included if r["from"] == path} - {device.fingerprint.label}
        print(f"  + runs from {path}" + (f" (measured on {', '.join(map(str, others))})" if others else ""))
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tunecl-convergence-") as tmp:
        workdir = Path(tmp)
        with config.override(db_url=f"sqlite:///{workdir / 'tuning.sqlite'}",
                             storage_url=f"sqlite:///{workdir / 'studies.sqlite'}"):
            for sampler in samplers:
                for seed in range(args.seeds):
                    runs.append(run_once(device, problem, sampler, seed, args.trials, policy, args.jobs,
                                         workdir, args.time_limit))
    runs += included
    finals = [r["final_best_s"] for r in runs if r["final_best_s"] is not None]
    references = {"own": None, "overall": min(finals) if finals else None,
                  "exhaustive": exhaustive["best_s"] if exhaustive else None}
    for run in runs:
        add_convergence(run, {**references, "own": run["final_best_s"]})
    print_report(runs, problem, references, max([len(r["best_so_far_s"]) for r in runs], default=0))
    if args.json:
        summary = {"problem": problem.key, "device": device.fingerprint.label,
                   "trials": args.trials if samplers else None, "min_time": args.min_time, "jobs": args.jobs,
                   "early_stopping": False,
                   "within_means": "first 1-based trial whose best-so-far GFLOP/s >= (1 - tol) x reference",
                   "overall_best_s": references["overall"], "exhaustive": exhaustive, "runs": runs}
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
