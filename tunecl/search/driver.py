"""The study driver behind every strategy: ask, check, evaluate, tell, resume, re-measure.

See :mod:`tunecl.search.strategies` for the trial layout, how invalid proposals are handled and how a
study resumes; this module is the loop that does it, one trial at a time. The batched loop (``jobs >
1``) is :mod:`tunecl.search.batching`; what the driver knows of the study's trials, and the workers
that share it, is :mod:`tunecl.search.coordination`.
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Iterator
from typing import Any

import optuna
from optuna.trial import Trial, TrialState

from tunecl.search.budget import Budget, Evaluator, Key, Progress, SearchLog, StudyStrategy
from tunecl.search.coordination import ATTR, WORKER_ATTR, StudyHistory, this_worker
from tunecl.search.result import Config, Result, Status, config_key, from_summary, summarize
from tunecl.search.space import SearchSpace

# study user attribute: the last re-measurement round, {"round": N, "results": [summarize(result), ...]}
ROUND_ATTR = "tunecl_final_round"
EXHAUSTION_COUNT_LIMIT = 200      # a time-limited search knows the size of spaces up to this many configs


class StudyDriver:
    """One call of a strategy's ``search`` (:meth:`tunecl.search.strategies.OptunaStrategy.search`): its
    study, history and counters. The strategy makes the samplers (``make_sampler``) and may fix the
    order of proposals (``order``)."""

    def __init__(self, strategy: StudyStrategy, space: SearchSpace, evaluate: Evaluator, budget: Budget):
        self.strategy, self.space, self.evaluate, self.budget = strategy, space, evaluate, budget
        self.start = strategy.clock()
        # the sampler is made again once the study's trials are counted (see _reseed)
        self.study = optuna.create_study(storage=strategy.storage, study_name=strategy.study_name,
                                         direction="minimize", load_if_exists=True,
                                         sampler=strategy.make_sampler(strategy.seed))
        # The exact size matters only to notice that everything was evaluated, which a budget of N
        # trials can only do when the space has at most N configs: count no further than that. A
        # budget of time alone counts to EXHAUSTION_COUNT_LIMIT: counting to the grid strategy's
        # enumeration limit enumerated ~100,000 configs of the GEMM-backed conv families in ~3 s, inside
        # a time limit of 3-4 s, so that `tune --net --time-limit 4` measured little beyond the
        # defaults. (A larger space that a long search does exhaust stops when sampling finds nothing
        # new.)
        limit = budget.trials if budget.trials is not None else EXHAUSTION_COUNT_LIMIT
        counted = space.count(limit)
        self.size: int | None = counted if counted <= limit else None
        self.worker = strategy.worker or this_worker()
        self.history = StudyHistory(self.study, space, self.worker, budget.trials, self._reseed)
        self.inflight: set[Key] = set()  # configs asked in the current batch, not yet told (jobs > 1)
        self.repairs: collections.deque[tuple[str, Config]] = collections.deque()
        self.invalid = self.duplicates = self.measured = 0
        trials = self.history.sync()
        self.resumed = len(self.history.results)
        self.study.sampler = strategy.make_sampler(self.history.seed(strategy.seed, trials))
        fixed = strategy.order(space)
        self.order: Iterator[tuple[str, Config]] | None = iter(fixed) if fixed is not None else None

    def _reseed(self) -> None:
        """Another worker joined the study: a sampler seeded by this worker's name (see
        :meth:`StudyHistory.seed`)."""
        self.study.sampler = self.strategy.make_sampler(
            self.history.seed(self.strategy.seed, len(self.history.absorbed)))

    # -- proposals ------------------------------------------------------------------------------------
    def _params(self, algorithm: str, config: Config) -> dict[str, Any]:
        return {"algorithm": algorithm, **{f"{algorithm}.{p}": int(v) for p, v in config.items()}}

    def _enqueue(self, algorithm: str, config: Config) -> bool:
        key = config_key(algorithm, config)
        h = self.history
        if (key in h.seen or key in h.pending or key in self.inflight or key in h.elsewhere
                or not self.space.is_valid(algorithm, config)):
            return False
        self.study.enqueue_trial(self._params(algorithm, config))
        h.pending.add(key)
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
        h = self.history
        exclude = set(h.seen) | h.pending | self.inflight | set(h.elsewhere)
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

    def _ask(self) -> tuple[Trial, str, Config, Key] | None:
        """Ask the study for a trial and read its proposal: the trial, its algorithm, config and key;
        None when the proposal was invalid (told at once, never compiled). An interrupt meanwhile fails
        the trial."""
        trial = self.study.ask()
        try:
            trial.set_user_attr(WORKER_ATTR, self.worker)
            algorithm, config = self._suggest(trial)
            key = config_key(algorithm, config)
            self.history.pending.discard(key)
            if self._refused_invalid(trial, algorithm, config):
                return None
        except BaseException:
            self._fail(trial)
            raise
        return trial, algorithm, config, key

    def _refused_invalid(self, trial: Trial, algorithm: str, config: Config) -> bool:
        """Tell an invalid proposal at once (never compiled) and steer the sampler away; False if valid."""
        if self.space.is_valid(algorithm, config):
            return False
        broken = ", ".join(self.space.violations(algorithm, config))
        self._tell(trial, "invalid", Result(algorithm, config, Status.INVALID, message=f"violates {broken}"))
        self.invalid += 1
        self._repair(algorithm, config)
        return True

    # -- telling --------------------------------------------------------------------------------------
    def _tell(self, trial: Trial, phase: str, result: Result) -> None:
        self.history.absorbed.add(trial.number)
        trial.set_user_attr(ATTR, {"phase": phase, "result": result.to_dict()})
        if result.ok:
            self.study.tell(trial, result.time)
        else:
            self.study.tell(trial, state=TrialState.PRUNED)

    def _tell_duplicate(self, trial: Trial, key: Key, algorithm: str, config: Config) -> None:
        """Tell a proposal of an already measured config with that measurement (never measured again)."""
        self._tell(trial, "duplicate", self.history.seen[key])
        self.duplicates += 1
        self._repair(algorithm, config)

    def _yield(self, trial: Trial, why: str, algorithm: str, config: Config) -> None:
        """Tell a trial another worker's claim takes (``busy``/``surplus``, see
        :meth:`StudyHistory.claim`); repair a busy one's proposal."""
        self.history.give_way(trial, why)
        if why == "busy":
            self._repair(algorithm, config)

    def _fail(self, trial: Trial) -> None:
        with contextlib.suppress(Exception):
            trial.set_user_attr(ATTR, {"phase": "interrupted"})
            self.study.tell(trial, state=TrialState.FAIL)

    # -- stopping -------------------------------------------------------------------------------------
    def _since_improvement(self) -> int:
        best, since = math.inf, 0
        for result in self.history.results:
            if result.ok and result.time < best * (1.0 - self.budget.min_improvement):
                best, since = result.time, 0
            else:
                since += 1
                best = min(best, result.time)
        return since

    def _stop_reason(self, skipped: int) -> str | None:
        b, h = self.budget, self.history
        if b.trials is not None and len(h.results) >= b.trials:
            return "trials"
        # Time and patience never stop the search before every algorithm's default (and every config the
        # user asked to try) was measured: the defaults are the baseline that makes tuned never worse than
        # untuned (a 3 s limit once expired during setup and left a problem with no result at all).
        defaults_done = self._baseline_done()
        if (b.time_limit is not None and self.strategy.clock() - self.start >= b.time_limit
                and defaults_done):
            return "time_limit"
        if b.patience is not None and self._since_improvement() >= b.patience and defaults_done:
            return "patience"
        if self.size is not None and len(set(h.seen) | set(h.elsewhere)) >= self.size:
            return "exhausted"
        limit = b.max_skipped if b.max_skipped is not None else 10 * (b.trials or 10) + 100
        if skipped > limit:
            return "skipped"
        return None

    def _baseline_done(self) -> bool:
        """Whether every default and every seed (``--try``) has been measured."""
        return all(config_key(a, c) in self.history.seen
                   for a, c in (*self.space.defaults.items(), *self.space.seeds))

    # -- the loop -------------------------------------------------------------------------------------
    def _best(self) -> Result | None:
        ok = [r for r in self.history.results if r.ok]
        return min(ok, key=lambda r: r.time) if ok else None

    def _planned(self) -> int | None:
        """The planned number of search results (None when only a time limit bounds the search)."""
        known = [x for x in (self.budget.trials, self.size) if x is not None]
        return min(known) if known else None

    def _report(self, phase: str, done: int, total: int | None, best: Result | None, last: Result) -> None:
        if self.strategy.progress is not None:
            self.strategy.progress(Progress(phase, done, total, best, last,
                                            self.strategy.clock() - self.start))

    def run(self) -> SearchLog:
        for algorithm, config in self.space.defaults.items():
            self._enqueue(algorithm, config)  # defaults first: tuned is never worse than untuned
        for algorithm, config in self.space.seeds:
            self._enqueue(algorithm, config)  # then what the user asked to try
        for algorithm, config in self.space.hints:
            self._enqueue(algorithm, config)  # then the winners of similar problems
        stop = self._search()
        self.history.sync()  # the winner is chosen from every worker's results
        final = self._final_round()
        return self._log(final, stop)

    def _search(self) -> str:
        """Ask, check, evaluate and tell one trial at a time until a stop rule holds; return its reason."""
        total = self._planned()
        skipped = 0
        while True:
            stop = self._stop_reason(skipped)
            if stop is not None:
                return stop
            if not self._propose():
                return "exhausted"
            asked = self._ask()
            if asked is None:
                skipped += 1
                continue
            trial, algorithm, config, key = asked
            told = False
            try:
                self.history.sync()  # after the params are written: see StudyHistory.claim
                why = self.history.claim(trial.number, key)
                if why == "duplicate":
                    self._tell_duplicate(trial, key, algorithm, config)
                    told = True
                    skipped += 1
                    continue
                if why is not None:
                    self._yield(trial, why, algorithm, config)
                    told = True
                    if why == "surplus":
                        return "trials"
                    skipped += 1
                    continue
                result = self.evaluate(algorithm, config)
                self._tell(trial, "search", result)
                told = True
                self.measured += 1
            except BaseException:
                # interrupted (Ctrl-C, a callback, a bug outside the candidate): leave no RUNNING trial
                if not told:
                    self._fail(trial)
                raise
            self.history.add(key, result)
            self._report("search", len(self.history.results), total, self._best(), result)

    # -- the re-measurement round -------------------------------------------------------------------
    def _final_candidates(self) -> list[Result]:
        ok = sorted((r for r in self.history.results if r.ok), key=lambda r: r.time)
        if not ok or self.budget.top_k == 0:
            return []
        chosen: dict[Key, Result] = {r.key: r for r in ok[:self.budget.top_k]}
        for algorithm in self.space.algorithms:
            mine = [r for r in ok if r.algorithm == algorithm]
            if mine:
                chosen.setdefault(mine[0].key, mine[0])
            default = self.history.seen.get(config_key(algorithm, self.space.defaults[algorithm]))
            if default is not None and default.ok:
                chosen.setdefault(default.key, default)
        return sorted(chosen.values(), key=lambda r: r.time)

    def _final_round(self) -> list[Result]:
        """Re-measure the top configs (plus each algorithm's best and default), once per search state.

        The round is stored in the study (a user attribute rewritten after each re-measurement) under
        the number of search results it ranked, so a resumed run that adds no trials reuses it. Each
        result is stored summarized (:func:`summarize`: its ranking time and the samples' count, min,
        median and max), which ranks a resumed round exactly as the measured one.
        """
        self.history.await_other_workers()
        candidates = self._final_candidates()
        round_id = len(self.history.results)
        stored = self.study.user_attrs.get(ROUND_ATTR) or {}
        done: dict[Key, tuple[Result, dict[str, Any]]] = {}  # read back: the result and its record
        if stored.get("round") == round_id:
            for data in stored.get("results", []):
                with contextlib.suppress(KeyError, ValueError, TypeError, AttributeError):
                    result = from_summary(data)
                    done[result.key] = result, summarize(result) if "times" in data else data
        final: list[Result] = []
        records: list[dict[str, Any]] = []
        for index, candidate in enumerate(candidates):
            again, record = done.get(candidate.key) or (None, None)
            if again is None or record is None:
                again = self.evaluate(candidate.algorithm, candidate.config)
                record = summarize(again)
                self.study.set_user_attr(ROUND_ATTR, {"round": round_id, "results": [*records, record]})
            final.append(again)
            records.append(record)
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
            elif key in self.history.seen:
                defaults[algorithm] = self.history.seen[key]
            elif not self.space.is_valid(algorithm, config):
                broken = ", ".join(self.space.violations(algorithm, config))
                defaults[algorithm] = Result(algorithm, dict(config), Status.INVALID,
                                             message=f"default violates {broken}")
        # read back = not measured by this call: resumed at the start or measured by another worker
        results = self.history.results
        return SearchLog(results, final, defaults, len(results) - self.measured, self.invalid,
                         self.duplicates, stop,
                         self.study.study_name, self.strategy.clock() - self.start)
