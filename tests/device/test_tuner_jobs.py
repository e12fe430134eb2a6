"""``jobs > 1``: candidates compiled in worker processes, measured serially in this one."""

from __future__ import annotations

import os

import optuna
import pytest
from tuning_algorithms import SometimesBrokenGemm, gemm_algorithms

from tunecl.db import TuningDB
from tunecl.problems import GemmProblem
from tunecl.search.measure import TimingPolicy
from tunecl.search.result import Status
from tunecl.search.tuner import Tuner
from tunecl.tune import record_outcome

FAST = TimingPolicy(warmup=1, min_time=0.002, min_repeats=3, max_repeats=10, timeout=20.0)
PROBLEM = GemmProblem(33, 17, 29)


@pytest.fixture
def storage(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'studies.sqlite'}"


def test_jobs_compile_in_workers_and_tune_like_one_job(device, tmp_path, storage):
    tuner = Tuner(device, storage, policy=FAST, algorithms=gemm_algorithms(), jobs=2, exhaustive_limit=0)
    outcome = tuner.tune(PROBLEM, trials=6)
    assert outcome.trials == 6 and outcome.resumed == 0
    assert outcome.winner is not None and outcome.winner.ok
    assert outcome.default is not None and outcome.default.ok
    assert outcome.results[0].config == outcome.default.config  # defaults first
    assert tuner.worker_builds == 6  # every evaluated candidate was compiled by a worker first
    with TuningDB(str(tmp_path / "tuning.sqlite")) as db:
        assert record_outcome(db, device.fingerprint, outcome)
        assert db.lookup(device.fingerprint, PROBLEM) is not None
    # every trial was told: none left RUNNING or WAITING-for-nothing
    study = optuna.load_study(study_name=outcome.study_name, storage=storage)
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    # a resumed run measures nothing again
    again = Tuner(device, storage, policy=FAST, algorithms=gemm_algorithms(), jobs=2, exhaustive_limit=0)
    resumed = again.tune(PROBLEM, trials=6)
    assert resumed.resumed == 6 and again.worker_builds == 0


def test_worker_compile_errors_are_compile_errors_and_do_not_stop_the_run(device, storage):
    tuner = Tuner(device, storage, policy=FAST, algorithms=[SometimesBrokenGemm()], jobs=2)
    outcome = tuner.tune(PROBLEM)  # 4 valid configs: exhaustive
    assert outcome.strategy == "exhaustive" and outcome.trials == 4
    assert outcome.statuses == {"ok": 2, "compile_error": 2}
    broken = [r for r in outcome.results if r.config["BROKEN"] == 1]
    assert all(r.status is Status.COMPILE_ERROR and "deliberately broken" in r.message for r in broken)
    assert outcome.winner is not None and outcome.winner.config["BROKEN"] == 0
    assert tuner.worker_builds == 4


def test_jobs_must_be_positive(device):
    with pytest.raises(ValueError, match="jobs"):
        Tuner(device, jobs=0)


def test_jobs_run_in_other_processes(device, storage):
    tuner = Tuner(device, storage, policy=FAST, algorithms=[SometimesBrokenGemm()], jobs=2)
    tuner.tune(PROBLEM, trials=2)
    assert tuner.worker_builds >= 1
    assert tuner.worker_pids and os.getpid() not in tuner.worker_pids


def test_the_build_processes_are_kept_for_the_next_problem(device, storage):
    """tune --net tunes problem after problem: the second reuses the first's worker processes instead of
    starting (and opening the device in) new ones."""
    first = Tuner(device, storage, policy=FAST, algorithms=[SometimesBrokenGemm()], jobs=2)
    first.tune(PROBLEM)  # 4 valid configs, built two at a time
    second = Tuner(device, storage, policy=FAST, algorithms=[SometimesBrokenGemm()], jobs=2)
    second.tune(GemmProblem(PROBLEM.m + 1, PROBLEM.n, PROBLEM.k))
    assert first.worker_builds == second.worker_builds == 4
    assert first.worker_pids & second.worker_pids                 # the same processes built for both
    assert len(first.worker_pids | second.worker_pids) <= 2       # and no others were started
