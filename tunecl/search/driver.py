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
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tunecl.search.budget import Budget, Evaluator, Key, Progress, SearchLog, StudyStrategy
from tunecl.search.result import Config, Result, Status, config_key, from_summary, summarize
from tunecl.search.space import SearchSpace

# Starts the work of evaluating a config (e.g. compiling it in another process) and returns what
# completes the evaluation; see :mod:`tunecl.search.prebuild`.
Preparer = Callable[[str, Config], Callable[[], Result]]

ATTR = "tunecl"  # user attribute of a trial: {"phase": ..., "result": Result.to_dict()}
WORKER_ATTR = "tunecl_worker"  # "host:pid" of the process that asked the trial
# study user attribute: the last re-measurement round, {"round": N, "results": [summarize(result), ...]}
ROUND_ATTR = "tunecl_final_round"
GRID_ENUMERATION_LIMIT = 100_000  # larger valid spaces are sampled by the grid strategy, not listed
EXHAUSTION_COUNT_LIMIT = 200      # a time-limited search knows the size of spaces up to this many configs
AWAIT_OTHERS_S = 600.0            # longest wait for other workers' running trials when none of ours ran
AWAIT_POLL_S = 0.2


def process_gone(worker: str) -> bool:
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
    """One call of a strategy's ``search`` (:meth:`tunecl.search.strategies.OptunaStrategy.search`): its
    study, history and counters."""

    def __init__(self, strategy: StudyStrategy, space: SearchSpace, evaluate: Evaluator, budget: Budget,
                 prepare: Preparer | None = None):
        self.strategy, self.space, self.evaluate, self.budget = strategy, space, evaluate, budget
        self.prepare = prepare
        self.start = strategy.clock()
        self.study = optuna.create_study(storage=strategy.storage, study_name=strategy.study_name,
                                         direction="minimize", load_if_exists=True,
                                         sampler=optuna.samplers.RandomSampler(seed=strategy.seed))
        # The exact size matters only to notice that everything was evaluated, which a budget of N
        # trials can only do when the space has at most N configs: count no further than that. A
        # budget of time alone counts to EXHAUSTION_COUNT_LIMIT: counting to GRID_ENUMERATION_LIMIT
        # enumerated ~100,000 configs of the GEMM-backed conv families in ~3 s, inside a time limit
        # of 3-4 s, so that `tune --net --time-limit 4` measured little beyond the defaults. (A larger
        # space that a long search does exhaust stops when sampling finds nothing new.)
        limit = budget.trials if budget.trials is not None else EXHAUSTION_COUNT_LIMIT
        counted = space.count(limit)
        self.size: int | None = counted if counted <= limit else None
        self.worker = strategy.worker or f"{socket.gethostname()}:{os.getpid()}"
        self.results: list[Result] = []  # every worker's, in the order this driver learnt of them
        self.seen: dict[Key, Result] = {}
        self.pending: set[Key] = set()  # configs of WAITING trials
        self.inflight: set[Key] = set()  # configs asked in the current batch, not yet told (jobs > 1)
        self.elsewhere: dict[Key, int] = {}  # configs other workers are measuring -> their trial number
        self.running_elsewhere: list[int] = []  # numbers of other workers' RUNNING trials
        self.absorbed: set[int] = set()  # trial numbers already read or told by this driver
        self.repairs: collections.deque[tuple[str, Config]] = collections.deque()
        self.invalid = self.duplicates = self.busy = self.measured = 0
        self.shared = False  # another worker was seen at work on this study
        self.started = False
        trials = self._sync()
        self.resumed = len(self.results)
        self.study.sampler = strategy.make_sampler(self._seed(trials))
        fixed = strategy.order(space)
        self.order: Iterator[tuple[str, Config]] | None = iter(fixed) if fixed is not None else None
        self.started = True

    # -- history --------------------------------------------------------------------------------------
    def _sync(self) -> int:
        """Read the study's trials (one query); return how many it has.

        Absorbs every finished search result not read yet, whichever worker measured it (so the
        budget, the duplicate check and the winner cover all workers), and notes which configs wait
        and which other workers are measuring now. Called once at the start, once per proposal batch
        (after its params are written: see :meth:`_claim`) and once before the final round.
        """
        trials = self.study.get_trials(deepcopy=False)
        pending: set[Key] = set()
        elsewhere: dict[Key, int] = {}
        running: list[int] = []
        others = False  # a result of another worker arrived while this driver runs
        for trial in sorted(trials, key=lambda t: t.number):
            worker = trial.user_attrs.get(WORKER_ATTR)
            if trial.state == TrialState.WAITING:
                decoded = self._decode_params(trial.system_attrs.get("fixed_params", {}))
                if decoded:
                    pending.add(config_key(*decoded))
                continue
            if trial.state == TrialState.RUNNING:
                if worker == self.worker or self._fail_if_orphaned(trial):
                    continue
                running.append(trial.number)
                decoded = self._decode_params(trial.params)  # None while its params are being written
                if decoded:
                    elsewhere.setdefault(config_key(*decoded), trial.number)
                continue
            if trial.number in self.absorbed:
                continue
            self.absorbed.add(trial.number)
            others = others or self.started
            info = trial.user_attrs.get(ATTR) or {}
            if info.get("phase") == "search" and "result" in info:
                try:
                    result = Result.from_dict(info["result"])
                except (KeyError, ValueError, TypeError, AttributeError):
                    continue  # a trial written by a foreign or newer tool: ignore it, don't crash
                self.results.append(result)
                self.seen.setdefault(result.key, result)
                if worker is not None and worker != self.worker:
                    others = True
        self.pending, self.elsewhere, self.running_elsewhere = pending, elsewhere, running
        if running or others:
            self._note_other_worker()
        return len(trials)

    def _note_other_worker(self) -> None:
        """Another worker is at work on this study: reseed the sampler by worker, once.

        Why: workers started together with one seed would otherwise propose the same configs in the
        same order, and each proposal would be measured by one worker and skipped by the other. A
        study resumed by one process alone keeps its reproducible seed.
        """
        if not self.shared:
            self.shared = True
            if self.started:
                self.study.sampler = self.strategy.make_sampler(self._seed(len(self.absorbed)))

    def _seed(self, trials: int) -> int:
        offset = zlib.crc32(self.worker.encode()) % 1_000_003 if self.shared else 0
        return self.strategy.seed + trials + offset

    def _fail_if_orphaned(self, trial: FrozenTrial) -> bool:
        """Mark FAIL a RUNNING trial whose process (of this host) is gone; return whether it was."""
        if not process_gone(str(trial.user_attrs.get(WORKER_ATTR, ""))):
            return False
        storage = self.study._storage
        with contextlib.suppress(RuntimeError, ValueError):  # another worker marked it first
            storage.set_trial_user_attr(trial._trial_id, ATTR, {"phase": "interrupted"})
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        return True

    def _claim(self, number: int, key: Key, ahead: int = 0) -> str | None:
        """What to do with this worker's trial ``number`` of config ``key``, right after a sync that
        followed the writing of its params: None (measure it), ``"duplicate"`` (another worker has
        measured it: tell its result), ``"busy"`` (another worker is measuring it) or ``"surplus"``
        (finished and running trials of other workers already fill the trial budget).

        Why this is enough to never measure a config twice: of two trials of one config, the one
        synced later sees the other's params (written before that one's own sync) and yields to it,
        whether it is still RUNNING or finished; only a trial that went on to be measured makes the
        other yield. ``ahead`` counts this worker's own trials of the batch asked before this one.
        """
        if key in self.seen:
            return "duplicate"
        if key in self.elsewhere:
            return "busy"
        if self.budget.trials is not None:
            # only other workers' trials asked *before* this one count, so of two workers racing for
            # the last trial the earlier one always goes on (never both stop, never both measure)
            before = sum(1 for n in self.running_elsewhere if n < number)
            if len(self.results) + before + ahead >= self.budget.trials:
                return "surplus"
        return None

    def _yield(self, trial: Trial, why: str, algorithm: str, config: Config) -> None:
        """Tell a trial this worker will not measure (``busy``/``surplus``): FAIL, so that samplers
        ignore it and its config stays eligible."""
        self.absorbed.add(trial.number)
        with contextlib.suppress(Exception):
            trial.set_user_attr(ATTR, {"phase": why})
        self.study.tell(trial, state=TrialState.FAIL)
        if why == "busy":
            self.busy += 1
            self._repair(algorithm, config)

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
        if (key in self.seen or key in self.pending or key in self.inflight or key in self.elsewhere
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
        exclude = set(self.seen) | self.pending | self.inflight | set(self.elsewhere)
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
        self.absorbed.add(trial.number)
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
        # Time and patience never stop the search before every algorithm's default (and every config the
        # user asked to try) was measured: the defaults are the baseline that makes tuned never worse than
        # untuned (a 3 s limit once expired during setup and left a problem with no result at all).
        defaults_done = self._baseline_done()
        if (b.time_limit is not None and self.strategy.clock() - self.start >= b.time_limit
                and defaults_done):
            return "time_limit"
        if b.patience is not None and self._since_improvement() >= b.patience and defaults_done:
            return "patience"
        if self.size is not None and len(set(self.seen) | set(self.elsewhere)) >= self.size:
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
        for algorithm, config in self.space.seeds:
            self._enqueue(algorithm, config)  # then what the user asked to try
        for algorithm, config in self.space.hints:
            self._enqueue(algorithm, config)  # then the winners of similar problems
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
            asked = self._ask()
            if asked is None:
                skipped += 1
                continue
            trial, algorithm, config, key = asked
            told = False
            try:
                self._sync()  # after the params are written: see _claim
                why = self._claim(trial.number, key)
                if why == "duplicate":
                    self._tell_duplicate(trial, key, algorithm, config)
                    told = True
                    skipped += 1
                    continue
                if why is not None:
                    self._yield(trial, why, algorithm, config)
                    told = True
                    if why == "surplus":
                        stop = "trials"
                        break
                    skipped += 1
                    continue
                result = self.evaluate(algorithm, config)
                self._tell(trial, "search", result)
                told = True
                self.measured += 1
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
        self._sync()  # the winner is chosen from every worker's results
        final = self._final_round()
        return self._log(final, stop or "trials")

    def _ask(self) -> tuple[Trial, str, Config, Key] | None:
        """Ask the study for a trial and read its proposal: the trial, its algorithm, config and key;
        None when the proposal was invalid (told at once, never compiled). An interrupt meanwhile fails
        the trial."""
        trial = self.study.ask()
        try:
            trial.set_user_attr(WORKER_ATTR, self.worker)
            algorithm, config = self._suggest(trial)
            key = config_key(algorithm, config)
            self.pending.discard(key)
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

    def _tell_duplicate(self, trial: Trial, key: Key, algorithm: str, config: Config) -> None:
        """Tell a proposal of an already measured config with that measurement (never measured again)."""
        self._tell(trial, "duplicate", self.seen[key])
        self.duplicates += 1
        self._repair(algorithm, config)

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
        batches, so it can let up to ``jobs - 1`` more evaluations finish. With a time limit, a batch
        starts only if it is expected to end within the limit (as long as the recent batches took): a
        batch (up to ``jobs`` builds, then their measurements) takes seconds, and one started just
        before the limit overran it by that much.
        """
        known = [x for x in (self.budget.trials, self.size) if x is not None]
        total = min(known) if known else None
        prepare = self.prepare or (lambda a, c: lambda: self.evaluate(a, c))
        stop: str | None = None
        skipped = 0
        durations: list[float] = []   # of the batches so far (seconds)
        while stop is None:
            stop = self._stop_reason(skipped) or self._no_time_for_a_batch(durations)
            if stop is not None:
                break
            batch_start = self.strategy.clock()
            want = self._batch_size()
            batch: list[tuple[Trial, str, Config, Key]] = []
            later: list[tuple[Trial, Key, str, Config]] = []  # repeats of a config in this batch
            try:
                while len(batch) < want and self._stop_reason(skipped) in (None, "time_limit", "patience"):
                    if not self._propose():
                        stop = "exhausted"
                        break
                    asked = self._ask()
                    if asked is None:
                        skipped += 1
                        continue
                    trial, algorithm, config, key = asked
                    later_or_batch = False
                    try:
                        if key in self.seen:
                            self._tell_duplicate(trial, key, algorithm, config)
                            skipped += 1
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
                stop, skipped = self._claim_batch(batch, stop, skipped)
                finishers = [prepare(algorithm, config) for _, algorithm, config, _ in batch]
                started = len(finishers)
                while batch:
                    trial, algorithm, config, key = batch[0]
                    result = finishers.pop(0)()
                    self._tell(trial, "search", result)
                    batch.pop(0)
                    self.inflight.discard(key)
                    self.measured += 1
                    self.results.append(result)
                    self.seen.setdefault(key, result)
                    self._report("search", len(self.results), total, self._best(), result)
                while later:
                    trial, key, algorithm, config = later[0]
                    if key in self.seen:
                        self._tell(trial, "duplicate", self.seen[key])
                    else:  # its twin in the batch was left to another worker
                        self._yield(trial, "busy", algorithm, config)
                    later.pop(0)
                    self.duplicates += 1
                    skipped += 1
                    self._repair(algorithm, config)
                if started:
                    durations.append(self.strategy.clock() - batch_start)
            except BaseException:
                # interrupted: leave no RUNNING trial (finished ones are told already)
                for trial, *_ in batch:
                    self._fail(trial)
                for trial, *_ in later:
                    self._fail(trial)
                self.inflight.clear()
                raise
        self._sync()  # the winner is chosen from every worker's results
        final = self._final_round()
        return self._log(final, stop or "trials")

    def _no_time_for_a_batch(self, durations: list[float]) -> str | None:
        """``time_limit`` when the next batch, expected to take as long as the last three did on
        average, would end past the time limit (never before every default was measured)."""
        b = self.budget
        if b.time_limit is None or not durations:
            return None
        recent = durations[-3:]
        if self.strategy.clock() - self.start + sum(recent) / len(recent) <= b.time_limit:
            return None
        if not self._baseline_done():
            return None
        return "time_limit"

    def _baseline_done(self) -> bool:
        """Whether every default and every seed (``--try``) has been measured."""
        return all(config_key(a, c) in self.seen
                   for a, c in (*self.space.defaults.items(), *self.space.seeds))

    def _claim_batch(self, batch: list[tuple[Trial, str, Config, Key]], stop: str | None,
                     skipped: int) -> tuple[str | None, int]:
        """One sync for a batch whose params are written; drop (tell) the trials :meth:`_claim` says
        this worker must not measure, in place. Returns the updated stop reason and skip count."""
        if not batch:
            return stop, skipped
        self._sync()
        kept: list[tuple[Trial, str, Config, Key]] = []
        for trial, algorithm, config, key in batch:
            why = self._claim(trial.number, key, ahead=len(kept))
            if why is None:
                kept.append((trial, algorithm, config, key))
                continue
            self.inflight.discard(key)
            if why == "duplicate":
                self._tell(trial, "duplicate", self.seen[key])
                self.duplicates += 1
                self._repair(algorithm, config)
            else:
                self._yield(trial, why, algorithm, config)
                if why == "surplus":
                    stop = "trials"
                    continue
            skipped += 1
        batch[:] = kept
        return stop, skipped

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
        the number of search results it ranked, so a resumed run that adds no trials reuses it. Each
        result is stored summarized (:func:`summarize`: its ranking time and the samples' count, min,
        median and max), which ranks a resumed round exactly as the measured one.
        """
        self._await_other_workers()
        candidates = self._final_candidates()
        round_id = len(self.results)
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

    def _await_other_workers(self) -> None:
        """With no ok result yet while other workers measure this study's trials (they took the whole
        trial budget, or every config left), wait for those trials and take their results instead of
        ending without a winner; at most ``AWAIT_OTHERS_S`` (a trial of a dead worker of this host is
        failed by :meth:`_sync`; one of another host may stay RUNNING)."""
        deadline = time.monotonic() + AWAIT_OTHERS_S
        while (self.running_elsewhere and not any(r.ok for r in self.results)
               and time.monotonic() < deadline):
            time.sleep(AWAIT_POLL_S)
            self._sync()

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
        # read back = not measured by this call: resumed at the start or measured by another worker
        return SearchLog(self.results, final, defaults, len(self.results) - self.measured, self.invalid,
                         self.duplicates, stop,
                         self.study.study_name, self.strategy.clock() - self.start)
