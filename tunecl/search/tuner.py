"""The tuner: one problem on one device → an Optuna study over the applicable algorithms → an outcome.

Studies live in Optuna storage (the search's working memory; the tuning DB holds the curated outcome).
A study's name is ``tunecl:<device key>:<problem key>:<algorithm@version+...#space digest>:<strategy>``,
so running the same tuning again — after a crash, a Ctrl-C or on purpose — resumes that study:
finished trials are read back, not measured again (see :mod:`tunecl.search.strategies`). A new
driver, a bumped algorithm version, changed parameter value lists or another strategy start a new
study.

Precision: a tuner serves one requested precision (``"fp32"``, the default, or ``"tf32"``) and
considers only the algorithms whose results satisfy it (:func:`tunecl.precision.at_least`): an fp32
study never sees a TF32 algorithm, a TF32 study sees the fp32 ones too. Every candidate is verified
with the tolerance of its own algorithm's precision and the outcome says which precision each
algorithm's results have, so they are stored under it. The algorithms are part of the study name, so
studies of different precisions differ wherever their candidates do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna

from tunecl import __version__, config
from tunecl.errors import TuneclError
from tunecl.kernels import algorithms as registered_algorithms
from tunecl.kernels.base import Algorithm, Space
from tunecl.precision import FP32, algorithm_precision, at_least
from tunecl.problems import Problem
from tunecl.runtime import Device
from tunecl.search.evaluate import evaluate
from tunecl.search.harness import Harness
from tunecl.search.harness_registry import harness_for
from tunecl.search.measure import TimingPolicy
from tunecl.search.prebuild import Prebuilder
from tunecl.search.result import Config, Result, Status, config_key
from tunecl.search.space import SearchSpace
from tunecl.search.strategies import STRATEGIES, Budget, ProgressCallback, SearchLog, quiet_optuna

SAMPLERS = ("tpe", "random", "grid")
DEFAULT_TRIALS = 100  # when neither a trial count nor a time limit is given
DEFAULT_PATIENCE = 40  # evaluations without a 1% gain before a sampled search stops
EXHAUSTIVE_LIMIT = 200  # valid spaces up to this size are searched exhaustively
KIND_NAMES = {"gemm": "GEMM", "conv": "convolution", "attention": "attention"}


class NoAlgorithmError(TuneclError, LookupError):
    """No algorithm exists for, or applies to, the problem on the device."""


@dataclasses.dataclass(frozen=True)
class TuneOutcome:
    """What tuning one problem produced.

    Attributes:
        problem: the problem tuned.
        device: the device's label.
        winner: the fastest verified result after re-measurement (None if nothing verified).
        default: the untuned baseline: the default config of the first applicable algorithm (the one
            a lookup miss falls back to).
        defaults: each algorithm's default-config result.
        per_algorithm: each algorithm's best verified result.
        versions: algorithm name -> version tuned.
        trials: evaluations in the study (resumed ones included, invalid proposals excluded).
        resumed: evaluations read back from the study instead of measured.
        invalid: invalid proposals skipped (never compiled) in this call.
        trials_per_algorithm: evaluations per algorithm.
        statuses: how many evaluations ended in each status.
        study_name: the Optuna study.
        storage_url: the Optuna storage (password hidden).
        strategy: the strategy used (``exhaustive`` when the valid space was small).
        space_size: valid configs over all applicable algorithms; None when more than the
            exhaustive limit (large spaces are not counted to the end).
        stop_reason: why the search stopped.
        elapsed: seconds this call took.
        results: every evaluation of the search, in order.
        final: the re-measurement round.
        precision: the precision the study served (its candidates satisfy it).
        precisions: algorithm name -> the precision its results have (what they are stored under);
            algorithms missing here are fp32.
        tried: the result of each config asked to try (``seeds``), re-measured where the final round
            did; configs the trial budget left out are missing.
        hints: how many configs of similar problems (``hints``) the search started from.
        hint_won: whether the winner is one of them.
    """

    problem: Problem
    device: str
    winner: Result | None
    default: Result | None
    defaults: dict[str, Result]
    per_algorithm: dict[str, Result]
    versions: dict[str, int]
    trials: int
    resumed: int
    invalid: int
    trials_per_algorithm: dict[str, int]
    statuses: dict[str, int]
    study_name: str
    storage_url: str
    strategy: str
    space_size: int | None
    stop_reason: str
    elapsed: float
    results: tuple[Result, ...] = ()
    final: tuple[Result, ...] = ()
    precision: str = FP32
    precisions: dict[str, str] = dataclasses.field(default_factory=dict)
    tried: tuple[Result, ...] = ()
    hints: int = 0
    hint_won: bool = False

    def precision_of(self, algorithm: str) -> str:
        """The precision of ``algorithm``'s results (fp32 unless the outcome says otherwise)."""
        return self.precisions.get(algorithm, FP32)

    @property
    def new_trials(self) -> int:
        return self.trials - self.resumed

    @property
    def speedup(self) -> float | None:
        """Default time over winner time (None when either is unknown)."""
        if self.winner is None or self.default is None or not self.default.ok:
            return None
        return self.default.time / self.winner.time

    def gflops(self, result: Result | None) -> float | None:
        """GFLOP/s of ``result`` on this problem (None when it has no time)."""
        if result is None or not result.ok:
            return None
        return self.problem.flops / result.time * 1e-9

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable summary (raw samples of the winner and defaults included)."""
        def one(r: Result | None) -> dict[str, Any] | None:
            if r is None:
                return None
            return {"algorithm": r.algorithm, "version": self.versions.get(r.algorithm),
                    "precision": self.precision_of(r.algorithm), "config": dict(r.config),
                    "status": r.status.value,
                    "time_s": r.time if r.ok else None, "gflops": self.gflops(r), "samples": list(r.times),
                    "message": r.message}
        return {
            "problem": self.problem.key, "device": self.device, "precision": self.precision,
            "winner": one(self.winner),
            "default": one(self.default), "speedup": self.speedup,
            "per_algorithm": {k: one(v) for k, v in self.per_algorithm.items()},
            "defaults": {k: one(v) for k, v in self.defaults.items()},
            "trials": self.trials, "resumed": self.resumed, "new_trials": self.new_trials,
            "invalid_skipped": self.invalid, "trials_per_algorithm": self.trials_per_algorithm,
            "statuses": self.statuses, "study": self.study_name, "storage": self.storage_url,
            "strategy": self.strategy, "space_size": self.space_size, "stop_reason": self.stop_reason,
            "elapsed_s": self.elapsed, "tried": [one(r) for r in self.tried], "hints": self.hints,
            "hint_won": self.hint_won}


def study_device_key(device: Device) -> str:
    """The device part of a study name: the fingerprint key with the global memory size left out.

    Why: PoCL reports the *currently available* host memory as the CPU device's global memory, so that
    one field changes from process to process; a study keyed on it could never be resumed.
    """
    return dataclasses.replace(device.fingerprint, global_mem_size=0).key


def space_digest(space: SearchSpace) -> str:
    """A short hash of every algorithm's parameter names and value lists.

    Why: Optuna requires a parameter to keep its choices within a study; a family that changes its value
    lists without bumping its version (it happens during development) must get a new study rather than
    a crash in ``suggest_categorical``.
    """
    lists = [[name, [[p, list(v)] for p, v in s.params.items()]] for name, s in space.spaces.items()]
    return hashlib.sha256(json.dumps(lists).encode()).hexdigest()[:8]


def study_name(device: Device, problem: Problem, algorithms: Sequence[Algorithm], strategy: str,
               digest: str = "") -> str:
    """The Optuna study of (device, problem, algorithm versions [and space digest], strategy)."""
    versions = "+".join(f"{a.name}@{a.version}" for a in algorithms) + (f"#{digest}" if digest else "")
    return f"tunecl:{study_device_key(device)}:{problem.key}:{versions}:{strategy}"


JOURNAL_SCHEME = "journal://"  # journal:///abs/path/studies.log: Optuna's journal file storage
SCHEMA_ATTEMPTS = 3  # tries to open an RDB storage whose tables another worker may be creating


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The Optuna storage at ``url``: the one place a ``--storage``/``TUNECL_STORAGE`` value is opened.

    ``journal:///abs/path/studies.log`` is Optuna's journal file storage (an append-only log with a
    file lock: several processes on one machine, or on a shared file system with working locks, can
    share it without a server); any other ``scheme://`` URL is an RDB storage (SQLite, PostgreSQL,
    MySQL — a server URL is the way to share studies between machines); a plain path means SQLite.
    The folder of a file is created.
    """
    url = config.normalize_db_url(url)
    if url.startswith(JOURNAL_SCHEME):
        from optuna.storages.journal import JournalFileBackend

        path = Path(url[len(JOURNAL_SCHEME):]).expanduser()
        if not path.name:
            raise ValueError(f"journal storage URL without a file: {url!r} (use journal:///abs/path.log)")
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:///"):
        path_text = url[len("sqlite:///"):]
        if path_text and path_text != ":memory:":
            Path(path_text).parent.mkdir(parents=True, exist_ok=True)
        # wait for a concurrent writer (another worker, the dashboard) instead of failing at once
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 30}}
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(SCHEMA_ATTEMPTS - 1):
        try:
            return optuna.storages.RDBStorage(url, **kwargs)
        except (IntegrityError, ProgrammingError):
            # Workers started together on an empty PostgreSQL database all create Optuna's tables;
            # the losers' CREATE fails on what the winner just created (seen in the shared-storage
            # test). The next attempt finds the tables there.
            time.sleep(0.5 * (attempt + 1))
    return optuna.storages.RDBStorage(url, **kwargs)


