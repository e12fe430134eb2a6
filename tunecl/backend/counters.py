"""Counters the backend keeps while it runs: ops served, ops that fell back to the CPU, GEMM plans.

Increments happen on the hot path (one ``Counter`` update per op), possibly from the autograd
thread; a rare lost increment under a thread switch is acceptable for diagnostics.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

op_counts: Counter[str] = Counter()        # every call of a registered kernel, by overload
fallback_counts: Counter[str] = Counter()  # calls served by the CPU fallback, by overload
plan_sources: Counter[str] = Counter()     # GEMM/conv calls, by plan source (user, shipped, default)
plans: dict[str, dict[str, Any]] = {}      # problem key -> {"algorithm", "source", "config"}


def stats() -> dict[str, Any]:
    """A snapshot: ``ops``, ``fallback_ops``, ``plan_sources``, ``plans`` and ``memory``."""
    from tunecl.backend import memory

    return {
        "ops": dict(op_counts),
        "fallback_ops": dict(fallback_counts),
        "plan_sources": dict(plan_sources),
        "plans": {key: dict(value) for key, value in plans.items()},
        "memory": memory.memory_stats(),
    }


def reset_stats() -> None:
    """Zero the op, fallback and plan-use counters (plans stay cached, and so does their record)."""
    op_counts.clear()
    fallback_counts.clear()
    plan_sources.clear()
