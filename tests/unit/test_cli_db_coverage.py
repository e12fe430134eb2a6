"""``tunecl db coverage``: where a net's conv/GEMM plans come from, counted per source, for a device
stored in the DB or the shipped results (no OpenCL device: the problems come from the meta device)."""

from __future__ import annotations

import collections
import dataclasses
import json
import textwrap

import pytest

from tunecl import kernels
from tunecl.cli import db_coverage, main
from tunecl.db import TuningDB, exchange, shipped
from tunecl.problems import ConvProblem, GemmProblem
from tunecl.tools import coverage, plan_sources

# the tiny net below at batch 2 on 8x8 images
CONV1 = ConvProblem(n=2, c=3, h=8, w=8, k=4, r=3, s=3, padding=1)
CONV2 = ConvProblem(n=2, c=4, h=8, w=8, k=4, r=3, s=3, padding=1)
FC = GemmProblem(2, 5, 4, trans_b=True)                 # x @ W.T
FC_DX = GemmProblem(2, 4, 5)                            # dY @ W
FC_DW = GemmProblem(5, 4, 2, trans_a=True)              # dY.T @ X
INFERENCE = {CONV1, CONV2, FC}
TRAINING = INFERENCE | {CONV1.with_direction("bwd_weight"), CONV2.with_direction("bwd_weight"),
                        CONV2.with_direction("bwd_data"), FC_DX, FC_DW}
ARGS = ("db", "coverage", "--net", "tinycov:build", "--batch", "2", "--image-size", "8")


