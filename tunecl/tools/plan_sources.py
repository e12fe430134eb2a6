"""Where the conv, GEMM and attention plans of a net would come from on a device: the user tuning DB, the shipped
results, a result tuned at another batch, or the heuristic default (``tunecl db coverage``).

A net's problems are extracted on the meta device (:func:`tunecl.search.workload.net_problems`): they
are device-independent shapes, so no OpenCL device is needed, and the device may be one this machine
does not have (a fingerprint stored in the DB or the shipped files). Each problem is looked up as the
backend's plan choice looks it up (``tunecl/backend/plans.py``) with ``TUNECL_TUNE=off``, the default:

1. :meth:`TuningDB.lookup` (the user DB for this exact device and driver, for the same model on another
   driver, then the shipped results), restricted to the algorithms of an accepted precision at their
   current versions (:func:`tunecl.kernels.algorithms_at`) and to results of an accepted precision;
2. on a miss, :meth:`TuningDB.lookup_near_batch`: the same problem tuned at another batch, its first
   (closest) candidate;
3. otherwise the heuristic default.

What needs the device itself is left out: whether a stored config still applies to and builds for the
problem (where it does not, the backend runs the next near-batch candidate or the default), and whether
any family applies at all (where none does, the call runs on the CPU; ``python -m
tunecl.tools.coverage`` finds those).
"""

from __future__ import annotations

import collections
import dataclasses
import typing
from typing import Any

from tunecl import kernels, precision
from tunecl.db.records import Hit, Source
from tunecl.fingerprint import Fingerprint
from tunecl.problems import Problem

# a net's problems for inference (a forward) and for training (forward, backward-data, backward-weight)
MODES = {"inference": False, "training": True}
# where a plan comes from: the lookup chain's sources (Hit.source), then the default
SOURCES: tuple[str, ...] = (*typing.get_args(Source), "default")


def torch_flags(request: str) -> precision.TorchFlags:
    """Torch's flags for a request precision: ``fp32`` strict, ``tf32`` TF32 allowed for matmuls and
    convolutions (``allow_tf32`` set for both)."""
    if request == precision.FP32:
        return precision.STRICT
    if request == precision.TF32:
        return precision.TorchFlags(matmul_allow_tf32=True, cudnn_allow_tf32=True)
    raise ValueError(f"unknown precision {request!r}; use one of {', '.join(precision.PRECISIONS)}")


@dataclasses.dataclass(frozen=True)
class PlanSource:
    """Where one problem's plan comes from.

    Attributes:
        problem: the problem.
        calls: how often one pass of the net asks for it.
        source: one of :data:`SOURCES`.
        hit: the stored result the backend would run (None for ``default``); ``hit.problem`` is another
            batch's key for a near-batch source.
    """

    problem: Problem
    calls: int
    source: str
    hit: Hit | None = None

    def to_dict(self) -> dict[str, Any]:
        hit = self.hit
        return {"problem": self.problem.key, "calls": self.calls, "source": self.source,
                "algorithm": hit and hit.algorithm, "algorithm_version": hit and hit.algorithm_version,
                "precision": hit and hit.precision, "stored_problem": hit and hit.problem,
                "device": hit and hit.device_label}


@dataclasses.dataclass(frozen=True)
class NetCoverage:
    """The plan sources of one net at one batch, mode and request precision."""

    net: str
    batch: int
    image_size: int
    mode: str
    precision: str
    plans: tuple[PlanSource, ...]

    @property
    def counts(self) -> dict[str, int]:
        """Problems per source, every one of :data:`SOURCES` (zeros included), in that order."""
        found = collections.Counter(p.source for p in self.plans)
        return {source: found[source] for source in SOURCES}

    def to_dict(self) -> dict[str, Any]:
        return {"net": self.net, "batch": self.batch, "image_size": self.image_size, "mode": self.mode,
                "precision": self.precision, "problems": len(self.plans),
                "calls": sum(p.calls for p in self.plans), "sources": self.counts,
                "plans": [p.to_dict() for p in self.plans]}


def plan_source(db: Any, fingerprint: Fingerprint, problem: Problem, request: str, calls: int = 1) -> PlanSource:
    """Where ``problem``'s plan comes from on the device ``fingerprint`` for a ``request`` precision
    (``fp32`` or ``tf32``), looked up in ``db`` (a :class:`~tunecl.db.TuningDB`; its lookups include the
    shipped results) as the backend looks it up; see the module's docstring."""
    accepted = precision.accepted_precisions(problem.kind, torch_flags(request))
    versions = {a.name: a.version for a in kernels.algorithms_at(problem.kind, accepted)}
    hit = db.lookup(fingerprint, problem, versions=versions, precision=accepted)
    if hit is None:
        near = db.lookup_near_batch(fingerprint, problem, versions=versions, precision=accepted)
        hit = near[0] if near else None
    return PlanSource(problem, calls, "default" if hit is None else hit.source, hit)


def net_coverage(db: Any, fingerprint: Fingerprint, net: str, workload: collections.Counter[Problem], *,
                 batch: int, image_size: int, mode: str, request: str) -> NetCoverage:
    """:func:`plan_source` of every problem of ``workload`` (problem -> calls, as
    :func:`tunecl.search.workload.net_problems` counts them), in key order."""
    plans = tuple(plan_source(db, fingerprint, problem, request, calls)
                  for problem, calls in sorted(workload.items(), key=lambda item: item[0].key))
    return NetCoverage(net, batch, image_size, mode, request, plans)
