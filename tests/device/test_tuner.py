"""The tuner on this machine's OpenCL device (PoCL in CI): verify, time, search, record, resume.

Small problems and short timing keep the file fast on a 2-core CPU; what is checked is behaviour
(statuses, winners, records, resumption), never speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import optuna
import pytest
from tuning_algorithms import NaiveGemm, SometimesBrokenGemm, WrongGemm, ZeroFillPlan, gemm_algorithms

import tunecl.search.tuner as tuner_module
from tunecl.db import TuningDB
from tunecl.kernels import algorithms
from tunecl.problems import ConvProblem, GemmProblem
from tunecl.search.evaluate import evaluate
from tunecl.search.harness import GemmHarness
from tunecl.search.measure import TimingPolicy
from tunecl.search.result import Status
from tunecl.search.tuner import Tuner
from tunecl.tune import tune_problem

HERE = Path(__file__).resolve().parent
FAST = TimingPolicy(warmup=1, min_time=0.002, min_repeats=3, max_repeats=10, timeout=20.0)
PROBLEM = GemmProblem(33, 17, 29)


@pytest.fixture
def storage(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'studies.sqlite'}"


def reference(problem: GemmProblem, seed: int = 5):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((problem.k, problem.m) if problem.trans_a else (problem.m, problem.k))
    b = rng.standard_normal((problem.n, problem.k) if problem.trans_b else (problem.k, problem.n))
    a, b = a.astype(np.float32), b.astype(np.float32)
    expected = (a.T if problem.trans_a else a).astype(np.float64) @ (b.T if problem.trans_b else b)
    return a, b, expected


def test_end_to_end_tune_records_the_winner(device, tmp_path, storage):
    algorithms = gemm_algorithms()
    with TuningDB(str(tmp_path / "tuning.sqlite")) as db:
        outcome = tune_problem(PROBLEM, device, db, trials=6, storage_url=storage, policy=FAST,
                               algorithms=algorithms)
        assert outcome.trials == 6 and outcome.resumed == 0
        winner = outcome.winner
        assert winner is not None and winner.ok and winner.times
        assert outcome.default is not None and outcome.default.ok
        assert winner.time <= outcome.default.time  # the default is in the final round
        hit = db.lookup(device.fingerprint, PROBLEM)
        assert hit is not None
        assert (hit.algorithm, hit.params) == (winner.algorithm, dict(winner.config))
        assert hit.time_s == pytest.approx(winner.time)
        assert hit.default_time_s is not None
    # the stored config really computes the product (independently of the harness)
    algorithm = {a.name: a for a in algorithms}[winner.algorithm]
    plan = algorithm.build(PROBLEM, device, dict(winner.config))
    a, b, expected = reference(PROBLEM)
    abuf, bbuf, cbuf = device.upload(a), device.upload(b), device.alloc(PROBLEM.m * PROBLEM.n * 4)
    plan.run(abuf, bbuf, cbuf)
    got = device.download(cbuf, (PROBLEM.m, PROBLEM.n))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_a_wrong_algorithm_is_recorded_as_wrong_and_never_wins(device, tmp_path, storage):
    base = gemm_algorithms()[0]
    wrong = WrongGemm(base)  # zero-fills C: faster than any correct kernel
    with TuningDB(str(tmp_path / "tuning.sqlite")) as db:
        outcome = tune_problem(PROBLEM, device, db, trials=5, storage_url=storage, policy=FAST,
                               algorithms=[base, wrong])
        assert outcome.defaults[wrong.name].status is Status.WRONG_RESULT
        assert "elements wrong" in outcome.defaults[wrong.name].message
        assert outcome.winner is not None and outcome.winner.algorithm == base.name
        assert wrong.name not in outcome.per_algorithm
        assert outcome.statuses.get("wrong_result", 0) >= 1
        stored = {r.algorithm: r for r in db.results(device.fingerprint, PROBLEM)}
        assert stored[wrong.name].status == "failed:wrong_result"
        assert db.lookup(device.fingerprint, PROBLEM).algorithm == base.name


def test_a_compile_error_does_not_stop_the_run(device, storage):
    broken = SometimesBrokenGemm()  # 4 configs, two of which fail to compile
    outcome = Tuner(device, storage, policy=FAST, algorithms=[broken]).tune(PROBLEM)
    assert outcome.strategy == "exhaustive" and outcome.trials == 4
    assert outcome.statuses == {"ok": 2, "compile_error": 2}
    failed = [r for r in outcome.results if r.status is Status.COMPILE_ERROR]
    assert all(r.config["BROKEN"] == 1 and "deliberately broken" in r.message for r in failed)
    assert outcome.winner.config["BROKEN"] == 0


def test_an_invalid_config_is_rejected_before_compiling(device):
    class Counting(NaiveGemm):
        builds = 0

        def build(self, problem, device, config):
            Counting.builds += 1
            return super().build(problem, device, config)

    result = evaluate(Counting(), PROBLEM, device, {"WX": 16, "WY": 16}, policy=FAST)
    assert result.status is Status.INVALID and "group_size<=64" in result.message
    result = evaluate(Counting(), PROBLEM, device, {"WX": 3, "WY": 1}, policy=FAST)
    assert result.status is Status.INVALID and "WX=3" in result.message
    assert Counting.builds == 0


class _OutOfBoundsPlan(ZeroFillPlan):
    """Computes C correctly, then writes one element just past its end."""

    def __init__(self, inner, *args):
        super().__init__(*args)
        self.inner = inner

    def run(self, a, b, c, *, c_offset=0, wait_for=None, **kwargs):
        import pyopencl as cl

        events = self.inner.run(a, b, c, c_offset=c_offset, wait_for=wait_for, **kwargs)
        end = (c_offset + self.problem.m * self.problem.n * self.problem.batch) * 4
        return events + [cl.enqueue_fill_buffer(self.device.queue, c, np.float32(1), end, 4,
                                                wait_for=events)]


def test_out_of_bounds_writes_and_launch_errors_are_caught(device):
    class OutOfBounds(NaiveGemm):
        name = "test_oob_gemm"

        def build(self, problem, device, config):
            inner = super().build(problem, device, config)
            return _OutOfBoundsPlan(inner, self.name, dict(config), problem, device)

    class BadLaunch(NaiveGemm):
        name = "test_bad_launch_gemm"

        def space(self, problem, device):
            from tunecl.kernels.base import Space
            return Space({"WX": (device.max_work_group_size * 2,), "WY": (1,)})

    result = evaluate(OutOfBounds(), PROBLEM, device, {"WX": 4, "WY": 4}, policy=FAST)
    assert result.status is Status.WRONG_RESULT and "guard region after the output" in result.message
    result = evaluate(BadLaunch(), PROBLEM, device, {"WX": device.max_work_group_size * 2, "WY": 1},
                      policy=FAST)
    assert result.status is Status.LAUNCH_ERROR, result


def test_the_harness_accepts_the_reference_and_rejects_a_one_ulp_per_term_bug(device):
    problem = GemmProblem(7, 5, 257, trans_a=True, trans_b=True, batch=2)
    harness = GemmHarness(problem, device)
    result = evaluate(NaiveGemm(), problem, device, {"WX": 1, "WY": 1}, harness=harness, policy=FAST)
    assert result.ok, result.message
    data = harness._prepare()
    g = harness.guard
    good = np.empty_like(data["c"])
    good.view(np.uint32)[:] = data["c"].view(np.uint32)
    good[g:-g] = data["product"].ravel().astype(np.float32)
    assert harness.compare(good, 1.0, 0.0) is None
    # drop one product term of one element: far beyond rounding, must be caught
    a = data["a"][g:-g].reshape(2, 257, 7)
    b = data["b"][g:-g].reshape(2, 5, 257)
    bad = good.copy()
    bad[g] -= a[0, 100, 0] * b[0, 0, 100]
    assert "1 of 70 elements wrong" in harness.compare(bad, 1.0, 0.0)


_CHILD = textwrap.dedent("""
    import json, os, signal, sys
    sys.path.insert(0, {here!r})
    import tunecl.search.tuner as tuner_module
    from tunecl import runtime
    from tunecl.problems import GemmProblem
    from tunecl.search.measure import TimingPolicy
    from tuning_algorithms import gemm_algorithms

    log_path, storage, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    real, calls = tuner_module.evaluate, [0]

    def counting(algorithm, problem, device, config, **options):
        calls[0] += 1
        if calls[0] == kill_at:  # killed mid-trial: this trial stays RUNNING in the study
            os.kill(os.getpid(), signal.SIGKILL)
        result = real(algorithm, problem, device, config, **options)
        with open(log_path, "a") as log:
            log.write(json.dumps([algorithm.name, config]) + "\\n")
        return result

    tuner_module.evaluate = counting
    policy = TimingPolicy(warmup=1, min_time=0.002, min_repeats=3, max_repeats=10)
    tuner = tuner_module.Tuner(runtime.select_device(), storage, policy=policy, algorithms=gemm_algorithms())
    tuner.tune(GemmProblem(33, 17, 29), trials=7)
