"""Counters the backend keeps while it runs: ops served, ops that fell back to the CPU, GEMM/conv plans.

Increments happen on the hot path (one ``Counter`` update per op), possibly from the autograd
thread; a rare lost increment under a thread switch is acceptable for diagnostics.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

op_counts: Counter[str] = Counter()        # every call of a registered kernel, by overload
fallback_counts: Counter[str] = Counter()  # calls served by the CPU fallback, by overload
plan_sources: Counter[str] = Counter()     # GEMM/conv calls, by plan source (user, shipped, default, ...)
plans: dict[str, dict[str, Any]] = {}      # problem key -> {"algorithm", "source", "config", "lookup", "precision"}
# eager ops done inside another op's launch: "activation" (an in-place relu or relu6 inside the launch that made
# its input), "activation_backward" (a relu's or relu6's backward inside the batch norm backward after it),
# "step_count" (a batch norm's num_batches_tracked += 1 inside its forward's launch)
eager_fusions: Counter[str] = Counter()


def stats() -> dict[str, Any]:
    """A snapshot of the backend's counters.

    Keys: ``ops`` (calls per overload), ``fallback_ops`` (CPU-fallback calls per overload),
    ``plan_sources`` (GEMM/conv calls per plan source since the last reset), ``plans`` (every cached
    plan under torch's current precision flags: problem key → algorithm, source, config, the lookup
    chain that chose it and its precision, ``"fp32"`` or ``"tf32"``),
    ``plan_counts`` (cached plans per source, ``tunecl.backend.plans.SOURCES``: ``user``,
    ``user-other-driver``, ``shipped``, those three with ``-near-batch`` appended (tuned at another
    batch), ``tuned-on-miss``, ``default``), ``memory`` and ``winograd_cache`` (transformed weights
    held, their bytes, hits, misses, ...: :func:`tunecl.backend.weight_cache.stats`), ``foreach_runs`` (eager
    runs of foreach calls launched and the calls they held: :func:`tunecl.backend.foreach_runs.stats`),
    ``eager_fusions`` (eager ops done inside another op's launch, by kind: ``activation``, an in-place relu
    or relu6 inside the launch that made its input; ``activation_backward``, a relu's or relu6's backward
    inside the batch norm backward after it; ``step_count``, a batch norm's ``num_batches_tracked += 1``
    inside its forward's first launch; ``residual``, an add of a residual to a batch norm's output inside
    the batch norm's launch), and once
    ``torch.compile(backend="tunecl")`` has been used, ``compile`` (:func:`tunecl.backend.compile.stats`).
    """
    from tunecl.backend import foreach_runs, memory, weight_cache

    cached = {key: dict(value) for key, value in plans.items()}
    compiled = sys.modules.get("tunecl.backend.compile")   # (loaded by torch.compile(backend="tunecl"))
    return {
        **({"compile": compiled.stats()} if compiled is not None else {}),
        "ops": dict(op_counts),
        "fallback_ops": dict(fallback_counts),
        "plan_sources": dict(plan_sources),
        "plans": cached,
        "plan_counts": dict(Counter(value["source"] for value in cached.values())),
        "memory": memory.memory_stats(),
        "winograd_cache": weight_cache.stats(),
        "foreach_runs": foreach_runs.stats(),
        "eager_fusions": dict(eager_fusions),
    }


def reset_stats() -> None:
    """Zero the op, fallback, plan-use and eager-fusion counters and those of the Winograd weight cache and
    the foreach runs (plans and cached weights stay, and so does the plans' record)."""
    from tunecl.backend import foreach_runs, weight_cache

    weight_cache.reset_counts()
    foreach_runs.reset_counts()
    op_counts.clear()
    fallback_counts.clear()
    eager_fusions.clear()
    plan_sources.clear()
