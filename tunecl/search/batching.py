"""The study driver's batched loop (``jobs > 1``): ask several trials, start their builds together,
measure them one at a time.

:class:`BatchedStudyDriver` is a :class:`~tunecl.search.driver.StudyDriver` whose search asks up to
``jobs`` trials at once; the proposals, telling, stop rules, claims and the re-measurement round are the
driver's.
"""

from __future__ import annotations

from collections.abc import Callable

from optuna.trial import Trial

from tunecl.search.budget import Budget, Evaluator, Key, StudyStrategy
from tunecl.search.driver import StudyDriver
from tunecl.search.result import Config, Result
from tunecl.search.space import SearchSpace

# Starts the work of evaluating a config (e.g. compiling it in another process) and returns what
# completes the evaluation; see :mod:`tunecl.search.prebuild`.
Preparer = Callable[[str, Config], Callable[[], Result]]

Batch = list[tuple[Trial, str, Config, Key]]


class BatchedStudyDriver(StudyDriver):
    """A study driver that evaluates ``strategy.jobs`` trials per batch.

    Args:
        prepare: starts an evaluation ahead of time (builds in worker processes); None evaluates each
            trial when its turn comes.
    """

    def __init__(self, strategy: StudyStrategy, space: SearchSpace, evaluate: Evaluator, budget: Budget,
                 prepare: Preparer | None = None):
        super().__init__(strategy, space, evaluate, budget)
        self.prepare: Preparer = prepare or (lambda a, c: lambda: self.evaluate(a, c))

    def _batch_size(self) -> int:
        """How many trials to ask at once: ``jobs``, but no more than the trial budget or space has left."""
        want = self.strategy.jobs
        if self.budget.trials is not None:
            want = min(want, self.budget.trials - len(self.history.results))
        if self.size is not None:
            want = min(want, self.size - len(self.history.seen))
        return max(want, 1)

    def _search(self) -> str:
        """Ask up to ``jobs`` trials, start all their builds, then evaluate them serially.

        Same guarantees as the serial loop: invalid and repeated proposals are told at once and never
        compiled, each evaluation is told (committed) as soon as it finishes, and an interrupt fails
        only the trials not told yet. A stop condition (time limit, patience) is checked between
        batches, so it can let up to ``jobs - 1`` more evaluations finish. With a time limit, a batch
        starts only if it is expected to end within the limit (as long as the recent batches took): a
        batch (up to ``jobs`` builds, then their measurements) takes seconds, and one started just
        before the limit overran it by that much.
        """
        total = self._planned()
        skipped = 0
        durations: list[float] = []   # of the batches so far (seconds)
        while True:
            stop = self._stop_reason(skipped) or self._no_time_for_a_batch(durations)
            if stop is not None:
                return stop
            batch_start = self.strategy.clock()
            want = self._batch_size()
            batch: Batch = []
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
                        if key in self.history.seen:
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
                finishers = [self.prepare(algorithm, config) for _, algorithm, config, _ in batch]
                started = len(finishers)
                while batch:
                    trial, algorithm, config, key = batch[0]
                    result = finishers.pop(0)()
                    self._tell(trial, "search", result)
                    batch.pop(0)
                    self.inflight.discard(key)
                    self.measured += 1
                    self.history.add(key, result)
                    self._report("search", len(self.history.results), total, self._best(), result)
                while later:
                    trial, key, algorithm, config = later[0]
                    if key in self.history.seen:
                        self._tell(trial, "duplicate", self.history.seen[key])
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
            if stop is not None:
                return stop

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

    def _claim_batch(self, batch: Batch, stop: str | None, skipped: int) -> tuple[str | None, int]:
        """One sync for a batch whose params are written; drop (tell) the trials
        :meth:`StudyHistory.claim <tunecl.search.coordination.StudyHistory.claim>` says this worker must
        not measure, in place. Returns the updated stop reason and skip count."""
        if not batch:
            return stop, skipped
        self.history.sync()
        kept: Batch = []
        for trial, algorithm, config, key in batch:
            why = self.history.claim(trial.number, key, ahead=len(kept))
            if why is None:
                kept.append((trial, algorithm, config, key))
                continue
            self.inflight.discard(key)
            if why == "duplicate":
                self._tell(trial, "duplicate", self.history.seen[key])
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
