"""GEMM plans for the backend: one plan per ``GemmProblem`` per process, found once, then a dict hit.

:func:`_choose_gemm_plan` is the single place that decides which algorithm and config serve a
problem; today it takes the first applicable algorithm's heuristic default (source ``"default"``).
The tuning-database lookup chain (user DB → shipped ``tuning_db/`` → default) plugs in there.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from tunecl import kernels
from tunecl.backend import counters, state
from tunecl.kernels.strided import Unsupported
from tunecl.problems import GemmProblem


class PlanEntry(NamedTuple):
    plan: Any          # a tunecl.kernels.base.Plan
    source: str        # "user", "shipped" or "default"
    algorithm: str
    config: dict[str, int]


_plans: dict[GemmProblem, PlanEntry] = {}
_lock = threading.Lock()


def gemm_algorithms() -> list[Any]:
    """The registered GEMM algorithms (``tunecl.kernels.algorithms("gemm")``)."""
    return kernels.algorithms("gemm")


def _choose_gemm_plan(problem: GemmProblem) -> PlanEntry:
    """Pick and build the plan for ``problem``. Wire the tuning-DB lookup here.

    Raises:
        Unsupported: no registered GEMM algorithm applies (the caller then falls back).
    """
    device = state.get().device
    for algorithm in gemm_algorithms():
        if algorithm.applies(problem, device):
            config = algorithm.default(problem, device)
            return PlanEntry(algorithm.build(problem, device, config), "default", algorithm.name, dict(config))
    raise Unsupported(f"no GEMM algorithm applies to {problem.key}")


def gemm_plan(problem: GemmProblem) -> Any:
    """The cached plan for ``problem``; builds it on first use (the only slow call per shape)."""
    entry = _plans.get(problem)
    if entry is None:
        with _lock:
            entry = _plans.get(problem)
            if entry is None:
                entry = _plans[problem] = _choose_gemm_plan(problem)
                counters.plans[problem.key] = {"algorithm": entry.algorithm, "source": entry.source,
                                            "config": entry.config}
    counters.plan_sources[entry.source] += 1
    return entry.plan


def clear() -> None:
    """Forget every cached plan (after the algorithms or the tuning DB changed)."""
    with _lock:
        _plans.clear()
        counters.plans.clear()
