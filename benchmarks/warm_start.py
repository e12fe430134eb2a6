"""Does starting a search from similar problems' winners pay? Tuned time with and without a warm start.

The conv/GEMM problems of a net are tuned once at ``--from-batch`` with ``--source-trials`` trials (the
stored results a warm start reads), then each problem at ``--batch`` is tuned twice with the same small
``--trials`` budget: from the defaults alone (``warm_start=0``) and with the winners of the most similar
stored problems enqueued after the defaults (``--warm-start N``). Each run has its own temporary Optuna
storage and a copy of the source DB, so neither sees the other's trials; nothing touches the user's DB
(the shipped results are switched off). Printed per problem: the default config's time, each run's tuned
time, and cold / warm (above 1: the warm start found a faster config within the budget); then the
geometric mean and the spread of that ratio.

    python benchmarks/warm_start.py --net resnet18 --from-batch 2 --batch 8 --image-size 32 --limit 6
    python benchmarks/warm_start.py --device nvidia --net resnet50 --from-batch 16 --batch 64 --trials 12
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="resnet18")
    parser.add_argument("--device", default=None, help="device selector (default: TUNECL_DEVICE or 0)")
    parser.add_argument("--from-batch", type=int, default=2, help="batch of the stored source results")
    parser.add_argument("--batch", type=int, default=8, help="batch of the problems tuned twice")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--train", action="store_true", help="training problems (all three directions)")
    parser.add_argument("--limit", type=int, default=6, help="the N problems with the most FLOPs (default 6)")
    parser.add_argument("--source-trials", type=int, default=24)
    parser.add_argument("--trials", type=int, default=8, help="trials of each compared run (default 8)")
    parser.add_argument("--warm-start", type=int, default=6)
    parser.add_argument("--min-time", type=float, default=0.01)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="tunecl-warm-start-"))
    os.environ["TUNECL_SHIPPED_DB"] = ""   # the comparison reads only what this run stored
    from tunecl import runtime
    from tunecl.db import TuningDB
    from tunecl.search.measure import TimingPolicy
    from tunecl.search.workload import net_problems
    from tunecl.tune import tune_problem

    device = runtime.select_device(args.device)
    policy = TimingPolicy(min_time=args.min_time)

    def top(batch: int) -> list:
        problems = net_problems(args.net, batch, args.image_size, args.train)
        return sorted(problems, key=lambda p: -p.flops * problems[p])[:args.limit]

    source_db = work / "source.sqlite"
    print(f"device: {device.name} | {args.net}, image {args.image_size}: {args.limit} problems stored at batch "
          f"{args.from_batch} ({args.source_trials} trials each), compared at batch {args.batch} with "
          f"{args.trials} trials, warm start {args.warm_start} vs none", flush=True)
    with TuningDB(str(source_db)) as db:
        for problem in top(args.from_batch):
            tune_problem(problem, device, db, trials=args.source_trials, storage_url=str(work / "source-studies.sqlite"),
                         policy=policy, warm_start=0)
    ratios = []
    print(f"{'problem':72s} {'default ms':>10s} {'cold ms':>8s} {'warm ms':>8s} {'cold/warm':>9s} {'hints':>5s}")
    for index, problem in enumerate(top(args.batch)):
        runs = {}
        for label, warm in (("cold", 0), ("warm", args.warm_start)):
            db_path = work / f"{label}-{index}.sqlite"
            shutil.copy(source_db, db_path)
            with TuningDB(str(db_path)) as db:
                runs[label] = tune_problem(problem, device, db, trials=args.trials, policy=policy, warm_start=warm,
                                           storage_url=str(work / f"{label}-{index}-studies.sqlite"))
        cold, warm = runs["cold"], runs["warm"]
        if cold.winner is None or warm.winner is None:
            print(f"{problem.key[:72]:72s} no verified result in one of the runs")
            continue
        ratio = cold.winner.time / warm.winner.time
        ratios.append(ratio)
        default = cold.default.time * 1e3 if cold.default is not None and cold.default.ok else float("nan")
        print(f"{problem.key[:72]:72s} {default:10.4g} {cold.winner.time * 1e3:8.4g} {warm.winner.time * 1e3:8.4g} "
              f"{ratio:9.3f} {warm.hints:5d}", flush=True)
    if ratios:
        mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
        print(f"cold / warm tuned time: geometric mean {mean:.3f} over {len(ratios)} problems "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}; above 1: the warm start found faster configs)")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
