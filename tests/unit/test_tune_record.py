"""What ``tunecl.tune.record_outcome`` writes into the tuning DB (no OpenCL: outcomes are built by hand)."""

from __future__ import annotations

import pytest

from tunecl.db import TuningDB
from tunecl.problems import GemmProblem
from tunecl.search.result import Result, Status
from tunecl.search.tuner import TuneOutcome
from tunecl.tune import record_outcome

PROBLEM = GemmProblem(64, 48, 32)


def outcome(per_algorithm, defaults, versions) -> TuneOutcome:
    winner = min((r for r in per_algorithm.values()), key=lambda r: r.time, default=None)
    return TuneOutcome(
        problem=PROBLEM, device="Acme", winner=winner, default=next(iter(defaults.values()), None),
        defaults=defaults, per_algorithm=per_algorithm, versions=versions, trials=9, resumed=0, invalid=0,
        trials_per_algorithm={name: 3 for name in versions}, statuses={}, study_name="s", storage_url="u",
        strategy="tpe", space_size=None, stop_reason="trials", elapsed=1.0)


class FakeDB:
    def __init__(self):
        self.rows = []

    def record(self, fingerprint, problem, algorithm, algorithm_version, params, time_s, default_time_s=None,
               trials=0, status="ok", precision="fp32", origin=None):
        self.rows.append({"algorithm": algorithm, "version": algorithm_version, "params": params,
                          "time_s": time_s, "default_time_s": default_time_s, "trials": trials,
                          "status": status, "origin": origin})


def test_each_algorithms_best_is_recorded_with_its_default_time(fingerprint):
    tiled = Result("tiled", {"T": 2}, Status.OK, (1e-3,))
    tiled_default = Result("tiled", {"T": 1}, Status.OK, (3e-3,))
    direct = Result("direct", {"W": 4}, Status.OK, (2e-3,))
    wrong_default = Result("broken", {"X": 1}, Status.WRONG_RESULT, (), "3 of 9 elements wrong")
    fake = FakeDB()
    done = record_outcome(fake, fingerprint(), outcome(
        {"tiled": tiled, "direct": direct},
        {"tiled": tiled_default, "direct": Result("direct", {"W": 1}, Status.COMPILE_ERROR),
         "broken": wrong_default, "slow": Result("slow", {"Y": 1}, Status.TIMEOUT)},
        {"tiled": 3, "direct": 1, "broken": 1, "slow": 1}), origin="tuned on test")
    assert done == ["tiled", "direct", "broken"]
    rows = {r["algorithm"]: r for r in fake.rows}
    assert rows["tiled"] == {"algorithm": "tiled", "version": 3, "params": {"T": 2}, "time_s": 1e-3,
                             "default_time_s": 3e-3, "trials": 3, "status": "ok", "origin": "tuned on test"}
    assert rows["direct"]["default_time_s"] is None  # its default failed to compile: no time
    assert rows["broken"]["status"] == "failed:wrong_result" and rows["broken"]["time_s"] is None
    assert "slow" not in rows  # a timeout is a property of configs, not worth a DB row


def test_the_recorded_winner_is_what_a_lookup_serves(fingerprint, tmp_path):
    fast = Result("tiled", {"T": 2}, Status.OK, (1e-3, 1.2e-3, 0.8e-3))
    slow = Result("direct", {"W": 4}, Status.OK, (2e-3,))
    wrong = Result("broken", {"X": 1}, Status.WRONG_RESULT, (1e-9,))
    fp = fingerprint()
    with TuningDB(str(tmp_path / "t.sqlite")) as db:
        record_outcome(db, fp, outcome({"tiled": fast, "direct": slow},
                                       {"tiled": fast, "direct": slow, "broken": wrong},
                                       {"tiled": 1, "direct": 1, "broken": 1}))
        hit = db.lookup(fp, PROBLEM)
        assert (hit.algorithm, hit.params, hit.time_s) == ("tiled", {"T": 2}, pytest.approx(1e-3))
        statuses = {r.algorithm: r.status for r in db.results(fp, PROBLEM)}
        assert statuses == {"tiled": "ok", "direct": "ok", "broken": "failed:wrong_result"}
