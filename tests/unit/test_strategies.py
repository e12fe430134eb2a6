"""Strategies against a replay evaluator: a synthetic space with known timings, no OpenCL.

Every strategy must: evaluate each algorithm's default first, never hand an invalid config to the
evaluator, respect trial/time/patience budgets, re-measure the top configs before naming a winner,
never let a failed candidate win, and resume a study without evaluating finished trials again.
"""

from __future__ import annotations

import itertools
import json
import math

import optuna
import pytest

from tunecl.kernels.base import Constraint, Space
from tunecl.search.driver import ROUND_ATTR
from tunecl.search.result import Result, Status, config_key, from_summary, summarize
from tunecl.search.space import SearchSpace
from tunecl.search.strategies import STRATEGIES, TPE, Budget, Exhaustive, Grid, RandomSearch

SAMPLED = [TPE, RandomSearch, Grid]
ALL = [TPE, RandomSearch, Grid, Exhaustive]


def make_space() -> SearchSpace:
    """'tiled': 6×6 raw grid, valid when X*Y <= 64 (26 of 36 valid); 'direct': 8 configs, all valid."""
    tiled = Space({"X": (1, 2, 4, 8, 16, 32), "Y": (1, 2, 4, 8, 16, 32)},
                  [Constraint("area<=64", lambda c: c["X"] * c["Y"] <= 64)])
    direct = Space({"W": (1, 2, 3, 4, 5, 6, 7, 8)})
    return SearchSpace({"tiled": tiled, "direct": direct}, {"tiled": {"X": 1, "Y": 1}, "direct": {"W": 1}})


def base_time(algorithm: str, config: dict[str, int]) -> float:
    """Known timings: 'tiled' is fastest at X=8, Y=8 (1.0 ms); 'direct' is best at W=5 (2.0 ms)."""
    if algorithm == "tiled":
        return 1e-3 * (1.0 + abs(math.log2(config["X"]) - 3) + abs(math.log2(config["Y"]) - 3))
    return 1e-3 * (2.0 + abs(config["W"] - 5))


class Replay:
    """Returns known results, records every call, and fails the test on an invalid config.

    ``overrides`` maps (algorithm, config) keys to a list of results served in turn (then the last
    one again), e.g. a lucky first measurement followed by honest ones.
    """

    def __init__(self, space: SearchSpace, overrides: dict | None = None, clock: FakeClock | None = None):
        self.space = space
        self.calls: list[tuple[str, dict[str, int]]] = []
        self.overrides = overrides or {}
        self.clock = clock

    def __call__(self, algorithm: str, config: dict[str, int]) -> Result:
        assert self.space.is_valid(algorithm, config), f"invalid config compiled: {algorithm} {config}"
        self.calls.append((algorithm, dict(config)))
        if self.clock is not None:
            self.clock.now += 1.0
        key = config_key(algorithm, config)
        if key in self.overrides:
            served = self.overrides[key]
            seen = sum(1 for a, c in self.calls if config_key(a, c) == key)
            return served[min(seen, len(served)) - 1]
        t = base_time(algorithm, config)
        return Result(algorithm, dict(config), Status.OK, (t, t * 1.01, t * 0.99))

    def count(self, algorithm: str, config: dict[str, int]) -> int:
        return sum(1 for a, c in self.calls if a == algorithm and c == config)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def valid_configs(space: SearchSpace) -> list[tuple[str, dict[str, int]]]:
    return list(space.candidates())


def test_space_counts_and_nearest():
    space = make_space()
    assert space.size() == 26 + 8
    # (32, 32) is invalid; its nearest valid configs are two steps away: (32, 2) or (2, 32)... or (8, 8)
    nearest = space.nearest("tiled", {"X": 32, "Y": 32})
    assert space.is_valid("tiled", nearest)
    assert nearest["X"] * nearest["Y"] == 64
    # excluding every valid config leaves nothing
    every = {config_key("tiled", c) for c in space.spaces["tiled"].configs()}
    assert space.nearest("tiled", {"X": 1, "Y": 1}, every) is None