def _hide_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ValueError, TypeError):
        return url


def _lacking_capabilities(known: list[Algorithm], problem: Problem, device: Any) -> list[str]:
    """"<algorithm> needs the <capability> capability, which this device lacks" for each known family
    that computes problems of this dtype only where a runtime probe granted an instruction (the
    tensor-core families' ``variant``): why, say, a float16 problem has no algorithm on a CPU device."""
    have = frozenset(getattr(device, "capabilities", ()) or ())
    lines = []
    for algorithm in known:
        variant = getattr(algorithm, "variant", None)
        capability = getattr(variant, "capability", None)
        computes = getattr(variant, "dtype", None) == getattr(problem, "dtype", None)
        if capability and computes and capability not in have:
            lines.append(f"{algorithm.name} needs the {capability} capability, which this device lacks")
    return lines


class Tuner:
    """Tunes problems on one device.

    Args:
        device: the device to tune on.
        storage_url: Optuna storage URL (or path; see :func:`open_storage`); default
            ``config.get().storage_url``.
        sampler: ``tpe`` (default), ``random`` or ``grid``; small valid spaces are searched
            exhaustively whatever the sampler (see :meth:`choose_strategy`).
        seed: seeds the inputs of verification and the sampler.
        policy: how to time each candidate.
        patience: evaluations without a 1% improvement before a sampled search stops (None: never).
        top_k: how many of the fastest configs are re-measured before the winner is declared.
        exhaustive_limit: valid spaces up to this size are searched exhaustively.
        algorithms: the algorithms to consider (default: those registered for the problem's kind).
        jobs: compile up to this many candidates at once in worker processes, measuring them one by
            one here (1: compile and measure each candidate in turn, in this process).
        precision: the precision the results must satisfy: ``"fp32"`` (strict, the default) or
            ``"tf32"`` (TF32 algorithms too); algorithms of lower precision are never considered.
        seeds: ``(algorithm, parameter overrides)`` pairs (see :func:`~tunecl.search.space.parse_named`):
            each algorithm's default with those parameters changed is evaluated right after the defaults
            (``tunecl tune --try``); counted among the trials.
        hints: ``(algorithm, config)`` pairs to start from, after the seeds (the winners of similar
            problems, :mod:`tunecl.db.similar`): those of algorithms not searched here are dropped, a
            config outside its algorithm's space is replaced by the nearest valid one; counted among the
            trials.
    """

    def __init__(self, device: Device, storage_url: str | None = None, sampler: str = "tpe", *,
                 seed: int = 0, policy: TimingPolicy | None = None, patience: int | None = DEFAULT_PATIENCE,
                 top_k: int = 3, exhaustive_limit: int = EXHAUSTIVE_LIMIT,
                 algorithms: Sequence[Algorithm] | None = None, jobs: int = 1, precision: str = FP32,
                 seeds: Sequence[tuple[str, Mapping[str, int]]] = (),
                 hints: Sequence[tuple[str, Mapping[str, int]]] = ()):
        if sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}; use one of {', '.join(SAMPLERS)}")
        self.precision = precision
        self.accepted = at_least(precision)  # raises ValueError for an unknown precision
        self.device = device
        self.storage_url = config.normalize_db_url(storage_url or config.get().storage_url)
        self.sampler = sampler
        self.seed = seed
        self.policy = policy or TimingPolicy()
        self.patience = patience
        self.top_k = top_k
        self.exhaustive_limit = exhaustive_limit
        self.algorithms = list(algorithms) if algorithms is not None else None
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.jobs = jobs
        self.seeds = [(name, dict(overrides)) for name, overrides in seeds]
        self.hints = [(name, dict(config)) for name, config in hints]
        self.worker_builds = 0  # builds done in worker processes by the last tune() (jobs > 1)
        self.worker_pids: set[int] = set()  # ... and the processes they ran in
        self._storage: optuna.storages.BaseStorage | None = None

    @property
    def storage(self) -> optuna.storages.BaseStorage:
        if self._storage is None:
            self._storage = open_storage(self.storage_url)
        return self._storage

    def applicable(self, problem: Problem) -> list[Algorithm]:
        """The algorithms that apply to ``problem`` on this device and whose precision satisfies this
        tuner's, in preference order.

        Raises:
            NoAlgorithmError: none is registered for the problem's kind, or none applies.
        """
        known = self.algorithms if self.algorithms is not None else registered_algorithms(problem.kind)
        kind = KIND_NAMES.get(problem.kind, problem.kind)
        if not known:
            raise NoAlgorithmError(f"no {kind} algorithms are available yet")
        usable = [a for a in known if a.kind == problem.kind and algorithm_precision(a) in self.accepted
                  and a.applies(problem, self.device)]
        if not usable:
            strict = "" if self.precision == FP32 else f" at {self.precision} precision"
            lacking = "".join(f"; {need}" for need in _lacking_capabilities(known, problem, self.device))
            raise NoAlgorithmError(f"no {kind} algorithm applies to {problem.key} on {self.device.name}"
                                   f"{strict} (known: {', '.join(a.name for a in known)}){lacking}")
        return usable

    def choose_strategy(self, space_size: int, trials: int | None) -> str:
        """``exhaustive`` when the valid space has at most ``exhaustive_limit`` configs and the trial
        budget (if any) covers it — sampling would only revisit configs — else the sampler asked for."""
        if space_size <= self.exhaustive_limit and (trials is None or space_size <= trials):
            return "exhaustive"
        return self.sampler

    def tune(self, problem: Problem, trials: int | None = None, time_limit: float | None = None,
             progress: ProgressCallback | None = None) -> TuneOutcome:
        """Search the algorithms and parameters of ``problem`` and return the outcome.

        Args:
            problem: what to tune.
            trials: evaluations in the study (resumed ones count); default: the whole space when it is
                searched exhaustively, else 100 unless a time limit is given.
            time_limit: seconds of searching in this call.
            progress: called after every evaluation.

        Raises:
            NoAlgorithmError: nothing to tune.
        """
        started = time.monotonic()
        chosen = self.applicable(problem)
        by_name = {a.name: a for a in chosen}
        spaces = {a.name: a.space(problem, self.device) for a in chosen}
        defaults = {a.name: dict(a.default(problem, self.device)) for a in chosen}
        space = SearchSpace(spaces, defaults, self._resolve_seeds(problem, spaces, defaults))
        space.hints = self._resolve_hints(space)
        counted = space.count(self.exhaustive_limit)  # stops counting past the limit: spaces can be huge
        size = counted if counted <= self.exhaustive_limit else None
        strategy_name = self.choose_strategy(counted, trials)
        if trials is None and time_limit is None and strategy_name != "exhaustive":
            trials = DEFAULT_TRIALS
        name = study_name(self.device, problem, chosen, strategy_name, space_digest(space))
        self._describe_study(name, problem, chosen)
        harness: Harness = harness_for(problem, self.device, self.seed)

        def run_one(algorithm: str, config: Config) -> Result:
            return evaluate(by_name[algorithm], problem, self.device, config, harness=harness,
                            space=spaces[algorithm], policy=self.policy)

        budget = Budget(trials=trials, time_limit=time_limit,
                        patience=None if strategy_name == "exhaustive" else self.patience, top_k=self.top_k)
        strategy = STRATEGIES[strategy_name](self.storage, name, seed=self.seed, progress=progress,
                                             jobs=self.jobs)
        self.worker_builds = 0
        with self.device.profiling():  # one queue switch for the search, not one per candidate
            if self.jobs == 1:
                log = strategy.search(space, run_one, budget)
            else:
                builder = Prebuilder(self.device, problem, by_name, run_one, self.jobs)
                try:
                    log = strategy.search(space, run_one, budget, prepare=builder.prepare)
                finally:
                    builder.close()
                    self.worker_builds, self.worker_pids = builder.built, set(builder.worker_pids)
        return self._outcome(problem, chosen, space, log, strategy_name, size, time.monotonic() - started)

    def _resolve_seeds(self, problem: Problem, spaces: Mapping[str, Space],
                       defaults: Mapping[str, Config]) -> tuple[tuple[str, Config], ...]:
        """Each seed as a full valid config.

        Raises:
            ValueError: an algorithm that is not searched for ``problem`` here, an unknown parameter, or
                a config outside the algorithm's space (the violated constraints named).
        """
        resolved = []
        for name, overrides in self.seeds:
            if name not in spaces:
                raise ValueError(f"{name} is not searched for {problem.key} on this device at "
                                 f"{self.precision}; these are: {', '.join(spaces)}")
            unknown = sorted(set(overrides) - set(defaults[name]))
            if unknown:
                raise ValueError(f"{name} has no parameter {', '.join(unknown)}; its parameters: "
                                 f"{', '.join(defaults[name])}")
            config = {**defaults[name], **overrides}
            broken = spaces[name].violations(config)
            if broken:
                raise ValueError(f"{name} with {overrides} is not a valid config for {problem.key}: "
                                 f"{', '.join(broken)}")
            resolved.append((name, config))
        return tuple(resolved)

    def _resolve_hints(self, space: SearchSpace) -> tuple[tuple[str, Config], ...]:
        """Each hint of an algorithm searched here as a valid config (the nearest valid one where a
        stored config does not fit: another problem's sizes, a space changed since), each once, leaving
        out the defaults and seeds (evaluated anyway)."""
        resolved: list[tuple[str, Config]] = [*space.defaults.items(), *space.seeds]
        planned = len(resolved)
        for name, stored in self.hints:
            if name not in space.spaces:
                continue
            config: Config | None = space.spaces[name].complete(stored)
            if set(config) != set(space.spaces[name].params):
                continue
            if not space.is_valid(name, config):
                config = space.nearest(name, config)
            if config is not None and (name, config) not in resolved:
                resolved.append((name, config))
        return tuple(resolved[planned:])

    def _describe_study(self, name: str, problem: Problem, chosen: Sequence[Algorithm]) -> None:
        """Create the study if needed and label it for humans (optuna-dashboard shows user attrs)."""
        with quiet_optuna():
            study = optuna.create_study(storage=self.storage, study_name=name, direction="minimize",
                                        load_if_exists=True)
        if "problem" not in study.user_attrs:
            for key, value in (("problem", problem.key), ("device", self.device.fingerprint.label),
                               ("device_key", self.device.fingerprint.key),
                               ("versions", {a.name: a.version for a in chosen}),
                               ("tunecl", __version__), ("pid", os.getpid())):
                study.set_user_attr(key, value)

    def _outcome(self, problem: Problem, chosen: Sequence[Algorithm], space: SearchSpace, log: SearchLog,
                 strategy: str, size: int | None, elapsed: float) -> TuneOutcome:
        first = chosen[0].name
        return TuneOutcome(
            problem=problem, device=self.device.fingerprint.label, winner=log.winner,
            default=log.defaults.get(first), defaults=dict(log.defaults),
            per_algorithm=log.best_per_algorithm(), versions={a.name: a.version for a in chosen},
            trials=len(log.results), resumed=log.resumed, invalid=log.invalid,
            trials_per_algorithm=dict(Counter(r.algorithm for r in log.results)),
            statuses=dict(Counter(r.status.value for r in log.results)),
            study_name=log.study_name, storage_url=_hide_password(self.storage_url), strategy=strategy,
            space_size=size, stop_reason=log.stop_reason, elapsed=elapsed, results=tuple(log.results),
            final=tuple(log.final), precision=self.precision,
            precisions={a.name: algorithm_precision(a) for a in chosen}, tried=self._tried(space, log),
            hints=len(space.hints), hint_won=log.winner is not None and any(
                (log.winner.algorithm, dict(log.winner.config)) == hint for hint in space.hints))

    @staticmethod
    def _tried(space: SearchSpace, log: SearchLog) -> tuple[Result, ...]:
        """The result of each seed, the final round's where it re-measured the config."""
        latest = {config_key(r.algorithm, r.config): r for r in (*log.results, *log.final)}
        return tuple(latest[key] for key in (config_key(a, c) for a, c in space.seeds) if key in latest)


__all__ = ["SAMPLERS", "NoAlgorithmError", "Status", "TuneOutcome", "Tuner", "open_storage", "study_name"]
