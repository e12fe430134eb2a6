"""Orchestration: tune a problem with the search layer and keep the outcome in the tuning DB.

The one place where ``tunecl.search`` and ``tunecl.db`` meet. The search's working memory (every
trial) stays in Optuna storage; the DB receives the curated outcome: for each algorithm its best
verified result (the overall winner is simply the fastest of them, which is what a lookup serves),
with the time of that algorithm's default config and the number of trials behind it.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from tunecl import config
from tunecl.db.similar import similar_configs
from tunecl.fingerprint import Fingerprint
from tunecl.kernels import algorithms
from tunecl.kernels.base import Algorithm
from tunecl.precision import FP32, algorithm_precision, at_least
from tunecl.problems import Problem
from tunecl.runtime import Device
from tunecl.search.claims import Claims, claim_key
from tunecl.search.result import Result, Status
from tunecl.search.strategies import ProgressCallback
from tunecl.search.tuner import TuneOutcome, Tuner, open_storage, study_device_key


class ResultSink(Protocol):
    """What :func:`record_outcome` needs of a tuning DB (``tunecl.db.TuningDB`` provides it)."""

    def record(self, fingerprint: Fingerprint, problem: Problem | str, algorithm: str, algorithm_version: int,
               params: Mapping[str, Any], time_s: float | None, default_time_s: float | None = None,
               trials: int = 0, status: str = "ok", precision: str = "fp32",
               origin: str | None = None) -> None: ...


MIN_SHARE_S = 2.0  # seconds of searching a problem gets at least when a total budget is shared (tune_workload)
WARM_START = 0  # configs of similar problems a search starts from (tunecl tune --warm-start): off until a
# measurement shows it pays (benchmarks/warm_start.py on PoCL: cold/warm tuned time 0.90-0.96 with 8 trials)


def origin_here() -> str:
    return f"tuned on {socket.gethostname()}"


def tune_problem(problem: Problem, device: Device, db: ResultSink | None = None, trials: int | None = None,
                 time_limit: float | None = None, sampler: str = "tpe", storage_url: str | None = None,
                 progress: ProgressCallback | None = None, warm_start: int = WARM_START,
                 **tuner_options: Any) -> TuneOutcome:
    """Tune ``problem`` on ``device`` and record the outcome in ``db``.

    Args:
        problem: what to tune.
        device: where.
        db: the tuning DB to record into (None: tune only).
        trials: evaluations in the study (see :meth:`Tuner.tune`).
        time_limit: seconds of searching.
        sampler: ``tpe``, ``random`` or ``grid``.
        storage_url: Optuna storage (default: ``config.get().storage_url``).
        progress: called after every evaluation.
        warm_start: start from up to this many configs: the winners of the problems most similar to
            ``problem`` stored for this device model in ``db`` and the shipped results (see
            :mod:`tunecl.db.similar`), evaluated right after the defaults; 0: none.
        **tuner_options: passed to :class:`Tuner` (``seed``, ``policy``, ``patience``, ``top_k``,
            ``algorithms``, ``jobs``, ``precision`` ...). With ``jobs`` > 1 candidates compile in worker
            processes started by ``spawn``, which import the calling script again: a script that calls
            this must do so under ``if __name__ == "__main__":`` (else each worker runs the script too).

    Returns:
        The tuner's outcome.

    Raises:
        NoAlgorithmError: nothing to tune for this problem.
        DatabaseError: recording failed (the study keeps every trial; re-running records without
            measuring again).
    """
    tuner = Tuner(device, storage_url=storage_url, sampler=sampler, **tuner_options)
    if db is not None and warm_start > 0 and hasattr(db, "results"):   # (a bare result sink has none)
        tuner.applicable(problem)   # nothing to tune raises before the DB is read
        tuner.hints = similar_configs(db, device.fingerprint, problem, warm_start)
    outcome = tuner.tune(problem, trials=trials, time_limit=time_limit, progress=progress)
    if db is not None:
        record_outcome(db, device.fingerprint, outcome)
    return outcome


def record_outcome(db: ResultSink, fingerprint: Fingerprint, outcome: TuneOutcome,
                   origin: str | None = None) -> list[str]:
    """Record each algorithm's best verified result of ``outcome``; return the algorithms recorded.

    An algorithm without any verified result is recorded as ``failed:wrong_result`` only when its own
    default config failed verification: that is worth keeping (the untuned fallback of that algorithm
    is wrong on this device and problem — a driver bug to report), and the DB never serves failed rows.
    Compile errors, timeouts and invalid configs are not recorded: they are properties of configs, not
    of the problem, and the study keeps them. Each result is recorded under the precision it was
    verified at, its algorithm's (``outcome.precision_of``): a TF32 study's fp32 results stay "fp32".
    """
    origin = origin or origin_here()
    recorded = []
    for algorithm, version in outcome.versions.items():
        best = outcome.per_algorithm.get(algorithm)
        default = outcome.defaults.get(algorithm)
        trials = outcome.trials_per_algorithm.get(algorithm, 0)
        precision = outcome.precision_of(algorithm)
        if best is not None and best.ok:
            db.record(fingerprint, outcome.problem, algorithm, version, dict(best.config), best.time,
                      default_time_s=_time_or_none(default), trials=trials, status="ok", precision=precision,
                      origin=origin)
            recorded.append(algorithm)
        elif default is not None and default.status is Status.WRONG_RESULT:
            db.record(fingerprint, outcome.problem, algorithm, version, dict(default.config), None,
                      trials=trials, status=f"failed:{Status.WRONG_RESULT.value}", precision=precision,
                      origin=origin)
            recorded.append(algorithm)
    return recorded


def _time_or_none(result: Result | None) -> float | None:
    return result.time if result is not None and result.ok else None


@dataclasses.dataclass
class NetRow:
    """One problem of a net's workload after :func:`tune_workload`.

    ``default_s`` and ``tuned_s`` are per call, ``seconds`` the wall time its tuning took (search,
    verification, re-measurement and storing; about the time limit plus a few seconds); ``status`` is ``tuned``, ``skipped`` (already in the DB
    at the current algorithm versions), ``shipped`` (likewise in the shipped results, for this exact
    device and driver), ``failed`` (no verified candidate), ``not applicable`` (a search restricted to
    some algorithms, none of which applies) or ``not run`` (the total time limit or an interrupt came
    first). A ``failed`` row says why in ``reason``: how many candidates ended in each status, and what
    went wrong with the first default that failed.
    """

    problem: Problem
    count: int
    status: str
    algorithm: str | None = None
    default_s: float | None = None
    tuned_s: float | None = None
    seconds: float | None = None   # wall time spent tuning it (None: not tuned in this run)
    reason: str | None = None      # why a failed row failed

    @property
    def speedup(self) -> float | None:
        return self.default_s / self.tuned_s if self.default_s and self.tuned_s else None


def _tuned_before(db: Any, device: Device, problem: Problem, precision: str,
                  only: Sequence[Algorithm] | None = None) -> Any:
    """The fastest stored result when every precision among the applicable algorithms has one at the
    current versions (what makes a problem "already tuned"), else None. With ``only`` (a search restricted
    to those algorithms), when each of them that applies has one. Results count from the user DB and from
    the shipped results, for this exact device and driver."""
    versions = algorithm_versions(problem, device, precision)
    groups: dict[str, tuple[str, dict[str, int]]] = {}   # group -> (its precision, its algorithm versions)
    for algorithm in (only if only is not None else algorithms(problem.kind)):
        if algorithm.name in versions:
            kind = algorithm_precision(algorithm)
            _, group = groups.setdefault(algorithm.name if only is not None else kind, (kind, {}))
            group[algorithm.name] = versions[algorithm.name]
    hits = [db.best_or_shipped(device.fingerprint, problem, versions=names, precision=kind)
            for kind, names in groups.values()]
    if not hits or any(hit is None for hit in hits):
        return None
    return min(hits, key=lambda hit: hit.time_s)


def _stored_baseline(db: Any, device: Device, problem: Problem, precision: str,
                     only: Sequence[Algorithm] | None = None) -> float | None:
    """The stored time of a problem's untuned baseline, what a tuned row's ``default_s`` is
    (``TuneOutcome.default``): the default config of the first applicable algorithm, as recorded with
    that algorithm's result. None when that algorithm has no stored result (the winner's own default
    would be another algorithm's, often its tuned config itself: a 1.00x that says nothing)."""
    versions = algorithm_versions(problem, device, precision)
    first = next((a for a in (only if only is not None else algorithms(problem.kind)) if a.name in versions),
                 None)
    if first is None:
        return None
    hit = db.best_or_shipped(device.fingerprint, problem, versions={first.name: versions[first.name]},
                             precision=algorithm_precision(first))
    return None if hit is None else hit.default_time_s