def test_counting_stops_at_its_limit_and_a_finished_enumeration_is_kept():
    checked = []

    def generate():
        for x in range(100_000):
            checked.append(x)
            yield {"X": x % 7}

    big = Space({"X": tuple(range(7))}, generate=generate)
    space = SearchSpace({"big": big}, {"big": {"X": 0}})
    assert space.count(10) == 11 and len(checked) == 11          # lazily, up to limit + 1
    small = Space({"X": (1, 2, 3)}, [Constraint("odd", lambda c: c["X"] % 2 == 1)])
    calls = []
    small.constraints.append(Constraint("counted", lambda c: calls.append(c) or True))
    assert SearchSpace({"small": small}, {"small": {"X": 1}}).count(10) == 2
    before = len(calls)
    assert small.configs() == [{"X": 1}, {"X": 3}] and len(calls) == before   # kept: not checked again


def test_a_time_budget_does_not_enumerate_a_big_space(monkeypatch):
    """With time alone the driver needs the size only to notice exhaustion: it counts no further than
    EXHAUSTION_COUNT_LIMIT (counting 100,000 conv configs once took a 3-4 s time limit whole)."""
    from tunecl.search import driver

    produced = []

    def generate():
        for x in itertools.count():
            produced.append(x)
            yield {"W": 1 + x % 8}

    space = SearchSpace({"direct": Space({"W": tuple(range(1, 9))}, generate=generate)}, {"direct": {"W": 1}})
    clock = FakeClock()
    replay = Replay(space, clock=clock)
    RandomSearch(seed=0, clock=clock).search(space, replay, Budget(time_limit=3.0, top_k=0))
    assert len(produced) <= driver.EXHAUSTION_COUNT_LIMIT + 2


def test_exhaustive_finds_the_optimum_and_evaluates_each_config_once():
    space = make_space()
    replay = Replay(space)
    log = Exhaustive().search(space, replay, Budget())
    search_calls = replay.calls[:len(log.results)]
    assert len(search_calls) == space.size()
    assert len({config_key(a, c) for a, c in search_calls}) == space.size()
    assert log.stop_reason == "exhausted"
    assert log.winner.algorithm == "tiled" and log.winner.config == {"X": 8, "Y": 8}
    best = min(valid_configs(space), key=lambda ac: base_time(*ac))
    assert (log.winner.algorithm, log.winner.config) == best


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s.name)
def test_defaults_are_evaluated_first(strategy):
    space = make_space()
    replay = Replay(space)
    strategy(seed=1).search(space, replay, Budget(trials=6))
    assert replay.calls[:2] == [("tiled", {"X": 1, "Y": 1}), ("direct", {"W": 1})]


@pytest.mark.parametrize("strategy", SAMPLED, ids=lambda s: s.name)
def test_trial_budget_is_respected_and_invalid_configs_are_never_compiled(strategy):
    space = make_space()
    replay = Replay(space)  # asserts validity of everything it is given
    log = strategy(seed=3).search(space, replay, Budget(trials=12, top_k=3))
    assert len(log.results) == 12 and log.evaluated == 12 and log.stop_reason == "trials"
    search_calls = replay.calls[:12]
    assert len({config_key(a, c) for a, c in search_calls}) == 12  # no config measured twice
    remeasured = replay.calls[12:]
    # top 3 plus each algorithm's best and default, deduplicated
    assert 3 <= len(remeasured) <= 3 + 2 * 2
    assert len(log.final) == len(remeasured)


def test_random_sampler_proposals_outside_the_constraints_are_skipped_not_compiled():
    space = make_space()
    replay = Replay(space)
    log = RandomSearch(seed=0).search(space, replay, Budget(trials=25, top_k=0))
    assert log.invalid > 0  # 10 of 36 raw 'tiled' combinations are invalid
    assert len(replay.calls) == 25