""")


def test_a_killed_tune_resumes_without_measuring_finished_trials(device, tmp_path, storage, monkeypatch):
    script, log = tmp_path / "child.py", tmp_path / "evaluated.jsonl"
    script.write_text(_CHILD.format(here=str(HERE)))
    child = subprocess.run([sys.executable, str(script), str(log), storage, "4"], capture_output=True,
                           text=True, timeout=300, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    finished = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
    assert len(finished) == 3

    calls = []
    real = tuner_module.evaluate

    def recording(algorithm, problem, device, config, **options):
        calls.append((algorithm.name, dict(config)))
        return real(algorithm, problem, device, config, **options)

    monkeypatch.setattr(tuner_module, "evaluate", recording)
    outcome = Tuner(device, storage, policy=FAST, algorithms=gemm_algorithms()).tune(PROBLEM, trials=7)
    assert outcome.resumed == 3 and outcome.trials == 7
    assert [(r.algorithm, dict(r.config)) for r in outcome.results[:3]] == [(n, c) for n, c in finished]
    search_calls = calls[:4]
    assert search_calls == [(r.algorithm, dict(r.config)) for r in outcome.results[3:]]
    assert not {json.dumps(c) for c in search_calls} & {json.dumps([n, c]) for n, c in finished}
    assert len(calls) == 4 + len(outcome.final)  # the rest is the re-measurement round
    # the trial the kill interrupted was left RUNNING; the resumed run marked it failed
    trials = optuna.load_study(study_name=outcome.study_name, storage=storage).trials
    states = Counter(t.state.name for t in trials)
    assert states["RUNNING"] == 0 and states["FAIL"] == 1
    assert [t.user_attrs["tunecl"]["phase"] for t in trials if t.state.name == "FAIL"] == ["interrupted"]

    # a third run finds everything done: nothing is measured at all
    calls.clear()
    again = Tuner(device, storage, policy=FAST, algorithms=gemm_algorithms()).tune(PROBLEM, trials=7)
    assert calls == [] and again.resumed == 7
    assert (again.winner.key, again.winner.time) == (outcome.winner.key, outcome.winner.time)
    assert os.path.exists(storage.removeprefix("sqlite:///"))


@pytest.mark.skipif(not algorithms("conv"), reason="no convolution algorithms registered")
def test_a_convolution_tunes_through_the_same_machinery(device, storage):
    problem = ConvProblem.parse("n=2,c=6,h=10,w=9,k=8,r=3,s=3,stride=2,pad=1").with_direction("bwd_data")
    outcome = Tuner(device, storage, policy=FAST).tune(problem, trials=4)
    assert outcome.winner is not None and outcome.winner.ok
    assert outcome.statuses.get("ok", 0) >= 1
    assert set(outcome.per_algorithm) <= set(outcome.versions)


def test_a_config_asked_to_try_is_measured_after_the_defaults_and_bad_ones_are_usage_errors(
        device, storage, tmp_path, monkeypatch, capsys):
    gemm = next(a for a in algorithms("gemm") if a.name == "gemm_tiled")
    default = dict(gemm.default(PROBLEM, device))
    space = gemm.space(PROBLEM, device)
    # a valid config that differs from the default in one parameter
    name, value = next((p, v) for p, values in space.params.items() for v in values
                       if v != default[p] and space.is_valid({**default, p: v}))
    outcome = Tuner(device, storage_url=storage, policy=FAST, seeds=[("gemm_tiled", {name: value})]).tune(
        PROBLEM, trials=5)
    tried = {**default, name: value}
    applicable = len(outcome.defaults)
    assert [dict(r.config) for r in outcome.results[applicable:applicable + 1]] == [tried]
    assert [dict(r.config) for r in outcome.tried] == [tried]
    assert outcome.to_dict()["tried"][0]["config"] == tried
    monkeypatch.setenv("TUNECL_DB", str(tmp_path / "tuning.sqlite"))
    monkeypatch.setenv("TUNECL_STORAGE", str(tmp_path / "studies2.sqlite"))
    from tunecl.cli import main

    for spec, message in [("nosuch", "nosuch is not searched for"),
                          ("gemm_tiled:NOPE=4", "gemm_tiled has no parameter NOPE"),
                          (f"gemm_tiled:{name}=3", "is not a valid config")]:
        assert main(["tune", "--gemm", "33,17,29", "--try", spec, "--trials", "2", "--no-progress"]) == 2
        assert message in capsys.readouterr().err
    assert main(["tune", "--net", "resnet18", "--try", "gemm_tiled", "--no-progress"]) == 2
    assert "--try goes with --gemm, --conv or --attention (one problem)" in capsys.readouterr().err


def test_a_search_starts_from_the_winners_of_similar_stored_problems(device, tmp_path, storage, capsys,
                                                                     monkeypatch):
    """A config stored for a similar problem is measured right after the defaults (its nearest valid
    config where it does not fit), given a warm start; --warm-start 0 (the default) turns that off."""
    gemm = next(a for a in algorithms("gemm") if a.name == "gemm_tiled")
    near = GemmProblem(66, 17, 29)   # PROBLEM with twice the M
    default, space = dict(gemm.default(near, device)), gemm.space(near, device)
    name, value = next((p, v) for p, values in space.params.items() for v in values
                       if v != default[p] and space.is_valid({**default, p: v}))
    stored = {**default, name: value}
    with TuningDB(str(tmp_path / "tuning.sqlite")) as db:
        db.record(device.fingerprint, PROBLEM, gemm.name, gemm.version, stored, 1e-3)
        outcome = tune_problem(near, device, db, trials=len(algorithms("gemm")) + 2, storage_url=storage,
                               policy=FAST, warm_start=6)
    assert outcome.hints == 1
    assert [(r.algorithm, dict(r.config)) for r in outcome.results[len(outcome.defaults):][:1]] == \
        [("gemm_tiled", stored)]
    assert outcome.hint_won == ((outcome.winner.algorithm, dict(outcome.winner.config)) == ("gemm_tiled", stored))
    assert outcome.to_dict()["hints"] == 1
    monkeypatch.setenv("TUNECL_DB", str(tmp_path / "tuning.sqlite"))
    monkeypatch.setenv("TUNECL_STORAGE", str(tmp_path / "studies2.sqlite"))
    from tunecl.cli import main

    assert main(["tune", "--gemm", "66,17,29", "--trials", "3", "--warm-start", "0", "--no-progress",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hints"] == 0
