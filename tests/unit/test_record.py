"""Recording results: rows in the results CSV's columns, appended safely, readable by plot_results.py."""

from __future__ import annotations

import datetime as dt
import importlib.util
import re
from pathlib import Path

import pytest

from tunecl.cli import main
from tunecl.cli.bench import result_rows
from tunecl.errors import TuneclError
from tunecl.tools import record

ROOT = Path(__file__).resolve().parents[2]


def _plot_results():
    spec = importlib.util.spec_from_file_location("plot_results", ROOT / "benchmarks" / "plot_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(**changes):
    values = {"device": "Acme GPU", "benchmark": "net", "workload": "tiny batch 2 train", "precision": "fp32",
              "unit": "ms", "ours": 19.4321, "peer": 0.43541, "peer_name": "torch CPU",
              "command": "tunecl bench --net tiny", "commit": "0123456789ab"}
    return record.row(**{**values, **changes})


def test_rows_are_appended_under_one_header_and_read_back_by_plot_results(tmp_path):
    path = tmp_path / "results.csv"
    record.append(path, [_row()])
    record.append(path, [_row(unit="GFLOP/s", ours=900.0, peer=1200.0, benchmark="gemm",
                              command="python benchmarks/gemm.py --shapes 64,64,64")])
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(record.COLUMNS) and len(lines) == 3
    plot = _plot_results()
    assert plot.COLUMNS == record.COLUMNS
    rows = plot.load(path)   # checks every ratio against ours and peer
    assert [r["ratio"] for r in rows] == ["44.63", "1.33"]   # time: ours ÷ peer; throughput: peer ÷ ours
    assert rows[0]["ours"] == "19.43" and rows[0]["peer"] == "0.4354" and rows[0]["commit"] == "0123456789ab"
    assert rows[1]["command"] == "python benchmarks/gemm.py --shapes 64,64,64"   # quoted, kept whole
    assert "at 0123456789ab" in plot.markdown(rows)


def test_a_file_with_other_columns_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "old.csv"
    old = "date,device,benchmark,workload,precision,unit,ours,peer,peer_name,ratio,command\n2026-01-01,x\n"
    path.write_text(old)
    with pytest.raises(TuneclError, match="header is not tunecl's results columns"):
        record.append(path, [_row()])
    assert path.read_text() == old
    with pytest.raises(TuneclError, match="no folder"):
        record.check_file(tmp_path / "missing" / "r.csv")
    with pytest.raises(TuneclError, match="a folder"):
        record.check_file(tmp_path)
    with pytest.raises(TuneclError, match="must be positive"):
        _row(peer=0.0)


def test_a_last_row_without_its_line_end_is_completed_not_joined(tmp_path):
    path = tmp_path / "r.csv"
    record.append(path, [_row()])
    path.write_text(path.read_text().rstrip("\n"))
    record.append(path, [_row(workload="second")])
    assert [r["workload"] for r in _plot_results().load(path)] == ["tiny batch 2 train", "second"]


def test_figures_command_lines_and_the_code_version():
    figures = [record.figure(v) for v in (70.5612, 0.851234, 48332.49, 7.0)]
    assert figures == ["70.56", "0.8512", "48332", "7.000"]
    assert record.command_line("tunecl", ["bench", "--net", "a b", "--shapes", "4,4,4"]) == \
        "tunecl bench --net 'a b' --shapes 4,4,4"
    assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?|tunecl \d+\.\d+\.\d+\S*", record.code_version())


BENCH = {"net": "tiny", "batch": 2, "image_size": 224, "mode": "train", "precision": "tf32",
         "ours": {"device": "opencl:0 Acme GPU", "median_ms": 3.0},
         "peer": {"kind": "cuda", "median_ms": 4.0, "graph": True,
                  "settings": "fp32, TF32 on, cudnn.benchmark off"},
         "peer_cudnn_benchmark": {"kind": "cuda", "median_ms": 2.0, "graph": True,
                                  "settings": "fp32, TF32 on, cudnn.benchmark on"},
         "graph": True, "compiled": False}


def test_a_bench_result_gives_one_row_per_peer():
    rows = result_rows(BENCH, "tunecl bench --net tiny", "abc")
    assert [(r["workload"], r["peer_name"], r["ratio"]) for r in rows] == [
        ("tiny batch 2 train graph", "torch CUDA graph", "0.75"),
        ("tiny batch 2 train graph", "torch CUDA graph (cudnn.benchmark)", "1.50")]
    assert {(r["device"], r["precision"], r["unit"], r["commit"]) for r in rows} == \
        {("Acme GPU", "tf32", "ms", "abc")}


def test_bench_record_is_checked_before_measuring(tmp_path, capsys, monkeypatch):
    from tunecl.tools import bench

    monkeypatch.setattr(bench, "bench_net", lambda *a, **k: pytest.fail("measured"))
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n")
    assert main(["bench", "--net", "tiny", "--record", str(bad)]) == 1
    assert "header is not tunecl's results columns" in capsys.readouterr().err and bad.read_text() == "a,b\n"
    new = tmp_path / "new.csv"
    assert main(["bench", "--net", "tiny", "--compare", "none", "--record", str(new)]) == 1
    assert "--record needs a peer" in capsys.readouterr().err and not new.exists()


def test_bench_record_appends_the_command_as_typed(tmp_path, capsys, monkeypatch):
    from tunecl.tools import bench

    monkeypatch.setattr(bench, "bench_net", lambda *a, **k: {**BENCH, "peer_cudnn_benchmark": None})
    monkeypatch.setattr("tunecl.cli.bench.print_result", lambda result: None)
    path = tmp_path / "r.csv"
    argv = ["bench", "--net", "tiny", "--graph", "--record", str(path)]
    assert main(argv) == 0
    (row,) = _plot_results().load(path)
    assert row["command"] == "tunecl " + " ".join(argv) and row["commit"] == record.code_version()
    assert "recorded 1 row in" in capsys.readouterr().err


def test_the_code_version_can_be_given(monkeypatch):
    """A working tree copied without .git records the commit it was copied at, as given."""
    monkeypatch.setenv("TUNECL_CODE_VERSION", " 1b61f79abcde ")
    assert record.code_version() == "1b61f79abcde"
    monkeypatch.setenv("TUNECL_CODE_VERSION", "")
    assert record.code_version() != ""


def test_a_script_command_names_the_script_and_its_arguments(monkeypatch):
    assert (record.script_command("/x/benchmarks/overhead.py", ["--ops", "10", "--only", "a + b"])
            == "python benchmarks/overhead.py --ops 10 --only 'a + b'")
    monkeypatch.setattr("sys.argv", ["overhead.py", "--layers"])
    assert record.script_command("/x/benchmarks/overhead.py", None) == "python benchmarks/overhead.py --layers"


def test_eager_net_rows_are_shown_next_to_the_dlprimitives_ratio_of_the_same_device_and_workload(tmp_path):
    plot = _plot_results()
    results, theirs = tmp_path / "results.csv", tmp_path / "dlprimitives.csv"
    record.append(results, [
        _row(workload="tiny batch 2 train", ours=3.0, peer=2.0, peer_name="torch CUDA eager", date=dt.date(2026, 1, 1)),
        _row(workload="tiny batch 2 train", ours=2.4, peer=2.0, peer_name="torch CUDA eager", date=dt.date(2026, 1, 2)),
        _row(workload="tiny batch 2 train", ours=2.4, peer=1.6, peer_name="torch CUDA eager (cudnn.benchmark)",
             date=dt.date(2026, 1, 2)),
        _row(workload="tiny batch 2 train graph", ours=2.0, peer=2.0, peer_name="torch CUDA graph"),
        _row(workload="tiny batch 2 inference", ours=1.0, peer=2.0, peer_name="torch CPU")])
    theirs.write_text("device,workload,ratio,source\n"
                      "Acme GPU,tiny batch 2 train,1.5,the predecessor on the same GPU\n"
                      "Acme GPU,tiny batch 2 inference,1.25,same\n"
                      "Other GPU,tiny batch 2 train,9,elsewhere\n")
    found = plot.load_dlprimitives(theirs)
    assert found["Acme GPU", "tiny batch 2 inference"]["source"] == "the predecessor on the same GPU"
    page = plot.dlprimitives_markdown(plot.load(results), found)
    rows = [line for line in page.splitlines() if line.startswith("| Acme GPU")]
    # the latest eager row against plain CUDA eager (as the predecessor was measured, not cudnn.benchmark);
    # the CPU peer's and the graph's rows have no counterpart
    assert rows == ["| Acme GPU | tiny batch 2 train | 1.20 | 1.50 [1] | 2026-01-02 at 0123456789ab |"]
    assert "[1] the predecessor on the same GPU" in page
    theirs.write_text("device,workload,ratio,source\nAcme GPU,tiny batch 2 train,-1,x\n")
    with pytest.raises(SystemExit, match="dlprimitives.csv:2: needs a positive ratio and a source"):
        plot.load_dlprimitives(theirs)
