"""``tunecl tune`` argument handling and output, without OpenCL (the device and tuner are faked)."""

from __future__ import annotations

import json
import types

import pytest

import tunecl.search.tuner as tuner_module
from tunecl import runtime
from tunecl.cli import build_parser, main
from tunecl.cli.tune import print_outcome
from tunecl.problems import AttentionProblem, ConvProblem, GemmProblem
from tunecl.search.result import Result, Status
from tunecl.search.tuner import TuneOutcome


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["tune", *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--gemm", "0,4,4"], "GEMM m must be a positive integer"),
    (["--gemm", "4,-1,4"], "GEMM n must be a positive integer"),
    (["--gemm", "4,4"], "expected M,N,K[,ta,tb[,batch]]"),
    (["--gemm", "4,4,x"], "GEMM sizes must be integers"),
    (["--gemm", "4,4,4,2,0"], "ta must be 0 or 1"),
    (["--gemm", "4,4,4,0,0,0"], "GEMM batch must be a positive integer"),
    (["--conv", "n=1,c=3"], "bad convolution spec: missing h="),
    (["--conv", "n=1,c=3,h=4,w=4,k=2,r=3,groups=2"], "groups=2 must divide"),
    (["--gemm", "4,4,4", "--trials", "0"], "expected a positive integer"),
    (["--gemm", "4,4,4", "--trials", "many"], "expected a positive integer"),
    (["--gemm", "4,4,4", "--time-limit", "-3"], "expected a positive number of seconds"),
    (["--gemm", "4,4,4", "--time-limit", "soon"], "expected seconds"),
    (["--gemm", "4,4,4", "--sampler", "annealing"], "invalid choice: 'annealing'"),
    (["--gemm", "4,4,4", "--patience", "-1"], "expected an integer ≥ 0"),
    (["--gemm", "4,4,4", "--jobs", "0"], "expected a positive integer"),
    (["--gemm", "4,4,4", "--jobs", "two"], "expected a positive integer"),
    (["--gemm", "4,4,4", "--conv", "n=1,c=1,h=1,w=1,k=1,r=1"], "not allowed with argument"),
    (["--gemm", "4,4,4", "--try", "gemm_tiled:MWG"], "expected KEY=VALUE after the algorithm name"),
    (["--gemm", "4,4,4", "--try", "gemm_tiled:MWG=wide"], "MWG must be an integer"),
    (["--gemm", "4,4,4", "--algorithms", "gemm_tiled,gemm_fast"], "unknown algorithm 'gemm_fast'; known: attention_flash, conv_1x1"),
    (["--gemm", "4,4,4", "--algorithms", "gemm_tiled,"], "empty algorithm name in 'gemm_tiled,'"),
    (["--attention", "b=2,h=4,l=128,e=64"], "bad attention spec: missing s="),
    (["--attention", "b=2,h=4,l=128,s=128,e=64,heads=3"], "bad attention spec: unknown attention field(s): heads"),
    (["--attention", "b=0,h=4,l=128,s=128,e=64"], "bad attention spec: attention batch must be a positive integer"),
    (["--attention", "b=1,h=1,l=8,s=8,e=x"], "bad attention spec: e must be an integer"),
    (["--attention", "b=1,h=1,l=8,s=8,e=8,mask=causal"], "bad attention spec: mask must be one of none, bool, float"),
    (["--attention", "b=1,h=1,l=8,s=8,e=8,causal=1,mask=bool"], "a causal attention problem takes no mask"),
    (["--attention", "b=1,h=1,l=8,s=8,e=8,causal=2"], "causal must be 0 or 1"),
    (["--attention", "b=1,h=1,l=8,s=8,e=8,dir=bwd_data"], "direction must be one of fwd, bwd"),
    (["--attention", "b=1,h=1,l=8,s=8,e=8,dtype=bfloat16"], "dtype 'bfloat16' is not supported"),
    (["--attention", "b=1,h=1,l=8,s=8,e=8", "--gemm", "4,4,4"], "not allowed with argument"),
    ([], "one of the arguments --gemm --conv --attention --net is required"),
])
def test_bad_arguments_are_usage_errors_that_name_the_problem(capsys, argv, message):
    err = usage_error(capsys, *argv)
    assert message in err, err
    assert "usage: tunecl tune" in err


def test_an_attention_spec_parses_into_its_problem():
    spec = "b=2,h=4,l=128,s=96,e=64,ev=32,mask=bool,dir=bwd,dtype=float16"
    args = build_parser().parse_args(["tune", "--attention", spec])
    assert args.attention == AttentionProblem(2, 4, 128, 96, 64, 32, mask="bool", direction="bwd", dtype="float16")
    key = "attention:b=1,h=2,l=8,s=8,e=16,ev=16,causal=1,mask=none,dir=fwd,dtype=float32"
    assert build_parser().parse_args(["tune", "--attention", key]).attention.key == key   # a key is a spec too


