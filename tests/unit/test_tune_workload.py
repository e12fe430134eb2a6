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
