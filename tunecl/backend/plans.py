"""Plans for the backend's GEMM and convolution calls: one per Problem and precision policy per process,
then a dict hit.

:func:`plan` is the hot-path entry: a dict lookup keyed by the :class:`~tunecl.problems.Problem` and
the precisions torch's flags accept for it (:func:`accepted_precisions`, :mod:`tunecl.precision`:
matmuls are strict fp32 unless ``torch.backends.cuda.matmul.allow_tf32`` or
``torch.set_float32_matmul_precision("high"|"medium")`` allows TF32; convolutions follow
``torch.backends.cudnn.allow_tf32``, true by default as in PyTorch). Only algorithms of an accepted
precision are considered. On a miss :func:`_choose_plan` decides, once per shape and policy, which
algorithm and config serve it:

1. the tuning DB's lookup chain (``open_db()``: the user DB for this exact device → the user DB
   for the same model on another driver → the shipped ``tuning_db/``), restricted to the registered
   algorithms of an accepted precision at their current versions and to results of an accepted
   precision; a hit whose algorithm does not apply to the
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
   The fp32 families are registered first, so a default plan is never TF32 (``gemm_tiled`` for GEMMs).

The source (one of :data:`SOURCES`: ``user``, ``user-other-driver``, ``shipped``, the same three with
``-near-batch`` appended, ``tuned-on-miss`` or ``default``) is recorded per problem in
``tunecl.backend.stats()["plans"]`` with the plan's precision and the lookup chain (which names the
stored problem key of a near-batch plan); when torch's flags change, the entries show the plans the
new flags are served. The chain is logged once per shape and policy on the ``tunecl.backend.plans``
logger. Nothing after the first call of a shape touches SQL or the compiler; reading torch's flags
costs ~0.3 µs a call (private getters, the policy cached per value; ~2 µs where torch refuses them because the
legacy and the new fp32_precision APIs were mixed).
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

import pyopencl as cl
import torch

from tunecl import config, kernels, precision
from tunecl.backend import counters, state
from tunecl.errors import TuneclError, Unsupported
from tunecl.problems import Problem
from tunecl.runtime import Device

if TYPE_CHECKING:
    from tunecl.db import Hit

log = logging.getLogger(__name__)

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
    precision: str = precision.FP32  # what the algorithm computes at (tunecl.precision)


_plans: dict[frozenset[str], dict[Problem, PlanEntry]] = {}  # accepted precisions -> problem -> plan
_lock = threading.Lock()

# torch's TF32 flags, read through the private getters behind torch.backends.cuda.matmul.allow_tf32,
# torch.get_float32_matmul_precision() and torch.backends.cudnn.allow_tf32 (the public ones cost ~1 µs,
# tunecl.precision.torch_flags ~2 µs; plan() runs for every matmul and convolution).
def _unavailable() -> Any:
    raise RuntimeError("this torch has no such flag getter")


_get_matmul_tf32 = getattr(torch._C, "_get_cublas_allow_tf32", _unavailable)
_get_matmul_precision = getattr(torch._C, "_get_float32_matmul_precision", _unavailable)
_get_cudnn_tf32 = getattr(torch._C, "_get_cudnn_allow_tf32", _unavailable)
# kind -> (its flags at the previous call, the precisions they accept, the plans cached for those)
_current: dict[str, tuple[Any, frozenset[str], dict[Problem, PlanEntry]]] = {}
generation = 0   # bumped by clear(): what callers derived from plans (the pre-built calls of SignatureCalls) is stale

def gemm_algorithms() -> list[Any]:
    """The registered GEMM algorithms (``tunecl.kernels.algorithms("gemm")``)."""
    return kernels.algorithms("gemm")


def conv_algorithms() -> list[Any]:
    """The registered convolution algorithms (``tunecl.kernels.algorithms("conv")``)."""
    return kernels.algorithms("conv")


def plan(problem: Problem) -> Any:
    """The cached plan for ``problem`` under torch's current precision flags; chooses and builds it on
    first use (the only slow call). The backend calls it as ``state.get().plan``, which a dry run's
    State replaces.

    Raises:
        Unsupported: no registered algorithm applies (the caller then takes the CPU route).
    """
    return plan_entry(problem).plan


state.provide(plan=plan)


def plan_entry(problem: Problem, count: bool = True) -> PlanEntry:
    """:func:`plan`'s whole entry (the plan, its source, ...), counted as one use of the plan unless not
    ``count``."""
    _, accepted, cached = _policy(problem.kind)
    entry = cached.get(problem)
    if entry is None:
        with _lock:
            entry = cached.get(problem)
            if entry is None:
                entry = _choose_plan(problem, accepted)
                cached[problem] = entry
                counters.plans[problem.key] = _stats_entry(entry)
    if count:
        counters.plan_sources[entry.source] += 1
    return entry


def accepted_precisions(kind: str) -> frozenset[str]:
    """The precisions torch's flags let a ``kind`` request be served with now
    (:func:`tunecl.precision.accepted_precisions`)."""
    return _policy(kind)[1]


def cached(problem: Problem) -> PlanEntry | None:
    """The plan entry cached for ``problem`` under torch's current flags, if any (for tests and tools)."""
    return _policy(problem.kind)[2].get(problem)