@pytest.mark.parametrize("strategy", SAMPLED, ids=lambda s: s.name)
def test_time_limit_stops_the_search(strategy):
    space = make_space()
    clock = FakeClock()
    replay = Replay(space, clock=clock)  # every evaluation takes one fake second
    log = strategy(seed=0, clock=clock).search(space, replay, Budget(time_limit=5.0, top_k=0))
    assert log.stop_reason == "time_limit"
    assert len(log.results) == 5


@pytest.mark.parametrize("strategy", SAMPLED, ids=lambda s: s.name)
def test_time_limit_spent_before_the_first_trial_still_measures_every_default(strategy):
    """A short --time-limit once expired while the first default compiled, and the other
    algorithms' defaults were never measured (on the H200 a problem ended with no result)."""
    space = make_space()
    clock = FakeClock()
    replay = Replay(space, clock=clock)

    def slow_first(algorithm: str, config: dict[str, int]) -> Result:
        if not replay.calls:
            clock.now += 100.0  # the first build alone outlasts the limit
        return replay(algorithm, config)

    log = strategy(seed=0, clock=clock).search(space, slow_first, Budget(time_limit=5.0, top_k=0))
    assert log.stop_reason == "time_limit"
    assert sorted(r.algorithm for r in log.results) == ["direct", "tiled"]
    assert all(r.config == space.defaults[r.algorithm] for r in log.results)


def test_patience_stops_a_search_without_improvement():
    space = make_space()
    flat = {config_key(a, c): [Result(a, c, Status.OK, (1e-3,))] for a, c in valid_configs(space)}
    replay = Replay(space, overrides=flat)
    log = TPE(seed=0).search(space, replay, Budget(trials=30, patience=5, top_k=0))
    assert log.stop_reason == "patience"
    assert len(log.results) == 6  # the first sets the best, five more bring nothing


def test_top_k_remeasure_decides_the_winner():
    space = make_space()
    lucky = ("tiled", {"X": 4, "Y": 8})  # measured 0.5 ms once by luck, 1.5 ms when measured again
    overrides = {config_key(*lucky): [Result("tiled", lucky[1], Status.OK, (0.5e-3,)),
                                      Result("tiled", lucky[1], Status.OK, (1.5e-3,))]}
    replay = Replay(space, overrides=overrides)
    log = Exhaustive().search(space, replay, Budget(top_k=3))
    assert min(log.results, key=lambda r: r.time).config == lucky[1]  # the search was fooled ...
    assert replay.count(*lucky) == 2  # ... so the lucky one was re-measured ...
    assert log.winner.config == {"X": 8, "Y": 8}  # ... and lost to the true optimum
    assert {r.key for r in log.final} >= {config_key("tiled", {"X": 8, "Y": 8}), config_key(*lucky)}


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s.name)
def test_a_wrong_result_never_wins_even_if_fastest(strategy):
    space = make_space()
    wrong = ("direct", {"W": 1})  # the default of 'direct': measured first, whatever the strategy
    overrides = {config_key(*wrong): [Result("direct", wrong[1], Status.WRONG_RESULT, (1e-6,),
                                             "12 of 100 elements wrong")]}
    replay = Replay(space, overrides=overrides)
    log = strategy(seed=0).search(space, replay, Budget(trials=10))
    assert log.winner is not None and log.winner.ok
    assert log.winner.key != config_key(*wrong)
    assert all(r.ok for r in log.best_per_algorithm().values())
    assert log.defaults["direct"].status is Status.WRONG_RESULT
    assert math.isinf(log.defaults["direct"].time)


