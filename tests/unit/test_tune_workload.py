"""``tunecl.tune.tune_workload`` on problems the DB already holds (no OpenCL: nothing is tuned)."""

from __future__ import annotations

import io
import types

import pytest

import tunecl.tune as tune_module
from tunecl.cli.tune import print_net_summary
from tunecl.db import TuningDB
from tunecl.problems import GemmProblem
from tunecl.tune import tune_workload

PROBLEM = GemmProblem(64, 48, 32)
# in preference order: the first is the one a lookup miss runs, so its default is the untuned baseline
FIRST = types.SimpleNamespace(name="gemm_first", version=3, kind="gemm", applies=lambda problem, device: True)
FAST = types.SimpleNamespace(name="gemm_fast", version=1, kind="gemm", applies=lambda problem, device: True)


class NoClaims:
    """Claims of a single worker: nobody else holds a problem."""

    def holder(self, key):
        return None

    def claim(self, key):
        pass

    def beat(self, key):
        pass

    def release(self, key):
        pass


@pytest.fixture
def device(monkeypatch, fingerprint):
    monkeypatch.setattr(tune_module, "algorithms", lambda kind: [FIRST, FAST])
    return types.SimpleNamespace(fingerprint=fingerprint())


def skipped_row(db, device, **options):
    rows = tune_workload({PROBLEM: 2}, device, db, claims=NoClaims(), **options)
    assert [row.status for row in rows] == ["skipped"]
    return rows[0]


def test_a_skipped_row_has_the_stored_baseline_default_and_the_fastest_time(tmp_path, device):
    with TuningDB(str(tmp_path / "db.sqlite")) as db:
        db.record(device.fingerprint, PROBLEM, FIRST.name, FIRST.version, {"A": 1}, 3e-3, default_time_s=5e-3)
        # the winner's own default is its tuned config: that is not the baseline of the problem
        db.record(device.fingerprint, PROBLEM, FAST.name, FAST.version, {}, 1e-3, default_time_s=1e-3)
        row = skipped_row(db, device)
        assert (row.algorithm, row.default_s, row.tuned_s, row.speedup) == (FAST.name, 5e-3, 1e-3, 5.0)
        out = io.StringIO()
        print_net_summary([row], "db.sqlite", out=out)
        cells = out.getvalue().splitlines()[1].split()
        assert cells[3:] == [FAST.name, "5.0", "1.0", "5.00x"]
        # a search restricted to one algorithm has that algorithm's default as its baseline
        row = skipped_row(db, device, algorithms=[FAST])
        assert (row.default_s, row.tuned_s) == (1e-3, 1e-3)


def test_a_skipped_row_without_a_stored_baseline_shows_no_default(tmp_path, device):
    with TuningDB(str(tmp_path / "db.sqlite")) as db:
        db.record(device.fingerprint, PROBLEM, FIRST.name, FIRST.version, {"A": 1}, None,
                  status="failed:wrong_result")
        db.record(device.fingerprint, PROBLEM, FAST.name, FAST.version, {}, 1e-3, default_time_s=1e-3)
        row = skipped_row(db, device)
        assert (row.algorithm, row.default_s, row.tuned_s, row.speedup) == (FAST.name, None, 1e-3, None)
        out = io.StringIO()
        print_net_summary([row], "db.sqlite", out=out)
        assert out.getvalue().splitlines()[1].split()[3:] == [FAST.name, "-", "1.0", "-"]


