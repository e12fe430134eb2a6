"""Check, one problem at a time, every plan a net would run: ``python -m tunecl.tools.plancheck``.

``tunecl validate`` compares whole nets, so when a gradient is off it cannot say which convolution,
matmul or attention is to blame. This walks the net's workload (:func:`tunecl.search.workload.net_problems`:
the conv, GEMM and attention problems the backend will ask for, backward directions with ``--train``), asks the
backend's plan cache for the plan it would run — under torch's current precision flags, through
the same lookup chain (user, shipped, near-batch, default) — and verifies each plan with the tuner's
own harness: fresh guarded buffers, a float64 reference, the tolerance of the plan's precision.

    python -m tunecl.tools.plancheck --net resnet18 --batch 4 --image-size 224 --train
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from tunecl.tools import use_device


@dataclass
class PlanCheck:
    problem: str
    count: int
    source: str
    algorithm: str
    precision: str
    config: dict[str, int]
    error: str | None   # None: the plan computed the problem within its tolerance


def check_net_plans(net: str, *, device: str | None = None, batch: int = 2, image_size: int = 64,
                    train: bool = False) -> list[PlanCheck]:
    """Every conv, GEMM and attention problem of ``net`` with the plan the backend serves for it, verified."""
    use_device(device)
    from tunecl.backend import plans, state
    from tunecl.search.harness_registry import harness_for
    from tunecl.search.workload import net_problems

    dev = state.get().device
    checks = []
    for problem, count in sorted(net_problems(net, batch, image_size, train, dev.fingerprint.device_type).items(),
                                 key=lambda item: item[0].key):
        plans.plan(problem)
        entry = plans.cached(problem)
        binding = harness_for(problem, dev).bind(entry.plan)
        try:
            error = binding.check()
        except Exception as failure:  # noqa: BLE001  (a launch failure is this plan's verdict)
            error = f"{type(failure).__name__}: {failure}"
        finally:
            binding.release()
        checks.append(PlanCheck(problem.key, count, entry.source, entry.algorithm, entry.precision,
                                dict(entry.config), error))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tunecl.tools.plancheck", description=__doc__.split("\n")[0])
    parser.add_argument("--net", required=True)
    parser.add_argument("--device", metavar="SEL")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--train", action="store_true", help="add the backward directions")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    checks = check_net_plans(args.net, device=args.device, batch=args.batch, image_size=args.image_size,
                             train=args.train)
    bad = [c for c in checks if c.error]
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            verdict = "ok  " if c.error is None else "FAIL"
            print(f"{verdict} {c.problem}  x{c.count}  {c.source} {c.algorithm} ({c.precision}) {c.config}")
            if c.error:
                print(f"     {c.error}")
        print(f"{len(checks) - len(bad)}/{len(checks)} plans ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