def test_failures_of_every_kind_are_kept_but_never_win():
    space = make_space()
    statuses = itertools.cycle([Status.COMPILE_ERROR, Status.LAUNCH_ERROR, Status.TIMEOUT,
                                Status.WRONG_RESULT])
    overrides = {config_key(a, c): [Result(a, c, next(statuses), (1e-9,))]
                 for a, c in valid_configs(space) if a == "tiled" and c["X"] <= 2}
    replay = Replay(space, overrides=overrides)
    log = Exhaustive().search(space, replay, Budget())
    assert sum(not r.ok for r in log.results) == len(overrides)
    assert log.winner.ok and log.winner.config == {"X": 8, "Y": 8}


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s.name)
def test_a_resumed_study_does_not_evaluate_finished_trials_again(strategy):
    space = make_space()
    storage = optuna.storages.InMemoryStorage()
    first = Replay(space)
    log1 = strategy(storage, "resume-me", seed=0).search(space, first, Budget(trials=8))
    measured = {config_key(a, c) for a, c in first.calls[:8]}
    second = Replay(space)
    log2 = strategy(storage, "resume-me", seed=0).search(space, second, Budget(trials=14))
    assert log2.resumed == 8 and log2.evaluated == 6 and len(log2.results) == 14
    assert not measured & {config_key(a, c) for a, c in second.calls[:6]}
    # a third run with the same budget measures nothing at all: the final round is stored too
    third = Replay(space)
    log3 = strategy(storage, "resume-me", seed=0).search(space, third, Budget(trials=14))
    assert third.calls == [] and (log3.winner.key, log3.winner.time) == (log2.winner.key, log2.winner.time)
    assert log1.study_name == log2.study_name == "resume-me"


def test_the_stored_final_round_is_a_small_summary_that_resumes_to_the_same_ranking():
    space = make_space()
    storage = optuna.storages.InMemoryStorage()

    class ManySamples(Replay):
        """Each measurement: 500 samples around the known time (median exactly the known time)."""

        def __call__(self, algorithm, config):
            t = super().__call__(algorithm, config).times[0]
            samples = tuple(t * (1 + (i - 250) / 5000) for i in range(501))
            return Result(algorithm, dict(config), Status.OK, samples, "note")

    first = ManySamples(space)
    log1 = Exhaustive(storage, "trim").search(space, first, Budget(trials=12, top_k=4))
    study = optuna.load_study(study_name="trim", storage=storage)
    stored = study.user_attrs[ROUND_ATTR]
    assert len(stored["results"]) == len(log1.final) >= 4
    assert len(json.dumps(stored)) < 220 * len(log1.final)  # not 501 samples per result
    one = stored["results"][0]
    assert one["samples"]["count"] == 501 and one["time_s"] == one["samples"]["median"] == log1.final[0].time
    assert one["samples"]["min"] == min(log1.final[0].times) and one["message"] == "note"
    # resumed with nothing new to search: the round is read back, not measured, and ranks the same
    again = ManySamples(space)
    log2 = Exhaustive(storage, "trim").search(space, again, Budget(trials=12, top_k=4))
    assert again.calls == []
    assert [(r.key, r.time, r.status, r.message) for r in log2.final] == \
        [(r.key, r.time, r.status, r.message) for r in log1.final]
    assert log2.winner.key == log1.winner.key and log2.winner.time == log1.winner.time
    assert study.user_attrs[ROUND_ATTR] == stored  # read back, its summaries are kept as they were


def test_summaries_rebuild_results_that_rank_the_same_and_full_records_still_read():
    measured = Result("tiled", {"X": 8, "Y": 8}, Status.OK, (3e-3, 1e-3, 2e-3, 7e-3), "")
    wrong = Result("direct", {"W": 1}, Status.WRONG_RESULT, (1e-6,), "12 of 100 elements wrong")
    for result in (measured, wrong, Result("direct", {"W": 2}, Status.COMPILE_ERROR, (), "boom")):
        back = from_summary(json.loads(json.dumps(summarize(result))))
        assert (back.key, back.status, back.message, back.time) == \
            (result.key, result.status, result.message, result.time)
        assert from_summary(result.to_dict()) == result  # a record that kept every sample
    assert summarize(measured)["time_s"] == 2.5e-3 and summarize(wrong)["time_s"] is None