def _policy(kind: str) -> tuple[Any, frozenset[str], dict[Problem, PlanEntry]]:
    """Torch's flags for ``kind`` now, the precisions they accept and the plans cached for those (~0.2 µs:
    a matmul reads two flags, anything else cuDNN's; the policy is worked out again only when they
    change)."""
    try:
        if kind in precision.MATMUL_KINDS:
            flags: Any = (_get_matmul_tf32(), _get_matmul_precision())
        else:  # convolutions (kinds without a TF32 policy are strict whatever it says)
            flags = _get_cudnn_tf32()
    except RuntimeError:  # torch refuses the legacy getters after a mix with the new API: the policy reads
        flags = precision.torch_flags(torch)
    current = _current.get(kind)
    if current is None or current[0] != flags:
        current = _flags_changed(kind, flags)
    return current


def _flags_changed(kind: str, flags: Any) -> tuple[Any, frozenset[str], dict[Problem, PlanEntry]]:
    """Work out the policy of ``kind`` under new ``flags``; stats()["plans"] then shows, for every
    ``kind`` problem with a plan cached under them, that plan (the one its next call is served)."""
    accepted = precision.accepted_precisions(kind, precision.torch_flags(torch))
    cached = _plans.setdefault(accepted, {})
    _current[kind] = current = (flags, accepted, cached)
    for problem, entry in list(cached.items()):  # a snapshot, without the lock (held for seconds by a
        if problem.kind == kind:                  # thread choosing a plan)
            counters.plans[problem.key] = _stats_entry(entry)
    return current


def _stats_entry(entry: PlanEntry) -> dict[str, Any]:
    return {"algorithm": entry.algorithm, "source": entry.source, "config": entry.config,
            "lookup": entry.lookup, "precision": entry.precision}


def served_plan(problem: Problem) -> Any | None:
    """The cached plan of ``problem`` where a registered algorithm computes it on this device, else None
    (the caller takes another route: a float16 problem is converted to float32). Asking costs a few µs:
    each family's ``applies`` checks the dtype first and the device's probed capabilities; a plan that
    cannot be chosen also gives None."""
    st = state.get()
    device = st.device
    if not any(a.applies(problem, device) for a in kernels.algorithms(problem.kind)):
        return None
    try:
        return st.plan(problem)
    except Unsupported:
        return None


class SignatureCalls(dict):
    """Pre-built calls by call signature (ops/conv.py, ops/linalg.py): signature -> call, or None where the
    general route serves it. Everything in it was derived from the plans of one backend State: a new State
    or :func:`clear` (a new tuning DB, new algorithms) empties it at the next :meth:`lookup`."""

    def __init__(self) -> None:
        super().__init__()
        self.owner: Any = None       # the State the calls were built under
        self.generation = -1         # and the plans' generation

    def lookup(self, key: tuple) -> Any:
        """The call of ``key``, None (the general route), or the cache itself for a signature not seen yet."""
        owner = state.get()
        if self.owner is not owner or self.generation != generation:
            self.clear()
            self.owner, self.generation = owner, generation
        return self.get(key, self)

    @property
    def prebuilds(self) -> bool:
        """Whether calls may be pre-built (after :meth:`lookup`): the owner State serves the backend's own
        plans (not a dry run's or a tool's stand-in)."""
        return self.owner.plan is plan

    def keep(self, key: tuple, call: Any, limit: int) -> Any:
        """Store ``call`` for ``key`` (emptied first when it holds ``limit`` calls: a safety valve for
        ever-changing signatures); returns ``call``."""
        if len(self) >= limit:
            self.clear()
        self[key] = call
        return call


def clear() -> None:
    """Forget every cached plan (after the algorithms or the tuning DB changed)."""
    global generation
    with _lock:
        for cached in _plans.values():  # (a _policy() result in flight may hold one of them)
            cached.clear()
        _current.clear()
        counters.plans.clear()
        generation += 1