class Clock:
    """``tunecl.tune``'s clock in a test: it moves only when a fake search runs."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


@pytest.fixture
def searches(monkeypatch):
    """Fake searches: each records the time limit it was given and takes ``took[key]`` seconds (default: its
    limit, plus 1 s of defaults and final round past it)."""
    clock, calls, took = Clock(), [], {}

    def tune_problem(problem, device, db, *, trials=None, time_limit=None, precision=None, **options):
        calls.append((problem.key, time_limit))
        clock.now += took.get(problem.key, (time_limit or 0) + 1.0)
        winner = types.SimpleNamespace(algorithm=FIRST.name, time=1e-3)
        return types.SimpleNamespace(winner=winner, default=types.SimpleNamespace(ok=True, time=2e-3))

    monkeypatch.setattr(tune_module, "tune_problem", tune_problem)
    monkeypatch.setattr(tune_module, "time", clock)
    return types.SimpleNamespace(calls=calls, took=took, clock=clock)


BIG, MID, SMALL = GemmProblem(256, 256, 256), GemmProblem(128, 128, 128), GemmProblem(64, 64, 64)


def test_a_total_time_limit_is_shared_by_the_problems_flops(tmp_path, device, searches):
    """Shares of 64 : 16 : 1 (FLOPs x count); every search runs 1 s past its limit, as the fake does."""
    with TuningDB(str(tmp_path / "db.sqlite")) as db:
        rows = tune_workload({SMALL: 1, BIG: 1, MID: 2}, device, db, claims=NoClaims(), total_time_limit=162.0)
    limits = dict(searches.calls)
    assert [key for key, _ in searches.calls] == [BIG.key, MID.key, SMALL.key]   # largest share first
    # before any problem ran, each of the 3 is expected to run MIN_SHARE_S past its limit
    assert limits[BIG.key] == pytest.approx((162.0 - 3 * tune_module.MIN_SHARE_S) * 64 / 81)
    # then by the mean overrun so far (1 s), from what is left
    left = 162.0 - (limits[BIG.key] + 1.0)
    assert limits[MID.key] == pytest.approx((left - 2 * 1.0) * 16 / 17)
    left -= limits[MID.key] + 1.0
    assert limits[SMALL.key] == pytest.approx(max(tune_module.MIN_SHARE_S, left - 1.0))
    assert [row.status for row in rows] == ["tuned"] * 3
    assert searches.clock.now - 1000.0 == pytest.approx(162.0)


def test_a_shared_budget_gives_each_problem_its_minimum_and_stops_at_the_total(tmp_path, device, searches):
    searches.took[BIG.key] = 200.0   # ran far over: nothing is left for the others
    with TuningDB(str(tmp_path / "db.sqlite")) as db:
        rows = tune_workload({BIG: 1, MID: 1}, device, db, claims=NoClaims(), total_time_limit=100.0)
    assert [key for key, _ in searches.calls] == [BIG.key]
    assert {row.problem.key: row.status for row in rows} == {BIG.key: "tuned", MID.key: "not run"}
    searches.calls.clear()
    searches.took[BIG.key] = 99.5    # half a second left: the next one still gets the minimum
    with TuningDB(str(tmp_path / "db2.sqlite")) as db:
        tune_workload({BIG: 1, MID: 1}, device, db, claims=NoClaims(), total_time_limit=100.0)
    assert dict(searches.calls)[MID.key] == tune_module.MIN_SHARE_S


def test_a_stored_problem_takes_no_share_and_explicit_budgets_are_not_shared(tmp_path, device, searches):
    with TuningDB(str(tmp_path / "db.sqlite")) as db:
        for algorithm in (FIRST, FAST):
            db.record(device.fingerprint, BIG, algorithm.name, algorithm.version, {}, 1e-3, default_time_s=2e-3)
        rows = tune_workload({BIG: 1, MID: 1, SMALL: 1}, device, db, claims=NoClaims(), total_time_limit=34.0)
        assert [row.status for row in rows] == ["skipped", "tuned", "tuned"]
        # MID 8 : SMALL 1 (BIG's 64 not counted), each expected to run MIN_SHARE_S past its limit
        assert dict(searches.calls)[MID.key] == pytest.approx((34.0 - 2 * tune_module.MIN_SHARE_S) * 8 / 9)
        searches.calls.clear()
        tune_workload({MID: 1, SMALL: 1}, device, db, claims=NoClaims(), total_time_limit=34.0, time_limit=3.0,
                      retune=True)
        assert [limit for _, limit in searches.calls] == [3.0, 3.0]
        searches.calls.clear()
        tune_workload({MID: 1}, device, db, claims=NoClaims(), total_time_limit=34.0, trials=5, retune=True)
        assert searches.calls == [(MID.key, None)]
