"""The study driver behind every strategy: ask, check, evaluate, tell, resume, re-measure.

See :mod:`tunecl.search.strategies` for the trial layout, how invalid proposals are handled and how a
study resumes; this module is the loop that does it.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tunecl.search.budget import Budget, Evaluator, Key, Progress, SearchLog
from tunecl.search.result import Config, Result, Status, config_key
from tunecl.search.space import SearchSpace

# Starts the work of evaluating a config (e.g. compiling it in another process) and returns what
# completes the evaluation; see :mod:`tunecl.search.prebuild`.
Preparer = Callable[[str, Config], Callable[[], Result]]

if TYPE_CHECKING:
    from tunecl.search.strategies import OptunaStrategy

ATTR = "tunecl"  # user attribute of a trial: {"phase": ..., "result": Result.to_dict()}
WORKER_ATTR = "tunecl_worker"  # "host:pid" of the process that asked the trial
ROUND_ATTR = "tunecl_final_round"  # study user attribute: the last re-measurement round
GRID_ENUMERATION_LIMIT = 100_000  # larger valid spaces are sampled by the grid strategy, not listed


def _process_gone(worker: str) -> bool:
    """Whether ``host:pid`` names a process of this host that no longer exists."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, as another user's process
        return False
    return False


class StudyDriver:
    """One call of :meth:`OptunaStrategy.search`: its study, history and counters."""

    def __init__(self, strategy: OptunaStrategy, space: SearchSpace, evaluate: Evaluator, budget: Budget,
                 prepare: Preparer | None = None):
        self.strategy, self.space, self.evaluate, self.budget = strategy, space, evaluate, budget
        self.prepare = prepare
        self.start = strategy.clock()
        self.study = optuna.create_study(storage=strategy.storage, study_name=strategy.study_name,
                                         direction="minimize", load_if_exists=True,
                                         sampler=optuna.samplers.RandomSampler(seed=strategy.seed))
        # The exact size matters only to notice that everything was evaluated, which a budget of N
        # trials can only do when the space has at most N configs: count no further than that.
        limit = budget.trials if budget.trials is not None else GRID_ENUMERATION_LIMIT
        counted = space.count(limit)
        self.size: int | None = counted if counted <= limit else None
        self.results: list[Result] = []
        self.seen: dict[Key, Result] = {}
        self.pending: set[Key] = set()  # configs of WAITING trials
        self.inflight: set[Key] = set()  # configs asked in the current batch, not yet told (jobs > 1)
        self.repairs: collections.deque[tuple[str, Config]] = collections.deque()
        self.invalid = self.duplicates = 0
        trials = self._load()
        self.resumed = len(self.results)
        self.study.sampler = strategy.make_sampler(strategy.seed + trials)
        fixed = strategy.order(space)
        self.order: Iterator[tuple[str, Config]] | None = iter(fixed) if fixed is not None else None
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    # -- history --------------------------------------------------------------------------------------
    def _load(self) -> int:
        """Read the finished trials back; return how many trials the study has."""
        trials = self.study.get_trials(deepcopy=False)
        for trial in sorted(trials, key=lambda t: t.number):
            info = trial.user_attrs.get(ATTR) or {}
            if trial.state == TrialState.WAITING:
                decoded = self._decode_params(trial.system_attrs.get("fixed_params", {}))
                if decoded:
                    self.pending.add(config_key(*decoded))
            elif trial.state == TrialState.RUNNING:
                self._fail_if_orphaned(trial)
            elif info.get("phase") == "search" and "result" in info:
                try:
                    result = Result.from_dict(info["result"])
                except (KeyError, ValueError, TypeError, AttributeError):
                    continue  # a trial written by a foreign or newer tool: ignore it, don't crash
                self.results.append(result)
                self.seen.setdefault(result.key, result)
        return len(trials)

    def _fail_if_orphaned(self, trial: FrozenTrial) -> None:
        if _process_gone(str(trial.user_attrs.get(WORKER_ATTR, ""))):
            storage = self.study._storage
            storage.set_trial_user_attr(trial._trial_id, ATTR, {"phase": "interrupted"})
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)

    def _decode_params(self, params: dict[str, Any]) -> tuple[str, Config] | None:
        name = params.get("algorithm")
        if name not in self.space.spaces:
            return None
        try:
            return name, {p: int(params[f"{name}.{p}"]) for p in self.space.spaces[name].params}
        except (KeyError, TypeError, ValueError):
            return None

    # -- proposals ------------------------------------------------------------------------------------
    def _params(self, algorithm: str, config: Config) -> dict[str, Any]:
        return {"algorithm": algorithm, **{f"{algorithm}.{p}": int(v) for p, v in config.items()}}

    def _enqueue(self, algorithm: str, config: Config) -> bool:
        key = config_key(algorithm, config)
        if (key in self.seen or key in self.pending or key in self.inflight
                or not self.space.is_valid(algorithm, config)):
            return False
        self.study.enqueue_trial(self._params(algorithm, config))
        self.pending.add(key)
        return True

    def _waiting(self) -> bool:
        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _propose(self) -> bool:
        """Enqueue the next fixed proposal when nothing waits; False when a fixed order is used up."""
        if self._waiting():
            return True
        while self.repairs:
            if self._enqueue(*self.repairs.popleft()):
                return True
        if self.order is not None:
            for algorithm, config in self.order:
                if self._enqueue(algorithm, config):
                    return True
            return False
        return True

    def _suggest(self, trial: Trial) -> tuple[str, Config]:
        algorithm = trial.suggest_categorical("algorithm", self.space.algorithms)
        params = self.space.spaces[algorithm].params
        return algorithm, {p: int(trial.suggest_categorical(f"{algorithm}.{p}", list(values)))
                           for p, values in params.items()}

    def _repair(self, algorithm: str, config: Config) -> None:
        exclude = set(self.seen) | self.pending | self.inflight
        nearest = self.space.nearest(algorithm, config, exclude)
        if nearest is None:  # this algorithm is exhausted: try the others' nearest
            for other in self.space.algorithms:
                default = self.space.defaults[other]
                nearest = self.space.nearest(other, default, exclude)
                if nearest is not None:
                    algorithm = other
                    break
        if nearest is not None:
            self.repairs.append((algorithm, nearest))

    # -- telling --------------------------------------------------------------------------------------
    def _tell(self, trial: Trial, phase: str, result: Result) -> None:
        trial.set_user_attr(ATTR, {"phase": phase, "result": result.to_dict()})
        if result.ok:
            self.study.tell(trial, result.time)
        else:
            self.study.tell(trial, state=TrialState.PRUNED)

    # -- stopping -------------------------------------------------------------------------------------
    def _since_improvement(self) -> int:
        best, since = math.inf, 0
        for result in self.results:
            if result.ok and result.time < best * (1.0 - self.budget.min_improvement):
                best, since = result.time, 0
            else:
                since += 1
                best = min(best, result.time)
        return since

    def _stop_reason(self, skipped: int) -> str | None:
        b = self.budget
        if b.trials is not None and len(self.results) >= b.trials:
            return "trials"
        # Time and patience never stop the search before every algorithm's default was measured:
        # the defaults are the baseline that makes tuned never worse than untuned (a 3 s limit once
        # expired during setup and left a problem with no result at all).
        defaults_done = all(config_key(a, c) in self.seen for a, c in self.space.defaults.items())
        if (b.time_limit is not None and self.strategy.clock() - self.start >= b.time_limit
                and defaults_done):
            return "time_limit"
        if b.patience is not None and self._since_improvement() >= b.patience and defaults_done:
            return "patience"
        if self.size is not None and len(self.seen) >= self.size:
            return "exhausted"
        limit = b.max_skipped if b.max_skipped is not None else 10 * (b.trials or 10) + 100
        if skipped > limit:
            return "skipped"
        return None

    # -- the loop -------------------------------------------------------------------------------------
    def _best(self) -> Result | None:
        ok = [r for r in self.results if r.ok]
        return min(ok, key=lambda r: r.time) if ok else None

    def _report(self, phase: str, done: int, total: int | None, best: Result | None, last: Result) -> None:
        if self.strategy.progress is not None:
            self.strategy.progress(Progress(phase, done, total, best, last,
                                            self.strategy.clock() - self.start))

    def run(self) -> SearchLog:
        for algorithm, config in self.space.defaults.items():
            self._enqueue(algorithm, config)  # defaults first: tuned is never worse than untuned
        if self.strategy.jobs > 1:
            return self._run_batched()
        known = [x for x in (self.budget.trials, self.size) if x is not None]
        total = min(known) if known else None
        stop: str | None = None
        skipped = 0
        while stop is None:
            stop = self._stop_reason(skipped)
            if stop is not None:
                break
            if not self._propose():
                stop = "exhausted"
                break
            trial = self.study.ask()
            told = False
            try:
                trial.set_user_attr(WORKER_ATTR, self.worker)
                algorithm, config = self._suggest(trial)
                key = config_key(algorithm, config)
                self.pending.discard(key)
                if not self.space.is_valid(algorithm, config):
                    broken = ", ".join(self.space.violations(algorithm, config))
                    self._tell(trial, "invalid", Result(algorithm, config, Status.INVALID,
                                                        message=f"violates {broken}"))
                    told = True
                    self.invalid += 1
                    skipped += 1
                    self._repair(algorithm, config)
                    continue
                if key in self.seen:
                    self._tell(trial, "duplicate", self.seen[key])
                    told = True
                    self.duplicates += 1
                    skipped += 1
                    self._repair(algorithm, config)
                    continue
                result = self.evaluate(algorithm, config)
                self._tell(trial, "search", result)
                told = True
            except BaseException:
                # interrupted (Ctrl-C, a callback, a bug outside the candidate): leave no RUNNING trial
                if not told:
                    with contextlib.suppress(Exception):
                        trial.set_user_attr(ATTR, {"phase": "interrupted"})
                        self.study.tell(trial, state=TrialState.FAIL)
                raise
            self.results.append(result)
            self.seen.setdefault(key, result)
            self._report("search", len(self.results), total, self._best(), result)
        final = self._final_round()
        return self._log(final, stop or "trials")

    def _batch_size(self) -> int:
        """How many trials to ask at once: ``jobs``, but no more than the trial budget or space has left."""
        want = self.strategy.jobs
        if self.budget.trials is not None:
            want = min(want, self.budget.trials - len(self.results))
        if self.size is not None:
            want = min(want, self.size - len(self.seen))
        return max(want, 1)

    def _run_batched(self) -> SearchLog:
        """``jobs > 1``: ask up to ``jobs`` trials, start all their builds, then evaluate them serially.

        Same guarantees as :meth:`run`: invalid and repeated proposals are told at once and never
        compiled, each evaluation is told (committed) as soon as it finishes, and an interrupt fails
        only the trials not told yet. A stop condition (time limit, patience) is checked between
        batches, so it can let up to ``jobs - 1`` more evaluations finish.
        """
        known = [x for x in (self.budget.trials, self.size) if x is not None]
        total = min(known) if known else None
        prepare = self.prepare or (lambda a, c: lambda: self.evaluate(a, c))
        stop: str | None = None
        skipped = 0
        while stop is None:
            stop = self._stop_reason(skipped)
            if stop is not None:
                break
            want = self._batch_size()
            batch: list[tuple[Trial, str, Config, Key]] = []
            later: list[tuple[Trial, Key, str, Config]] = []  # repeats of a config in this batch
            try:
                while len(batch) < want and self._stop_reason(skipped) in (None, "time_limit", "patience"):
                    if not self._propose():
                        stop = "exhausted"
                        break
                    trial = self.study.ask()
                    later_or_batch = False
                    try:
                        trial.set_user_attr(WORKER_ATTR, self.worker)
                        algorithm, config = self._suggest(trial)
                        key = config_key(algorithm, config)
                        self.pending.discard(key)
                        if not self.space.is_valid(algorithm, config):
                            broken = ", ".join(self.space.violations(algorithm, config))
                            self._tell(trial, "invalid", Result(algorithm, config, Status.INVALID,
                                                                message=f"violates {broken}"))
                            self.invalid += 1
                            skipped += 1
                            self._repair(algorithm, config)
                            continue
                        if key in self.seen:
                            self._tell(trial, "duplicate", self.seen[key])
                            self.duplicates += 1
                            skipped += 1
                            self._repair(algorithm, config)
                        elif key in self.inflight:
                            later_or_batch = True
                            later.append((trial, key, algorithm, config))
                            break  # the sampler repeats itself: evaluate what we have first
                        else:
                            later_or_batch = True
                            self.inflight.add(key)
                            batch.append((trial, algorithm, config, key))
                    except BaseException:
                        if not later_or_batch:
                            self._fail(trial)
                        raise
                finishers = [prepare(algorithm, config) for _, algorithm, config, _ in batch]
                while batch:
                    trial, algorithm, config, key = batch[0]
                    result = finishers.pop(0)()
                    self._tell(trial, "search", result)
                    batch.pop(0)
                    self.inflight.discard(key)
                    self.results.append(result)
                    self.seen.setdefault(key, result)
                    self._report("search", len(self.results), total, self._best(), result)
                while later:
                    trial, key, algorithm, config = later[0]
                    self._tell(trial, "duplicate", self.seen[key])
                    later.pop(0)
                    self.duplicates += 1
                    skipped += 1
                    self._repair(algorithm, config)
            except BaseException:
                # interrupted: leave no RUNNING trial (finished ones are told already)
                for trial, *_ in batch:
                    self._fail(trial)
                for trial, *_ in later:
                    self._fail(trial)
                self.inflight.clear()
                raise
        final = self._final_round()
        return self._log(final, stop or "trials")

    def _fail(self, trial: Trial) -> None:
        with contextlib.suppress(Exception):
            trial.set_user_attr(ATTR, {"phase": "interrupted"})
            self.study.tell(trial, state=TrialState.FAIL)

    # -- the re-measurement round -------------------------------------------------------------------
    def _final_candidates(self) -> list[Result]:
        ok = sorted((r for r in self.results if r.ok), key=lambda r: r.time)
        if not ok or self.budget.top_k == 0:
            return []
        chosen: dict[Key, Result] = {r.key: r for r in ok[:self.budget.top_k]}
        for algorithm in self.space.algorithms:
            mine = [r for r in ok if r.algorithm == algorithm]
            if mine:
                chosen.setdefault(mine[0].key, mine[0])
            default = self.seen.get(config_key(algorithm, self.space.defaults[algorithm]))
            if default is not None and default.ok:
                chosen.setdefault(default.key, default)
        return sorted(chosen.values(), key=lambda r: r.time)

    def _final_round(self) -> list[Result]:
        """Re-measure the top configs (plus each algorithm's best and default), once per search state.

        The round is stored in the study (a user attribute rewritten after each re-measurement) under
        the number of search results it ranked, so a resumed run that adds no trials reuses it.
        """
        candidates = self._final_candidates()
        round_id = len(self.results)
        stored = self.study.user_attrs.get(ROUND_ATTR) or {}
        done: dict[Key, Result] = {}
        if stored.get("round") == round_id:
            for data in stored.get("results", []):
                with contextlib.suppress(KeyError, ValueError, TypeError, AttributeError):
                    result = Result.from_dict(data)
                    done[result.key] = result
        final: list[Result] = []
        for index, candidate in enumerate(candidates):
            again = done.get(candidate.key)
            if again is None:
                again = self.evaluate(candidate.algorithm, candidate.config)
                self.study.set_user_attr(ROUND_ATTR, {"round": round_id, "results": [
                    r.to_dict() for r in final + [again]]})
            final.append(again)
            ok = [r for r in final if r.ok]
            self._report("remeasure", index + 1, len(candidates),
                         min(ok, key=lambda r: r.time) if ok else None, again)
        return final

    def _log(self, final: list[Result], stop: str) -> SearchLog:
        remeasured = {r.key: r for r in final}
        defaults: dict[str, Result] = {}
        for algorithm, config in self.space.defaults.items():
            key = config_key(algorithm, config)
            if key in remeasured:
                defaults[algorithm] = remeasured[key]
            elif key in self.seen:
                defaults[algorithm] = self.seen[key]
            elif not self.space.is_valid(algorithm, config):
                broken = ", ".join(self.space.violations(algorithm, config))
                defaults[algorithm] = Result(algorithm, dict(config), Status.INVALID,
                                             message=f"default violates {broken}")
        return SearchLog(self.results, final, defaults, self.resumed, self.invalid, self.duplicates, stop,
                         self.study.study_name, self.strategy.clock() - self.start)