def test_good_arguments_parse_into_problems():
    args = build_parser().parse_args(["tune", "--gemm", "64,1000,2048,0,1", "--trials", "20",
                                      "--time-limit", "1.5", "--sampler", "random", "--json"])
    assert args.gemm == GemmProblem(64, 1000, 2048, False, True)
    assert (args.trials, args.time_limit, args.sampler, args.json) == (20, 1.5, "random", True)
    assert args.jobs is None  # resolved by run(): 1 for one problem, default_net_jobs() for a net
    args = build_parser().parse_args(["tune", "--gemm", "64,64,64,dtype=float16"])
    assert args.gemm == GemmProblem(64, 64, 64, dtype="float16")
    args = build_parser().parse_args(["tune", "--conv", "conv:n=2,c=8,h=9,w=9,k=4,r=3,pad=1", "--jobs", "3"])
    assert args.conv == ConvProblem(2, 8, 9, 9, 4, 3, 3, padding=1)
    assert args.jobs == 3
    args = build_parser().parse_args(["tune", "--conv", "n=2,c=8,h=9,w=9,k=4,r=3,dir=bwd_weight,dtype=float16"])
    assert args.conv == ConvProblem(2, 8, 9, 9, 4, 3, 3, direction="bwd_weight", dtype="float16")


class _FakeDevice:
    name = "Fake device"
    fingerprint = types.SimpleNamespace(device_type="gpu", label="Fake device")


def test_no_algorithms_is_a_clean_error(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "select_device", lambda selector=None: _FakeDevice())
    monkeypatch.setattr(tuner_module, "registered_algorithms", lambda kind: [])
    code = main(["tune", "--conv", "n=1,c=3,h=8,w=8,k=4,r=3", "--no-progress"])
    assert code == 1
    assert capsys.readouterr().err.strip() == "tunecl: error: no convolution algorithms are available yet"


