"""Search strategies as plug-ins with one method: ``search(space, evaluate, budget) -> SearchLog``.

Every strategy drives an Optuna study through ``ask``/``tell`` (in memory by default, an RDB storage
in the tuner), so every strategy is resumable and visible in optuna-dashboard:

- ``tpe`` (default): Optuna's multivariate, grouped TPE (good with conditional parameters);
- ``random``: Optuna's random sampler;
- ``grid``: every valid config once, in a seeded random order (an unbiased sample under a budget);
- ``exhaustive``: every valid config once, defaults first then space order (chosen automatically by
  the tuner when the valid space is small).

Trial layout: the first categorical is ``algorithm``; each parameter of algorithm ``A`` is the
categorical ``"A.PARAM"`` over the raw value list of its space, suggested only when ``A`` was chosen
(Optuna's define-by-run conditional parameters, with static choices per name).

Invalid combinations: samplers propose from the raw value lists, so a proposal can break a constraint.
Such a trial is told PRUNED with status ``invalid`` and is never compiled or counted against the trial
budget; the sampler still learns from it (TPE ranks pruned trials below every complete one). To keep
making progress when most of the raw product is invalid, the valid config nearest to the proposal
(see :meth:`SearchSpace.nearest`) that has not been evaluated yet is enqueued as the next trial — a
repair that adds measurements without lying to the sampler about which params it proposed. A proposal
that repeats an evaluated config is told the stored value (no re-measurement) and is repaired the same
way. Failed evaluations (compile/launch error, wrong result, timeout) are told PRUNED too, so TPE
steers away from them; their status stays in the trial's user attribute.

Resuming: each trial's :class:`Result` (config, status, raw times) is a user attribute written before
its ``tell``, and each ``tell`` commits, so a re-run of the same study rebuilds every finished result
without measuring it again; the trial budget counts them. A trial left RUNNING by a process of this
host that no longer exists is marked FAIL (``interrupted``) and its config becomes eligible again.

Sharing: several workers (processes, machines) may run one study through one storage. Once per
proposal batch, after the batch's params are written, the driver re-reads the study's trials: a
config another worker has measured is told its result (``duplicate``), one another worker is measuring
now is told FAIL (``busy``; the config is measured by that worker, and a later proposal of it is told
that result), and the trial budget counts every worker's results plus other workers' trials asked
earlier and still running (``surplus`` ends this worker's search). The winner is chosen from every
worker's results. Workers that see each other reseed their samplers by worker name.
"""

from __future__ import annotations

import contextlib
import random
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import optuna

from tunecl.search.batching import BatchedStudyDriver, Preparer
from tunecl.search.budget import Budget, Evaluator, Progress, ProgressCallback, SearchLog
from tunecl.search.driver import StudyDriver
from tunecl.search.result import Config
from tunecl.search.space import SearchSpace

GRID_ENUMERATION_LIMIT = 100_000  # larger valid spaces are sampled by the grid strategy, not listed

__all__ = ["STRATEGIES", "TPE", "Budget", "Evaluator", "Exhaustive", "Grid", "OptunaStrategy", "Progress",
           "ProgressCallback", "RandomSearch", "SearchLog", "Strategy", "quiet_optuna"]


class Strategy(Protocol):
    """A search strategy: finds fast valid configs within a budget and returns what it measured."""

    name: str

    def search(self, space: SearchSpace, evaluate: Evaluator, budget: Budget) -> SearchLog: ...


class OptunaStrategy:
    """Base of the strategies: an Optuna study driven by ask/tell (see the module docstring).

    Args:
        storage: an Optuna storage object or URL; None keeps the study in memory.
        study_name: the study to create or resume (None: a fresh generated name).
        seed: sampler seed (a resumed study offsets it by its trial count, so a resumed sampler does
            not replay the proposals it made before).
        progress: called after every evaluation with a :class:`Progress`.
        clock: monotonic seconds (tests pass a fake one).
        jobs: trials asked at once; with more than 1, their evaluations are started together through
            the ``prepare`` of :meth:`search` (builds in worker processes) and finished serially.
        worker: this worker's name in the study's trials (default ``host:pid``); workers sharing a
            study must have distinct names.
    """

    name = "optuna"

    def __init__(self, storage: str | optuna.storages.BaseStorage | None = None,
                 study_name: str | None = None, seed: int = 0, progress: ProgressCallback | None = None,
                 clock: Callable[[], float] = time.monotonic, jobs: int = 1, worker: str | None = None):
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.jobs = jobs
        self.storage = storage
        self.study_name = study_name
        self.seed = seed
        self.progress = progress
        self.clock = clock
        self.worker = worker

    def make_sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=seed)

    def order(self, space: SearchSpace) -> Iterable[tuple[str, Config]] | None:
        """A fixed order in which to propose every valid config, or None to let the sampler propose."""
        return None

    def search(self, space: SearchSpace, evaluate: Evaluator, budget: Budget,
               prepare: Preparer | None = None) -> SearchLog:
        """Run the search; ``prepare`` (used when ``jobs > 1``) starts an evaluation ahead of time."""
        with quiet_optuna():
            if self.jobs > 1:
                return BatchedStudyDriver(self, space, evaluate, budget, prepare).run()
            return StudyDriver(self, space, evaluate, budget).run()


class TPE(OptunaStrategy):
    """Optuna's TPE, multivariate and grouped so each algorithm's parameters are modelled together."""

    name = "tpe"

    def make_sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # several open trials (jobs > 1): pretend the running ones scored badly, so that one batch
            # does not propose the same region J times
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                              n_startup_trials=10, constant_liar=self.jobs > 1)


class RandomSearch(OptunaStrategy):
    """Optuna's random sampler over the raw value lists (invalid proposals are repaired)."""

    name = "random"


class Exhaustive(OptunaStrategy):
    """Every valid config once: each algorithm's default first, then the spaces in their order."""

    name = "exhaustive"

    def order(self, space: SearchSpace) -> Iterable[tuple[str, Config]]:
        return space.candidates()


class Grid(OptunaStrategy):
    """Every valid config once, in a seeded random order: under a trial budget, an unbiased sample.

    Optuna's GridSampler cannot express conditional parameters (its grid is the product of every
    parameter of every algorithm), so the valid grid is enumerated here and enqueued one by one.
    """

    name = "grid"

    def order(self, space: SearchSpace) -> Iterable[tuple[str, Config]]:
        if space.count(GRID_ENUMERATION_LIMIT) > GRID_ENUMERATION_LIMIT:
            # too many to list: uniform random valid configs (repeats are skipped when enqueued)
            return space.samples(self.seed)
        everything = list(space.candidates())
        random.Random(self.seed).shuffle(everything)
        return everything


STRATEGIES: dict[str, type[OptunaStrategy]] = {
    "tpe": TPE, "random": RandomSearch, "grid": Grid, "exhaustive": Exhaustive}


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna logs every tell at INFO; the tuner draws its own progress."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)