def test_an_interrupted_search_resumes_without_losing_or_repeating_trials():
    space = make_space()
    storage = optuna.storages.InMemoryStorage()
    replay = Replay(space)

    def interrupt_after_four(progress):
        if progress.phase == "search" and progress.done == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        TPE(storage, "stop", progress=interrupt_after_four).search(space, replay, Budget(trials=10))
    study = optuna.load_study(study_name="stop", storage=storage)
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    again = Replay(space)
    log = TPE(storage, "stop").search(space, again, Budget(trials=10))
    assert log.resumed == 4 and log.evaluated == 6
    before = {config_key(a, c) for a, c in replay.calls}
    assert not before & {config_key(a, c) for a, c in again.calls[:6]}


def test_an_interrupted_evaluation_leaves_no_running_trial():
    space = make_space()
    storage = optuna.storages.InMemoryStorage()

    def explode(algorithm, config):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Exhaustive(storage, "boom").search(space, explode, Budget())
    trials = optuna.load_study(study_name="boom", storage=storage).get_trials()
    assert [t.state for t in trials if t.state != optuna.trial.TrialState.WAITING] == \
        [optuna.trial.TrialState.FAIL]
    replay = Replay(space)
    log = Exhaustive(storage, "boom").search(space, replay, Budget(trials=3))
    # the interrupted default is measured again, next to the other one still waiting in the study
    assert sorted(a for a, _ in replay.calls[:2]) == ["direct", "tiled"]
    assert log.resumed == 0


def test_exhaustive_respects_a_trial_budget():
    space = make_space()
    replay = Replay(space)
    log = Exhaustive().search(space, replay, Budget(trials=5, top_k=0))
    assert len(log.results) == 5 and len(replay.calls) == 5


def test_grid_visits_every_config_once_in_a_seeded_order():
    space = make_space()
    a, b = Replay(space), Replay(space)
    Grid(seed=7).search(space, a, Budget(top_k=0))
    Grid(seed=7).search(space, b, Budget(top_k=0))
    assert a.calls == b.calls and len(a.calls) == space.size()
    assert len({config_key(x, c) for x, c in a.calls}) == space.size()


def test_registry_and_budget_validation():
    assert set(STRATEGIES) == {"tpe", "random", "grid", "exhaustive"}
    with pytest.raises(ValueError):
        Budget(trials=0)
    with pytest.raises(ValueError):
        Budget(time_limit=-1)


@pytest.mark.parametrize("strategy", SAMPLED, ids=lambda s: s.name)
def test_batched_search_starts_no_batch_that_would_end_past_the_time_limit(strategy):
    """With jobs > 1 a batch (4 one-second evaluations here) is only started when the recent batches
    say it ends within the limit: a batch begun at 9 s of a 10 s limit once ran to 13 s (on the H200,
    each problem of ``tune --net`` overran its 20 s by 3-4 s, and resnet50 missed its 10 minutes)."""
    space = make_space()
    clock = FakeClock()
    replay = Replay(space, clock=clock)
    log = strategy(seed=0, clock=clock, jobs=4).search(space, replay, Budget(time_limit=10.0, top_k=0))
    assert log.stop_reason == "time_limit"
    assert clock.now <= 10.0            # batches at 0-4 and 4-8 s; one at 8 s would end at 12 s
    assert len(log.results) == 8


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s.name)
def test_configs_asked_to_try_come_right_after_the_defaults_even_past_a_time_limit(strategy):
    base = make_space()
    seeds = (("tiled", {"X": 8, "Y": 4}), ("direct", {"W": 5}))
    space = SearchSpace(base.spaces, base.defaults, seeds)
    replay = Replay(space)
    strategy(seed=1).search(space, replay, Budget(trials=6))
    assert replay.calls[:4] == [("tiled", {"X": 1, "Y": 1}), ("direct", {"W": 1}), *seeds]
    clock = FakeClock()   # every evaluation takes 1 s; the limit expires after the first
    replay = Replay(space, clock=clock)
    log = strategy(seed=1, clock=clock).search(space, replay, Budget(time_limit=1.0, top_k=0))
    assert [c for c in replay.calls][:4] == [("tiled", {"X": 1, "Y": 1}), ("direct", {"W": 1}), *seeds]
    assert log.stop_reason == "time_limit" and len(log.results) == 4