def test_a_float16_conv_without_its_capability_says_what_it_needs(monkeypatch, capsys):
    """The registered families on a device without capabilities: none computes float16 convolutions,
    and the error names the tensor-core family that would and the probe it needs."""
    monkeypatch.setattr(runtime, "select_device", lambda selector=None: _FakeDevice())
    code = main(["tune", "--conv", "n=1,c=8,h=9,w=9,k=8,r=3,pad=1,dtype=float16", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("tunecl: error: no convolution algorithm applies to conv:n=1,"), err
    assert "dtype=float16 on Fake device" in err, err
    assert err.endswith("; conv_implicit_gemm_mma_f16 needs the mma_f16 capability, which this device lacks"), err


def _outcome() -> TuneOutcome:
    problem = GemmProblem(256, 256, 256)
    default = Result("gemm_tiled", {"MWG": 64, "NWG": 64}, Status.OK, (2e-3, 2.1e-3, 1.9e-3))
    best = Result("gemm_tiled", {"MWG": 128, "NWG": 64}, Status.OK, (1e-3, 1.1e-3, 0.9e-3))
    direct = Result("gemm_direct", {"WGS": 8}, Status.OK, (1.5e-3,))
    return TuneOutcome(
        problem=problem, device="Fake device (driver 1)", winner=best, default=default,
        defaults={"gemm_tiled": default, "gemm_direct": direct},
        per_algorithm={"gemm_tiled": best, "gemm_direct": direct},
        versions={"gemm_tiled": 2, "gemm_direct": 1}, trials=20, resumed=5, invalid=7,
        trials_per_algorithm={"gemm_tiled": 15, "gemm_direct": 5}, statuses={"ok": 19, "compile_error": 1},
        study_name="tunecl:abc:gemm:...:tpe", storage_url="sqlite:////tmp/studies.sqlite", strategy="tpe",
        space_size=None, stop_reason="trials", elapsed=12.5, results=(default, best, direct))


def test_the_summary_names_times_speedup_choice_and_storage(capsys):
    print_outcome(_outcome(), "/tmp/tuning.sqlite")
    out = capsys.readouterr().out
    assert "2 ms  16.78 GFLOP/s  (gemm_tiled default)" in out
    assert "1 ms  33.55 GFLOP/s  (2.00x the default)" in out
    assert "gemm_tiled v2  MWG=128 NWG=64" in out
    assert "20 trials (5 resumed, 7 invalid proposals skipped)" in out
    assert "1 compile error" in out
    assert "gemm_direct" in out and "/tmp/tuning.sqlite" in out


def test_the_outcome_serializes_to_json():
    data = json.loads(json.dumps(_outcome().to_dict()))
    assert data["winner"]["config"] == {"MWG": 128, "NWG": 64}
    assert data["speedup"] == pytest.approx(2.0)
    assert data["per_algorithm"]["gemm_direct"]["time_s"] == pytest.approx(1.5e-3)
    assert data["new_trials"] == 15


def test_a_net_compiles_on_the_cores_it_may_use_at_most_eight(monkeypatch):
    import tunecl.cli.tune as cli_tune
    monkeypatch.setattr(cli_tune.os, "sched_getaffinity", lambda pid: set(range(2)))
    assert cli_tune.default_net_jobs() == 2
    monkeypatch.setattr(cli_tune.os, "sched_getaffinity", lambda pid: set(range(64)))
    assert cli_tune.default_net_jobs() == 8


def test_the_progress_line_is_drawn_only_on_a_terminal():
    """Redirected to a file (a CI log, a GPU job's output), stderr gets the per-problem lines only: the
    progress line's ten redraws a second once made a 10-minute tune --net log 87 KB of carriage returns."""
    import io

    from tunecl.cli.tune import ProgressLine, progress_line

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    args = build_parser().parse_args(["tune", "--gemm", "4,4,4"])
    quiet = build_parser().parse_args(["tune", "--gemm", "4,4,4", "--no-progress"])
    assert progress_line(args, io.StringIO(), 128) is None
    assert isinstance(progress_line(args, Terminal(), 128), ProgressLine)
    assert progress_line(quiet, Terminal(), 128) is None


def test_an_unknown_net_names_the_known_ones_on_lines_of_readable_length(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "select_device", lambda selector=None: _FakeDevice())
    code = main(["tune", "--net", "resnet5", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("tunecl: error: unknown model 'resnet5' (close matches: resnet50, "), err
    lines = err.splitlines()
    assert len(lines) > 5 and max(len(line) for line in lines[1:]) <= 100
    named = {name.strip() for line in lines[1:-1] for name in line.split(",")}
    assert {"alexnet", "resnet18", "resnet50", "vit_b_16"} <= named
    assert lines[-1] == "or give package.module:factory"


def test_the_eta_is_the_mean_time_per_problem_times_the_problems_left():
    from tunecl.cli.eta import Eta, format_duration

    now = [100.0]
    eta = Eta(5, clock=lambda: now[0])
    assert eta.seconds_left() is None and eta.status() == "0 s elapsed"
    now[0] += 30
    eta.finished_one()
    now[0] += 10
    eta.finished_one()
    assert eta.seconds_left() == pytest.approx(60.0)   # 20 s each, 3 left
    assert eta.status() == "40 s elapsed, about 1 min 00 s left"
    limited = Eta(5, total_time_limit=50, clock=lambda: now[0])
    now[0] += 40
    limited.finished_one()
    # no problem starts after 50 s: the 10 s left of the limit and one more problem of 40 s
    assert limited.seconds_left() == pytest.approx(50.0)
    assert [format_duration(s) for s in (0.4, 59.6, 61, 3599, 3600, 7322)] == [
        "0 s", "1 min 00 s", "1 min 01 s", "59 min 59 s", "1 h 00 min", "2 h 02 min"]


def test_time_limit_help_says_defaults_are_measured_past_it(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default config (and each --try config) is measured even past the limit" in text
    assert "a run can take longer than S" in text


@pytest.mark.parametrize("hints, won, expected", [
    (1, True, "warm      started from 1 config of a similar stored problem; the winner is that config\n"),
    (1, False, "warm      started from 1 config of a similar stored problem; the winner is not that config\n"),
    (3, True, "warm      started from 3 configs of similar stored problems; the winner is one of them\n"),
])
def test_the_warm_line_counts_its_configs_in_words(capsys, hints, won, expected):
    import dataclasses

    print_outcome(dataclasses.replace(_outcome(), hints=hints, hint_won=won), "/tmp/tuning.sqlite")
    assert expected in capsys.readouterr().out


@pytest.mark.parametrize("problems, argv, budget", [
    (3, [], (None, 60.0)),                              # 20 s per problem ...
    (45, [], (None, 600.0)),                            # ... at most 10 minutes
    (45, ["--total-time-limit", "90"], (None, 90.0)),   # a total of one's own, shared the same way
    (3, ["--time-limit", "5"], (5.0, None)),            # a per-problem budget is not shared
    (3, ["--trials", "4"], (None, None)),
])
def test_a_nets_problems_share_a_total_budget_unless_one_per_problem_is_given(
        monkeypatch, capsys, tmp_path, problems, argv, budget):
    import tunecl.search.workload as workload_module
    import tunecl.tune as tune_module

    monkeypatch.setattr(runtime, "select_device", lambda selector=None: _FakeDevice())
    monkeypatch.setattr(workload_module, "net_problems",
                        lambda *args, **kwargs: {GemmProblem(8 * (i + 1), 8, 8): 1 for i in range(problems)})
    given = {}

    def tune_workload(workload, device, db, **options):
        given.update(options)
        return []

    monkeypatch.setattr(tune_module, "tune_workload", tune_workload)
    assert main(["tune", "--net", "any", "--no-progress", "--db", str(tmp_path / "db.sqlite"), *argv]) == 0
    assert (given["time_limit"], given["total_time_limit"]) == budget
    err = capsys.readouterr().err
    if budget[1] is not None and "--trials" not in argv:
        assert f"budget: {budget[1]:g} s in all, shared by the problems to tune in proportion to their FLOPs" in err