@pytest.fixture
def tiny_net(tmp_path, monkeypatch):
    """``tinycov:build``: two 3x3 convolutions and a linear layer."""
    (tmp_path / "tinycov.py").write_text(textwrap.dedent("""
        import torch

        def build():
            return torch.nn.Sequential(
                torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3, padding=1),
                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 5))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "tinycov:build"


def _fp32(kind):
    return kernels.algorithms_at(kind, {"fp32"})[0]


def _tf32_only(kind):
    return next(a for a in kernels.algorithms_at(kind, {"tf32"}))


def _record(db, fingerprint, problem, algorithm, **options):
    db.record(fingerprint, problem, algorithm.name, options.pop("version", algorithm.version), {"X": 1},
              options.pop("time_s", 1e-4), precision=getattr(algorithm, "precision", "fp32"), **options)


@pytest.fixture
def stored(tmp_path, fingerprint):
    """A user DB and a shipped folder holding results for some of the tiny net's problems (Acme GPU 9000,
    driver 1.0 and 2.0); returns the user DB's path."""
    user, ship = tmp_path / "user.sqlite", tmp_path / "ship.sqlite"
    conv, gemm = _fp32("conv"), _fp32("gemm")
    with TuningDB(str(user)) as db:
        _record(db, fingerprint("1.0"), CONV1, conv)                            # user
        _record(db, fingerprint("2.0"), CONV2, conv)                            # user-other-driver
        _record(db, fingerprint("1.0"), FC_DX, gemm, version=gemm.version + 1)  # another version: not served
        _record(db, fingerprint("1.0"), FC_DW, gemm, status="failed:wrong result", time_s=None)  # failed
        _record(db, fingerprint(name="Other GPU"), FC, gemm)                    # another model
        # TF32 only: served where a request accepts TF32
        _record(db, fingerprint("1.0"), CONV2.with_direction("bwd_weight"), _tf32_only("conv"))
    with TuningDB(str(ship)) as db:
        _record(db, fingerprint("1.0"), FC, gemm)                               # shipped
        _record(db, fingerprint("1.0"), CONV1, conv, time_s=1e-6)               # the user DB comes first
        _record(db, fingerprint("1.0"), dataclasses.replace(CONV2.with_direction("bwd_data"), n=8), conv)
        (tmp_path / "shipped").mkdir()
        (tmp_path / "shipped" / "acme.json").write_text(exchange.dumps(db.export()))
    shipped.clear_cache()
    return user


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _sources(rows, mode, precision):
    (row,) = [r for r in rows if (r["mode"], r["precision"]) == (mode, precision)]
    return row, {p["problem"]: p["source"] for p in row["plans"]}


def test_counts_each_problem_by_where_its_plan_comes_from(capsys, tiny_net, stored):
    code, out, err = _run(capsys, *ARGS, "--db", str(stored), "--device", "gpu 9000", "--precision", "fp32,tf32",
                          "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["device"]["label"] == "Acme GPU 9000 (driver 1.0)"   # of one model's drivers, the first
    assert [(r["mode"], r["precision"]) for r in report["rows"]] == [
        ("inference", "fp32"), ("inference", "tf32"), ("training", "fp32"), ("training", "tf32")]

    row, sources = _sources(report["rows"], "inference", "fp32")
    assert sources == {CONV1.key: "user", CONV2.key: "user-other-driver", FC.key: "shipped"}
    assert (row["problems"], row["calls"]) == (3, 3)

    row, sources = _sources(report["rows"], "training", "fp32")
    assert set(sources) == {p.key for p in TRAINING}
    near = CONV2.with_direction("bwd_data")
    assert sources[near.key] == "shipped-near-batch"
    assert {key: source for key, source in sources.items() if source == "default"} == {
        CONV1.with_direction("bwd_weight").key: "default", CONV2.with_direction("bwd_weight").key: "default",
        FC_DX.key: "default", FC_DW.key: "default"}
    assert row["sources"] == {"user": 1, "user-other-driver": 1, "shipped": 1, "user-near-batch": 0,
                              "user-other-driver-near-batch": 0, "shipped-near-batch": 1, "default": 4}
    (plan,) = [p for p in row["plans"] if p["problem"] == near.key]
    assert plan["stored_problem"] == dataclasses.replace(near, n=8).key and plan["algorithm"] == _fp32("conv").name

    row, sources = _sources(report["rows"], "training", "tf32")
    assert sources[CONV2.with_direction("bwd_weight").key] == "user"
    assert row["sources"]["default"] == 3


def test_the_text_table_and_the_problem_list(capsys, tiny_net, stored, tmp_path):
    code, out, _ = _run(capsys, *ARGS, "--db", str(stored), "--device", "gpu 9000", "--mode", "inference",
                        "--problems")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("device   Acme GPU 9000 (driver 1.0) [")
    assert lines[1] == f"user DB  {stored}"
    assert lines[2] == f"shipped  {tmp_path / 'shipped'} (1 files)"
    assert lines[4].split() == ["net", "batch", "mode", "precision", "problems", "user", "shipped", "user", "near",
                                "batch", "shipped", "near", "batch", "default", "at", "tf32"]
    assert lines[5].split() == ["tinycov:build", "2", "inference", "fp32", "3", "2", "1", "0", "0", "0", "0"]
    listed = {line.split()[0]: line.split()[2] for line in lines if line.startswith(("conv:", "gemm:"))}
    assert listed == {CONV1.key: "user", CONV2.key: "user-other-driver", FC.key: "shipped"}

    code, out, _ = _run(capsys, *ARGS, "--db", str(stored), "--device", "gpu 9000", "--mode", "training",
                        "--precision", "tf32")
    assert code == 0   # the TF32-only result serves a TF32 request, and is counted among those at TF32
    assert out.splitlines()[5].split() == ["tinycov:build", "2", "training", "tf32", "8", "3", "1", "0", "1", "3",
                                           "1"]


def test_the_plan_sources_agree_with_the_lookups_the_backend_makes(tiny_net, stored, fingerprint):
    """Near batch only where the exact chain misses, and the exact chain's order: user before shipped."""
    with TuningDB(str(stored)) as db:
        assert plan_sources.plan_source(db, fingerprint("1.0"), CONV1, "fp32").source == "user"
        hit = db.lookup(fingerprint("1.0"), CONV1, precision="fp32")
        assert plan_sources.plan_source(db, fingerprint("1.0"), CONV1, "fp32").hit == hit
        assert plan_sources.plan_source(db, fingerprint("3.0"), CONV1, "fp32").source == "user-other-driver"
        assert plan_sources.plan_source(db, fingerprint(name="Nobody"), CONV1, "fp32").source == "default"
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        plan_sources.torch_flags("fp16")


def test_a_user_db_that_does_not_exist_is_empty_and_stays_absent(capsys, tiny_net, stored, tmp_path):
    missing = tmp_path / "none" / "tuning.sqlite"
    code, out, _ = _run(capsys, *ARGS, "--db", str(missing), "--device", "gpu 9000", "--mode", "inference", "--json")
    assert code == 0 and not missing.parent.exists()
    (row,) = json.loads(out)["rows"]
    assert {p["problem"]: p["source"] for p in row["plans"]} == {CONV1.key: "shipped", CONV2.key: "default",
                                                                 FC.key: "shipped"}


def test_all_names_the_seed_nets(capsys, stored, monkeypatch):
    from tunecl.search import workload

    extracted, device_types = [], set()
    monkeypatch.setattr(workload, "net_problems",
                        lambda net, batch, size, train, device_type: extracted.append((net, batch, size, train))
                        or device_types.add(device_type) or collections.Counter({FC: 1}))
    code, out, _ = _run(capsys, "db", "coverage", "--net", "all,resnet18", "--batch", "16,64", "--mode", "training",
                        "--db", str(stored), "--device", "gpu 9000", "--json")
    assert code == 0
    assert extracted == [(net, batch, 224, True) for net in coverage.NETS for batch in (16, 64)]
    assert len(coverage.NETS) == 18 and len(json.loads(out)["rows"]) == 36
    assert device_types == {"gpu"}   # the stored device's type: which route its attention trains on


@pytest.mark.parametrize("argv,message", [
    (("--net", "resnet5O"), "unknown model 'resnet5O'"),
    (("--net", "resnet18,hf:nope"), "unknown model 'hf:nope'"),
    (("--net", "no_such_module_xyz:build"), "cannot build 'no_such_module_xyz:build'"),
    (("--net", "resnet18", "--device", "radeon"), ("no device stored in the DB or the shipped results matches "
                                                   "'radeon'; stored devices: Acme GPU 9000 (driver 1.0) [")),
    (("--net", "resnet18", "--device", "gpu"), "'gpu' names 2 device models: "),
])
def test_an_unknown_net_or_device_is_a_usage_error(argv, message, capsys, stored, monkeypatch):
    from tunecl.search import workload

    monkeypatch.setattr(workload, "net_problems", lambda *args, **kwargs: pytest.fail("extracted"))
    code, out, err = _run(capsys, "db", "coverage", *argv, "--db", str(stored))
    assert (code, out) == (2, "")
    assert err.startswith(f"tunecl db coverage: error: {message}")


def test_with_no_stored_device_the_error_says_so(capsys, tmp_path):
    code, out, err = _run(capsys, "db", "coverage", "--net", "resnet18", "--device", "h200", "--db",
                          str(tmp_path / "none.sqlite"))
    assert (code, out) == (2, "")
    assert err == ("tunecl db coverage: error: no device to select with 'h200': neither the DB nor the shipped "
                   "results hold any results\n")


@pytest.mark.parametrize("argv,message", [
    (("--batch", "0"), "expected positive integers, got 0"),
    (("--batch", "16,x"), "expected positive integers, got 'x'"),
    (("--mode", "inference,eval"), "unknown 'eval'; choose from inference, training"),
    (("--precision", "fp16"), "unknown 'fp16'; choose from fp32, tf32"),
    (("--net", "resnet18,"), "empty item in 'resnet18,'"),
])
def test_bad_option_values_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["db", "coverage", "--net", "resnet18", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_modes_the_command_offers_are_the_tools(capsys):
    assert db_coverage.MODES == tuple(plan_sources.MODES)
