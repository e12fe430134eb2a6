"""Plans for the backend's GEMM and convolution calls: one per Problem per process, then a dict hit.

:func:`plan` is the hot-path entry: a dict lookup keyed by the :class:`~tunecl.problems.Problem`.
On a miss :func:`_choose_plan` decides, once per shape, which algorithm and config serve it:

1. the tuning DB's lookup chain (``open_db()``: the user DB for this exact device → the user DB
   for the same model on another driver → the shipped ``tuning_db/``), restricted to the registered
   algorithms at their current versions, fp32 only; a hit whose algorithm does not apply to the
   problem or whose params fail to build is replaced by the default, with one warning;
2. on a miss with ``TUNECL_TUNE=on-miss``: a short tuning run (:data:`TUNE_TRIALS` evaluations,
   :data:`TUNE_TIME_LIMIT` seconds) that stores its result in the user DB, then serves the winner —
   an unseen shape is tuned, never guessed from another batch;
3. on a miss with ``TUNECL_TUNE=off`` (the default): the same problem tuned at another batch
   (``TuningDB.lookup_near_batch``; conv: any ``n``, gemm: ``m`` within a factor of 4, see
   :mod:`tunecl.db.near`), over the same sources in the same order, closest batch first. A candidate
   is only a guess: one that does not apply or build is skipped without a warning, up to
   :data:`NEAR_BATCH_TRIES` distinct configs;
4. otherwise the first applicable algorithm's heuristic default — the tuner's "default" baseline.

The source (one of :data:`SOURCES`: ``user``, ``user-other-driver``, ``shipped``, the same three with
``-near-batch`` appended, ``tuned-on-miss`` or ``default``) is recorded per problem in
``tunecl.backend.stats()["plans"]`` with the lookup chain (which names the stored problem key of a
near-batch plan); the chain is logged once per shape on the ``tunecl.backend.plans`` logger. Nothing
after the first call of a shape touches SQL or the compiler.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

import pyopencl as cl

from tunecl import config, kernels
from tunecl.backend import counters, state
from tunecl.errors import TuneclError
from tunecl.kernels.strided import Unsupported
from tunecl.problems import ConvProblem, GemmProblem, Problem
from tunecl.runtime import Device

if TYPE_CHECKING:
    from tunecl.db import Hit

log = logging.getLogger(__name__)

PRECISION = "fp32"
SOURCES = ("user", "user-other-driver", "shipped", "user-near-batch", "user-other-driver-near-batch",
           "shipped-near-batch", "tuned-on-miss", "default")
TUNE_TRIALS = 8          # the on-miss budget: evaluations ...
TUNE_TIME_LIMIT = 10.0   # ... and seconds of searching per shape
NEAR_BATCH_TRIES = 4     # distinct near-batch configs built per shape before the default serves

# What building a stored config can raise when the config no longer fits (ValueError, KeyError:
# invalid or missing parameters; TuneclError: BuildError; cl.Error: kernel creation or allocation).
_BUILD_ERRORS = (ValueError, KeyError, TypeError, TuneclError, cl.Error)


class PlanEntry(NamedTuple):
    plan: Any          # a tunecl.kernels.base.Plan
    source: str        # one of SOURCES
    algorithm: str
    config: dict[str, int]
    lookup: str = ""   # the lookup chain that led here, for stats() and the log


_plans: dict[Problem, PlanEntry] = {}
_lock = threading.Lock()


def gemm_algorithms() -> list[Any]:
    """The registered GEMM algorithms (``tunecl.kernels.algorithms("gemm")``)."""
    return kernels.algorithms("gemm")


def conv_algorithms() -> list[Any]:
    """The registered convolution algorithms (``tunecl.kernels.algorithms("conv")``)."""
    return kernels.algorithms("conv")


def plan(problem: Problem) -> Any:
    """The cached plan for ``problem``; chooses and builds it on first use (the only slow call).

    Raises:
        Unsupported: no registered algorithm applies (the caller then takes the CPU route).
    """
    entry = _plans.get(problem)
    if entry is None:
        with _lock:
            entry = _plans.get(problem)
            if entry is None:
                entry = _choose_plan(problem)
                _plans[problem] = entry
                counters.plans[problem.key] = {"algorithm": entry.algorithm, "source": entry.source,
                                               "config": entry.config, "lookup": entry.lookup}
    counters.plan_sources[entry.source] += 1
    return entry.plan


def gemm_plan(problem: GemmProblem) -> Any:
    """The cached plan of a GEMM (see :func:`plan`)."""
    return plan(problem)


def conv_plan(problem: ConvProblem) -> Any:
    """The cached plan of one convolution direction (see :func:`plan`)."""
    return plan(problem)


def clear() -> None:
    """Forget every cached plan (after the algorithms or the tuning DB changed)."""
    with _lock:
        _plans.clear()
        counters.plans.clear()


# -- choosing ----------------------------------------------------------------------------------------
def _choose_plan(problem: Problem) -> PlanEntry:
    device = state.get().device
    registered = kernels.algorithms(problem.kind)
    by_name = {a.name: a for a in registered}
    chain: list[str] = []

    # The lookup asks for every registered algorithm at its current version and checks ``applies``
    # for the hit alone: ``applies`` of the GEMM-backed conv families enumerates a GEMM space
    # (~0.5-1 s per shape on a CPU device), too slow to ask all of them for every new shape. A hit
    # whose algorithm does not apply is refused below like one whose params fail to build.
    versions = {a.name: a.version for a in registered}
    hit = _lookup(device, problem, versions, chain)
    entry = None
    if hit is not None:
        entry = _build_stored(problem, device, by_name, hit.algorithm, hit.params, hit.source, chain)
    elif _tune_mode() == "on-miss":
        applicable = [a for a in registered if a.applies(problem, device)]
        if applicable:
            entry = _tune_on_miss(problem, device, applicable, chain)
    else:
        entry = _near_batch(problem, device, by_name, versions, chain)
    if entry is None:
        first = next((a for a in registered if a.applies(problem, device)), None)
        if first is None:
            raise Unsupported(f"no {problem.kind} algorithm applies to {problem.key}")
        config_ = dict(first.default(problem, device))
        try:
            entry = PlanEntry(first.build(problem, device, config_), "default", first.name, config_)
        except _BUILD_ERRORS as error:  # a bug in the family: the CPU route (a counted fallback) serves
            raise Unsupported(f"the default {first.name} plan for {problem.key} failed to build: "
                              f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from error
    entry = entry._replace(lookup=" → ".join(chain))
    log.info("plan for %s: %s → %s %s %s", problem.key, entry.lookup, entry.source, entry.algorithm, entry.config)
    return entry


def _tune_mode() -> str:
    mode = config.get().tune
    if mode not in config.TUNE_MODES:
        raise ValueError(f"TUNECL_TUNE must be one of {', '.join(config.TUNE_MODES)}, not {mode!r}")
    return mode


def _lookup(device: Device, problem: Problem, versions: dict[str, int], chain: list[str]) -> Hit | None:
    """The DB lookup chain; an unusable user DB is reported once and skipped (shipped still served)."""
    # imported on the first plan choice: SQLAlchemy would add ~0.3 s to ``import tunecl.backend``
    from tunecl.db import open_db
    from tunecl.db import shipped as shipped_db
    from tunecl.db.records import precision_set

    fingerprint = device.fingerprint
    try:
        db = open_db()
    except TuneclError as error:
        _warn_once(f"db:{config.get().db_url}", f"tunecl: the user tuning DB cannot be used ({error}); "
                   f"conv/GEMM plans come from the shipped results or the defaults")
        chain.append("user DB unusable")
        hit = shipped_db.lookup(fingerprint, problem.key, versions, precision_set(PRECISION))
    else:
        try:
            hit = db.lookup(fingerprint, problem, versions=versions, precision=PRECISION)
        except TuneclError as error:
            _warn_once(f"db:{db.display_url}", f"tunecl: tuning DB lookup failed ({error}); using defaults")
            chain.append("lookup failed")
            return None
    if hit is None:
        chain.append("no user or shipped result")
    else:
        chain.append(f"{hit.source} result {hit.algorithm} v{hit.algorithm_version}")
    return hit


def _near_batch(problem: Problem, device: Device, by_name: dict[str, Any], versions: dict[str, int],
                chain: list[str]) -> PlanEntry | None:
    """The first near-batch result that applies and builds (quietly skipping the others), or None."""
    from tunecl.db import open_db
    from tunecl.db import shipped as shipped_db
    from tunecl.db.near import batch_pattern
    from tunecl.db.records import precision_set

    try:
        db = open_db()
    except TuneclError:  # _lookup has warned about it: the shipped results alone
        hits = shipped_db.lookup_near_batch(device.fingerprint, batch_pattern(problem), versions,
                                            precision_set(PRECISION))
    else:
        try:
            hits = db.lookup_near_batch(device.fingerprint, problem, versions=versions, precision=PRECISION)
        except TuneclError as error:
            chain.append(f"near-batch lookup failed: {error}")
            return None
    tried: set[tuple[str, str]] = set()
    for hit in hits:
        attempt = (hit.algorithm, repr(sorted(hit.params.items())))
        if attempt in tried:  # another batch tuned to the same config: it failed already
            continue
        if len(tried) == NEAR_BATCH_TRIES:
            chain.append(f"no more than {NEAR_BATCH_TRIES} near-batch configs tried")
            break
        tried.add(attempt)
        chain.append(f"{hit.source} result {hit.algorithm} v{hit.algorithm_version} of {hit.problem}")
        entry = _build_stored(problem, device, by_name, hit.algorithm, hit.params, hit.source, chain,
                              quiet=True)
        if entry is not None:
            return entry
    return None


def _build_stored(problem: Problem, device: Device, by_name: dict[str, Any], algorithm: str,
                  params: dict[str, Any], source: str, chain: list[str],
                  quiet: bool = False) -> PlanEntry | None:
    """Build a stored or freshly tuned config; None when it cannot be built, after one warning unless
    ``quiet`` (a near-batch result is only a guess: the next candidate or the default serves)."""
    found = by_name.get(algorithm)
    try:
        if found is None or not found.applies(problem, device):
            raise ValueError(f"{algorithm} does not apply to this problem")
        config_ = {str(k): int(v) for k, v in params.items()}
        return PlanEntry(found.build(problem, device, config_), source, algorithm, config_)
    except _BUILD_ERRORS as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        chain.append(f"{source} {algorithm} {params} unusable: {reason}")
        if not quiet:
            warnings.warn(f"tunecl: the {source} tuning result for {problem.key} ({algorithm} {params}) "
                          f"cannot be used ({reason}); running the default plan instead", stacklevel=2)
        return None


def _tune_on_miss(problem: Problem, device: Device, applicable: list[Any], chain: list[str]) -> PlanEntry | None:
    """TUNECL_TUNE=on-miss: tune briefly, store the outcome in the user DB, serve the winner."""
    from tunecl import tune  # heavy (optuna); only this mode needs it
    from tunecl.db import open_db

    log.info("tuning %s on a miss (TUNECL_TUNE=on-miss: up to %d configs, %.0f s)", problem.key, TUNE_TRIALS,
             TUNE_TIME_LIMIT)
    try:
        db = open_db()
        outcome = tune.tune_problem(problem, device, db, trials=TUNE_TRIALS, time_limit=TUNE_TIME_LIMIT,
                                    algorithms=applicable)
    except (TuneclError, OSError) as error:  # DB or storage trouble: run the model anyway
        chain.append(f"tuning failed: {error}")
        _warn_once(f"tune:{problem.key}", f"tunecl: tuning {problem.key} on a miss failed ({error}); "
                   f"running the default plan")
        return None
    winner = outcome.winner
    if winner is None:
        chain.append("tuning found no verified config")
        return None
    chain.append(f"tuned {outcome.trials} configs in {outcome.elapsed:.1f} s")
    by_name = {a.name: a for a in applicable}
    return _build_stored(problem, device, by_name, winner.algorithm, dict(winner.config), "tuned-on-miss", chain)


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)