# -- choosing ----------------------------------------------------------------------------------------
def _choose_plan(problem: Problem, accepted: frozenset[str] = precision.at_least(precision.FP32)) -> PlanEntry:
    device = state.get().device
    registered = kernels.algorithms_at(problem.kind, accepted)
    by_name = {a.name: a for a in registered}
    chain: list[str] = []

    # The lookup asks for every registered algorithm at its current version and checks ``applies``
    # for the hit alone: ``applies`` of the GEMM-backed conv families enumerates a GEMM space
    # (~0.5-1 s per shape on a CPU device), too slow to ask all of them for every new shape. A hit
    # whose algorithm does not apply is refused below like one whose params fail to build.
    versions = {a.name: a.version for a in registered}
    hit = _lookup(device, problem, versions, accepted, chain)
    entry = None
    if hit is not None:
        entry = _build_stored_in_order(problem, device, by_name, hit, versions, accepted, chain)
    elif _tune_mode() == "on-miss":
        applicable = [a for a in registered if a.applies(problem, device)]
        if applicable:
            entry = _tune_on_miss(problem, device, applicable, accepted, chain)
    else:
        entry = _near_batch(problem, device, by_name, versions, accepted, chain)
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
    entry = entry._replace(lookup=" → ".join(chain), precision=precision.algorithm_precision(by_name[entry.algorithm]))
    log.info("plan for %s (accepting %s): %s → %s %s %s %s", problem.key, ",".join(sorted(accepted)), entry.lookup,
             entry.source, entry.algorithm, entry.precision, entry.config)
    return entry


def _tune_mode() -> str:
    mode = config.get().tune
    if mode not in config.TUNE_MODES:
        raise ValueError(f"TUNECL_TUNE must be one of {', '.join(config.TUNE_MODES)}, not {mode!r}")
    return mode


def _lookup(device: Device, problem: Problem, versions: dict[str, int], accepted: frozenset[str],
            chain: list[str]) -> Hit | None:
    """The DB lookup chain; an unusable user DB is reported once and skipped (shipped still served)."""
    # imported on the first plan choice: SQLAlchemy would add ~0.3 s to ``import tunecl.backend``
    from tunecl.db import open_db
    from tunecl.db import shipped as shipped_db

    fingerprint = device.fingerprint
    try:
        db = open_db()
    except TuneclError as error:
        _warn_once(f"db:{config.get().db_url}", f"tunecl: the user tuning DB cannot be used ({error}); "
                   f"conv/GEMM plans come from the shipped results or the defaults")
        chain.append("user DB unusable")
        hit = shipped_db.lookup(fingerprint, problem.key, versions, accepted)
    else:
        try:
            hit = db.lookup(fingerprint, problem, versions=versions, precision=accepted)
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
                accepted: frozenset[str], chain: list[str]) -> PlanEntry | None:
    """The first near-batch result that applies and builds (quietly skipping the others), or None."""
    from tunecl.db import open_db
    from tunecl.db import shipped as shipped_db
    from tunecl.db.near import batch_pattern

    try:
        db = open_db()
    except TuneclError:  # _lookup has warned about it: the shipped results alone
        hits = shipped_db.lookup_near_batch(device.fingerprint, batch_pattern(problem), versions, accepted)
    else:
        try:
            hits = db.lookup_near_batch(device.fingerprint, problem, versions=versions, precision=accepted)
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


def _build_stored_in_order(problem: Problem, device: Device, by_name: dict[str, Any], hit: Hit,
                           versions: dict[str, int], accepted: frozenset[str], chain: list[str]) -> PlanEntry | None:
    """The stored result ``hit`` built; where it cannot be (a config this device's compiler refuses, one
    that a change of the family made invalid), the fastest stored result of another algorithm, and so on,
    with one warning naming what was refused and what runs instead; None (the default plan) when none
    builds."""
    refused: list[str] = []
    entry = None
    while hit is not None:
        entry = _build_stored(problem, device, by_name, hit.algorithm, hit.params, hit.source, chain, quiet=True)
        if entry is not None:
            break
        refused.append(chain[-1])   # (_build_stored's entry: source, algorithm, params and why)
        versions = {name: version for name, version in versions.items() if name != hit.algorithm}
        hit = _lookup(device, problem, versions, accepted, chain) if versions else None
    if refused:
        instead = f"the {entry.source} {entry.algorithm} result" if entry is not None else "the default plan"
        warnings.warn(f"tunecl: stored tuning results for {problem.key} cannot be used: {'; '.join(refused)}; "
                      f"running {instead} instead", stacklevel=3)
    return entry


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


def _tune_on_miss(problem: Problem, device: Device, applicable: list[Any], accepted: frozenset[str],
                  chain: list[str]) -> PlanEntry | None:
    """TUNECL_TUNE=on-miss: tune briefly (at TF32 when the flags accept it: its fp32 candidates are
    stored as fp32), store the outcome in the user DB, serve the winner."""
    from tunecl import tune  # heavy (optuna); only this mode needs it
    from tunecl.db import open_db

    log.info("tuning %s on a miss (TUNECL_TUNE=on-miss: up to %d configs, %.0f s)", problem.key, TUNE_TRIALS,
             TUNE_TIME_LIMIT)
    try:
        db = open_db()
        outcome = tune.tune_problem(problem, device, db, trials=TUNE_TRIALS, time_limit=TUNE_TIME_LIMIT,
                                    algorithms=applicable,
                                    precision=precision.TF32 if precision.TF32 in accepted else precision.FP32)
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
