"""gemm.py and conv.py --record: rows in the results CSV's columns that plot_results.py reads back."""

from pathlib import Path

import pytest
from test_benchmark_scripts import load_script


def test_gemm_and_conv_record_their_results(tmp_path, capsys, monkeypatch):
    """gemm.py measures for real; conv.py's layers are stood in for, its sums recorded as measured."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # tiny_net as a user model
    monkeypatch.setenv("TUNECL_DB", str(tmp_path / "db.sqlite"))
    path = tmp_path / "results.csv"
    storage = ["--storage", f"sqlite:///{tmp_path / 'studies.sqlite'}"]
    gemm = ["--shapes", "24,40,16", "--trials", "2", "--min-time", "0.001", "--rounds", "1", "--no-progress",
            *storage, "--record", str(path)]
    assert load_script("gemm").main(gemm) == 0
    script = load_script("conv")

    def measured(device, db, problem, args, policy):   # the layers' timing is conv.py's own test's part
        return {"problem": problem.key, "direction": problem.direction, "default_s": 2e-3, "tuned_s": 1e-3,
                "peer_s": 4e-3, "peer": "torch CPU", "tuned_algorithm": "stand-in", "tuned_precision": "fp32"}

    monkeypatch.setattr(script, "bench_problem", measured)
    conv = ["--net", "tiny_net:build", "--batch", "1", "--image-size", "6", "--record", str(path)]
    assert script.main(conv) == 0
    rows = load_script("plot_results").load(path)   # one header; every ratio consistent with ours and peer
    assert [(r["benchmark"], r["workload"], r["unit"]) for r in rows] == [
        ("gemm", "24x40x16", "GFLOP/s"), ("conv", "tiny_net:build batch 1 image 6 fwd (sum of layers)", "ms")]
    assert rows[0]["command"] == "python benchmarks/gemm.py " + " ".join(gemm)
    assert rows[1]["command"] == "python benchmarks/conv.py " + " ".join(conv)
    assert all(r["commit"] and r["peer_name"] and float(r["ours"]) > 0 for r in rows)
    assert rows[1]["ratio"] == "0.25" and rows[1]["peer_name"] == "torch CPU"
    assert "recorded 1 rows in" in capsys.readouterr().err


def test_validate_nets_records_one_row_per_net_that_plot_results_shows(tmp_path, monkeypatch):
    """validate_nets.py --compile --record: the validate runs are stood in for (tunecl validate's own tests
    run it); each net's row holds its verdicts, counts by criterion and the command that reproduces it."""
    script = load_script("validate_nets")
    commands = []

    def report(train: bool, passed: bool) -> dict:
        checks = [{"passed": True, "passed_by": "fp32", "max_rel": 2e-6}]
        if train:
            checks += [{"passed": True, "passed_by": "own gradient", "max_rel": 0.5},
                       {"passed": passed, "passed_by": "fp64" if passed else "", "max_rel": 3.0}]
        return {"device": "opencl:0 Some Device", "passed": passed, "checks": checks,
                "fallback_ops": {}, "seconds": {"cpu": 1.0, "device": 2.0}}

    def run(net, args, image, train):
        commands.append((net, image, train, args.compile))
        return report(train, passed=net != "googlenet"), 1.0, ""

    monkeypatch.setattr(script, "run", run)
    monkeypatch.setenv("TUNECL_SHIPPED_DB", "")
    path = tmp_path / "validate.csv"
    assert script.main(["--nets", "alexnet", "googlenet", "--compile", "--record", str(path)]) == 1
    assert commands == [("alexnet", 63, False, True), ("alexnet", 63, True, True),
                        ("googlenet", 32, False, True), ("googlenet", 32, True, True)]
    import csv

    with path.open(newline="") as fh:
        assert tuple(next(csv.reader(fh))) == script.COLUMNS
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["net"], r["compiled"], r["eval_passed"], r["train_passed"], r["failed"]) for r in rows] == [
        ("alexnet", "True", "True", "True", "0"), ("googlenet", "True", "False", "False", "1")]
    assert rows[0]["device"] == "Some Device" and rows[0]["train_checks"] == "3"
    assert (rows[0]["passed_by_fp32"], rows[0]["passed_by_own"], rows[0]["passed_by_fp64"]) == ("1", "1", "1")
    assert rows[0]["command"] == ("TUNECL_SHIPPED_DB= python benchmarks/validate_nets.py --nets alexnet --batch 2 "
                                  "--image-size 63 --seed 0 --compile")
    shown = load_script("plot_results").validated_markdown(path)
    assert "| Some Device | alexnet | compiled | 2 | 63 | pass | pass | 3 | 1 / 1 / 0 / 1 / 0 / 0 |" in shown
    assert "| googlenet | compiled | 2 | 32 | FAIL | FAIL |" in shown
    path.write_text("other,columns\n")
    with pytest.raises(SystemExit, match="header is not validate.csv's columns"):
        script.main(["--nets", "alexnet", "--record", str(path)])
    assert path.read_text() == "other,columns\n"
