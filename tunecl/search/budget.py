"""What a search is given and what it returns: :class:`Budget`, :class:`Progress`, :class:`SearchLog`.

Plain values shared by the strategies (``strategies.py``) and the study driver (``driver.py``), and
:class:`StudyStrategy`, what the driver reads from the strategy that runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from tunecl.search.result import Config, Result

if TYPE_CHECKING:  # (annotations only: these values need neither at run time)
    import optuna

    from tunecl.search.space import SearchSpace

Evaluator = Callable[[str, Config], Result]
Key = tuple[str, tuple[tuple[str, int], ...]]


@dataclasses.dataclass(frozen=True)
class Budget:
    """When a search stops, and how its winner is confirmed.

    Attributes:
        trials: evaluated candidates in the study (resumed ones included; invalid proposals and repeats
            excluded). None: no limit.
        time_limit: seconds of searching in this call (the re-measurement round comes on top).
        patience: stop after this many evaluations in a row without an improvement. None: never.
        min_improvement: relative gain that counts as an improvement (noise is not progress).
        top_k: how many of the fastest configs are re-measured before the winner is declared (each
            algorithm's best and default are re-measured too).
        max_skipped: proposals that evaluate nothing (invalid, repeated) in one call before giving up;
            None: ``10 * trials + 100``.
    """

    trials: int | None = None
    time_limit: float | None = None
    patience: int | None = None
    min_improvement: float = 0.01
    top_k: int = 3
    max_skipped: int | None = None

    def __post_init__(self) -> None:
        for name in ("trials", "patience", "max_skipped"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"budget {name} must be at least 1, got {value}")
        if self.time_limit is not None and self.time_limit <= 0:
            raise ValueError(f"budget time_limit must be positive, got {self.time_limit}")
        if self.top_k < 0:
            raise ValueError(f"budget top_k must be ≥ 0, got {self.top_k}")


@dataclasses.dataclass(frozen=True)
class Progress:
    """What a progress callback is told after each evaluation.

    Attributes:
        phase: ``"search"`` or ``"remeasure"``.
        done: evaluations so far in this phase (resumed ones included for ``search``).
        total: the planned number (None when only a time limit bounds the search).
        best: the fastest OK result so far (None before the first).
        last: the result just obtained.
        elapsed: seconds since the search call started.
    """

    phase: str
    done: int
    total: int | None
    best: Result | None
    last: Result
    elapsed: float


ProgressCallback = Callable[[Progress], None]


class StudyStrategy(Protocol):
    """The settings and hooks of a strategy that the study driver uses (``strategies.OptunaStrategy``
    has them; see its arguments)."""

    storage: str | optuna.storages.BaseStorage | None
    study_name: str | None
    seed: int
    progress: ProgressCallback | None
    clock: Callable[[], float]
    jobs: int
    worker: str | None

    def make_sampler(self, seed: int) -> optuna.samplers.BaseSampler: ...

    def order(self, space: SearchSpace) -> Iterable[tuple[str, Config]] | None: ...


@dataclasses.dataclass
class SearchLog:
    """Everything a search found.

    Attributes:
        results: every evaluation of the search phase in trial order (resumed ones first).
        final: the re-measurement round (the winner comes from here).
        defaults: algorithm -> result of its default config (re-measured one when available).
        resumed: how many of ``results`` were read back from the study instead of measured.
        invalid: invalid proposals skipped without compiling, in this call.
        duplicates: proposals that repeated an evaluated config, in this call.
        stop_reason: ``trials``, ``time_limit``, ``patience``, ``exhausted`` or ``skipped``.
        study_name: the Optuna study.
        elapsed: seconds this call took.
    """

    results: list[Result]
    final: list[Result]
    defaults: dict[str, Result]
    resumed: int
    invalid: int
    duplicates: int
    stop_reason: str
    study_name: str
    elapsed: float

    @property
    def evaluated(self) -> int:
        """Evaluations measured in this call."""
        return len(self.results) - self.resumed

    def best(self, algorithm: str | None = None) -> Result | None:
        """The fastest OK result (of ``algorithm``, if given): from the re-measurement round when it
        has one, else from the search, never a config that failed when re-measured."""
        def mine(r: Result) -> bool:
            return algorithm is None or r.algorithm == algorithm
        final_ok = [r for r in self.final if r.ok and mine(r)]
        if final_ok:
            return min(final_ok, key=lambda r: r.time)
        failed_again = {r.key for r in self.final if not r.ok}
        pool = [r for r in self.results if r.ok and mine(r) and r.key not in failed_again]
        return min(pool, key=lambda r: r.time) if pool else None

    @property
    def winner(self) -> Result | None:
        return self.best()

    def best_per_algorithm(self) -> dict[str, Result]:
        found = {name: self.best(name) for name in dict.fromkeys(r.algorithm for r in self.results)}
        return {name: r for name, r in found.items() if r is not None}