def algorithm_versions(problem: Problem, device: Device, precision: str = FP32) -> dict[str, int]:
    """Name → version of every algorithm that applies to ``problem`` on ``device`` and whose results
    satisfy ``precision``."""
    accepted = at_least(precision)
    return {a.name: a.version for a in algorithms(problem.kind)
            if algorithm_precision(a) in accepted and a.applies(problem, device)}


def failure_counts(statuses: Mapping[str, int]) -> str:
    """How many candidates ended in each status other than ok, e.g. ``2 compile error, 6 wrong result``
    ("" when all passed)."""
    return ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(statuses.items()) if k != "ok")


def failure_reason(outcome: Any) -> str:
    """Why no candidate of a tuning outcome passed, in one line: the count of each status, then the
    first failed default's status and message (the configs every family starts from)."""
    counts = failure_counts(outcome.statuses)
    failed = next((d for d in outcome.defaults.values() if d is not None and not d.ok), None)
    detail = (f"{failed.algorithm} default: {failed.status.value.replace('_', ' ')} {failed.message}".rstrip()
              if failed is not None else "")
    return "; ".join(part for part in (counts or "no candidate ran", detail) if part)


def tune_workload(workload: Mapping[Problem, int], device: Device, db: Any, *, trials: int | None = None,
                  time_limit: float | None = None, total_time_limit: float | None = None,
                  retune: bool = False, on_start: Callable[[int, Problem], None] | None = None,
                  on_done: Callable[[int, NetRow], None] | None = None, precision: str = FP32,
                  claims: Claims | None = None, **tune_options: Any) -> list[NetRow]:
    """Tune every problem of a workload (problem → occurrences), largest total FLOPs first.

    ``total_time_limit``: no problem starts after that many seconds. Given without ``time_limit`` and
    ``trials``, it is also shared: each problem to tune gets, as its time limit, its share of the FLOPs
    (count included) of the problems still to tune times what is left of the total, less what each of
    those is expected to run past its limit (its defaults and the final re-measurement come on top: the
    mean so far, :data:`MIN_SHARE_S` before the first); at least :data:`MIN_SHARE_S`. Recomputed as each
    problem starts, so the run ends near the total with every problem's defaults measured where it allows.

    Problems the DB or the shipped results already hold for this exact device at the current algorithm
    versions are skipped unless ``retune``; at ``precision="tf32"`` that takes a result of each precision whose algorithms
    apply (fp32 results alone do not mean the TF32 algorithms were tuned). A search restricted to some
    algorithms (``algorithms=`` among ``tune_options``) skips a problem when each of them that applies has
    a stored result, and lists a problem none of them applies to as ``not applicable``. Every finished problem is
    recorded before the next starts, so Ctrl-C (which propagates after the rows so far are reported
    through ``on_done``) loses at most the problem in progress, whose finished trials stay in the
    Optuna study and are resumed by the next run.

    Several processes given the same Optuna storage and DB split the workload: each claims a problem
    before tuning it (see :mod:`tunecl.search.claims`) and puts off problems another live worker has
    claimed; at the end it returns to those, skipping the ones now stored (or finished by the other
    worker) and tuning the rest along with whoever holds them, in the same study, where trials are
    shared. ``claims`` defaults to the claims in ``storage_url``'s storage. Rows come back in
    workload order.
    """
    order = sorted(workload.items(), key=lambda item: -item[0].flops * item[1])
    only = tune_options.get("algorithms")
    if claims is None:
        claims = Claims(open_storage(tune_options.get("storage_url") or config.get().storage_url),
                        study_device_key(device))
    rows: dict[int, NetRow] = {}
    started = time.monotonic()

    def none_applies(problem: Problem) -> bool:   # of the algorithms a restricted search asked for
        return only is not None and not {a.name for a in only} & algorithm_versions(problem, device, precision).keys()

    # a shared total budget: the FLOPs (count included) of each problem still to tune, by index
    shares: dict[int, float] | None = None
    if total_time_limit is not None and time_limit is None and trials is None:
        shares = {index: max(1.0, float(problem.flops * count)) for index, (problem, count) in enumerate(order)
                  if not none_applies(problem)
                  and (retune or _tuned_before(db, device, problem, precision, only) is None)}

    overruns: list[float] = []   # seconds each tuned problem took past its limit, under a shared budget

    def limit_for(index: int) -> float | None:
        """The time limit of problem ``index`` (see the docstring)."""
        if shares is None:
            return time_limit
        # what the searches may share: the time left less each pending problem's expected overrun
        overrun = sum(overruns) / len(overruns) if overruns else MIN_SHARE_S
        left = total_time_limit - (time.monotonic() - started) - overrun * len(shares)
        weight = shares.get(index, 1.0)
        return max(MIN_SHARE_S, left * weight / (sum(shares.values()) or weight))

    def finish(index: int, row: NetRow) -> None:
        rows[index] = row
        if shares is not None:
            shares.pop(index, None)
        if on_done is not None:
            on_done(index, row)

    def tune_one(index: int, problem: Problem, count: int, key: str) -> NetRow:
        if on_start is not None:
            on_start(index, problem)
        claims.claim(key)  # lost to a simultaneous claim: tune along, the study is shared
        options = dict(tune_options)
        progress = options.get("progress")

        def beat(update: Any) -> None:
            claims.beat(key)
            if progress is not None:
                progress(update)

        options["progress"] = beat
        began, limit = time.monotonic(), limit_for(index)
        outcome = tune_problem(problem, device, db, trials=trials, time_limit=limit, precision=precision, **options)
        if shares is not None:
            overruns.append(max(0.0, time.monotonic() - began - limit))
        claims.release(key)
        winner, default = outcome.winner, outcome.default
        return NetRow(problem, count, "tuned" if winner else "failed", winner.algorithm if winner else None,
                      default.time if default is not None and default.ok else None,
                      winner.time if winner else None, time.monotonic() - began,
                      None if winner else failure_reason(outcome))

    def skipped(problem: Problem, count: int, hit: Any) -> NetRow:
        return NetRow(problem, count, "shipped" if hit.source == "shipped" else "skipped", hit.algorithm,
                      _stored_baseline(db, device, problem, precision, only), hit.time_s)

    # a restricted search is other work than a full one (claims tell workers apart by key)
    restricted = "" if only is None else "|" + ",".join(sorted(a.name for a in only))
    put_off: list[tuple[int, Problem, int, str]] = []
    for index, (problem, count) in enumerate(order):
        key = claim_key(problem.key, precision) + restricted
        if none_applies(problem):
            finish(index, NetRow(problem, count, "not applicable"))
            continue
        hit = None if retune else _tuned_before(db, device, problem, precision, only)
        if hit is not None:
            finish(index, skipped(problem, count, hit))
        elif total_time_limit is not None and time.monotonic() - started > total_time_limit:
            finish(index, NetRow(problem, count, "not run"))
        elif claims.holder(key) is not None:
            put_off.append((index, problem, count, key))  # another worker tunes it now
        else:
            finish(index, tune_one(index, problem, count, key))
    for index, problem, count, key in put_off:
        # the other worker may have finished it meanwhile (with --retune the DB held it before, so
        # only its finished claim tells)
        hit = (_tuned_before(db, device, problem, precision, only)
               if not retune or claims.done_elsewhere(key) else None)
        if hit is not None:
            finish(index, skipped(problem, count, hit))
        elif total_time_limit is not None and time.monotonic() - started > total_time_limit:
            finish(index, NetRow(problem, count, "not run"))
        else:
            finish(index, tune_one(index, problem, count, key))
    return [rows[index] for index in sorted(rows)]
