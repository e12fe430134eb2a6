"""gemm.py and conv.py --record: rows in the results CSV's columns that plot_results.py reads back."""

from pathlib import Path

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
