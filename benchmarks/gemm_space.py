"""Exhaustive search of a reduced GEMM space, to judge the tuner against the true optimum.

The reduced space varies only the parameters named by ``--vary``; every other parameter is held as
close to the algorithm's default as validity allows (for each combination of the varied values, the
valid config sharing the most values with the default is taken). Every config is built, verified and
timed exactly as the tuner does (``tunecl.search.evaluate``). Prints the best few, the default, and —
when the tuning DB holds a result for the shape — the tuned time, with the ratios.

    python benchmarks/gemm_space.py --device nvidia --shape 4096,4096,4096 --count-only
    python benchmarks/gemm_space.py --device nvidia --shape 4096,4096,4096 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from tunecl import runtime
from tunecl.db import TuningDB
from tunecl.kernels import algorithm as find_algorithm
from tunecl.problems import GemmProblem
from tunecl.search.evaluate import evaluate
from tunecl.search.harness_registry import harness_for
from tunecl.search.measure import TimingPolicy

VARY = "MWG,NWG,MDIMC,NDIMC,DB,MAXRREG"


def reduced_space(configs: list[dict[str, int]], default: dict[str, int], vary: list[str]) -> list[dict]:
    """One config per combination of the ``vary`` values: the one closest to ``default``."""
    chosen: dict[tuple, tuple[int, dict]] = {}
    for config in configs:
        key = tuple(config[name] for name in vary)
        distance = sum(config[name] != default.get(name) for name in config if name not in vary)
        if key not in chosen or distance < chosen[key][0]:
            chosen[key] = (distance, config)
    return [config for _, config in sorted(chosen.values(), key=lambda item: sorted(item[1].items()))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", metavar="SEL")
    parser.add_argument("--shape", default="4096,4096,4096", metavar="M,N,K[,ta,tb]")
    parser.add_argument("--algorithm", default="gemm_tiled")
    parser.add_argument("--vary", default=VARY, help=f"parameters that vary (default {VARY})")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds of samples per config")
    parser.add_argument("--time-limit", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--count-only", action="store_true", help="print the reduced space's size only")
    parser.add_argument("--db", metavar="URL", help="tuning DB holding the tuned result (default TUNECL_DB)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    device = runtime.select_device(args.device)
    problem = GemmProblem.from_spec(args.shape)
    algorithm = find_algorithm(args.algorithm)
    space = algorithm.space(problem, device)
    default = algorithm.default(problem, device)
    vary = [name.strip() for name in args.vary.split(",") if name.strip()]
    configs = reduced_space(space.configs(), default, vary)
    print(f"{algorithm.name} on {problem.key}: {len(space.configs())} valid configs, reduced space "
          f"(varying {', '.join(vary)}): {len(configs)}", flush=True)
    if args.count_only:
        return 0

    policy = TimingPolicy(min_time=args.min_time)
    harness = harness_for(problem, device)  # one reference for all configs
    start = time.perf_counter()
    results = []
    for i, config in enumerate([default] + configs):
        if args.time_limit and time.perf_counter() - start > args.time_limit:
            print(f"time limit reached after {i} configs", flush=True)
            break
        result = evaluate(algorithm, problem, device, config, harness=harness, space=space, policy=policy)
        results.append(result)
        if i % 20 == 0:
            print(f"  {i}/{len(configs)}  {time.perf_counter() - start:.0f} s", flush=True)
    ok = sorted((r for r in results if r.ok), key=lambda r: r.time)
    failed = [r for r in results if not r.ok]
    gflops = lambda t: problem.flops / t / 1e9  # noqa: E731
    print(f"\n{len(ok)} ok, {len(failed)} failed ({', '.join(sorted({r.status.value for r in failed})) or '-'})")
    for r in ok[:5]:
        print(f"  {r.time * 1e3:9.4f} ms  {gflops(r.time):9.1f} GFLOP/s  {r.config}")
    default_result = results[0]
    db = TuningDB(args.db) if args.db else TuningDB()
    hit = db.best(device.fingerprint, problem, versions={algorithm.name: algorithm.version})
    summary = {"problem": problem.key, "device": device.fingerprint.label, "reduced_space": len(configs),
               "measured": len(results), "exhaustive_best_s": ok[0].time if ok else None,
               "exhaustive_best_config": ok[0].config if ok else None,
               "default_s": default_result.time if default_result.ok else None,
               "tuned_s": hit.time_s if hit else None}
    if ok:
        print(f"exhaustive best {ok[0].time * 1e3:.4f} ms; default {default_result.time * 1e3:.4f} ms "
              f"(best/default {default_result.time / ok[0].time:.2f}x)")
    if hit and ok:
        print(f"tuned (DB, {hit.algorithm}) {hit.time_s * 1e3:.4f} ms: tuned is {hit.time_s / ok[0].time:.3f}x "
              f"the exhaustive best of the reduced space")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
