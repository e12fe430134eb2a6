"""Host-time results: the rows overhead.py, eager_phases.py and optimizer_step.py record for a measurement,
appended to host.csv and shown by plot_results.py."""

from __future__ import annotations

import csv
import importlib.util
import statistics
from pathlib import Path

import pytest

from tunecl.errors import TuneclError
from tunecl.tools import record

ROOT = Path(__file__).resolve().parents[2]
COMMON = {"device": "Acme GPU", "load": 1.5, "command": "python benchmarks/x.py --record h.csv",
          "commit": "0123456789ab"}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == record.HOST_COLUMNS
        return list(reader)


def test_overhead_rows_per_case_and_measure_with_their_peers():
    measured = {"a + b": {"cpu": [1.0, 3.0, 2.0], "opencl": [30.0, 20.0, 25.0], "host": [12.0, 11.0, 13.0],
                          "thread": [10.5, 10.0, 11.0], "unbatched": [40.0, 41.0, 45.0]},
                "conv2d 3x3 64->64": {"cpu": [100.0], "opencl": [400.0], "host": [50.0], "thread": [45.0],
                                      "unbatched": []}}
    breakdown = {"backend Python (enqueue stubbed)": [5.0, 6.0], "pyopencl call, back to back": [4.0, 4.5]}
    rows = _script("overhead").host_rows(measured, breakdown, {"a + b": 8.0, "conv2d 3x3 64->64": 20.0},
                                         size=16, batch=32, **COMMON)
    got = {(r["case"], r["measure"]): (r["ours_us"], r["ours_min_us"], r["ours_max_us"], r["peer_us"],
                                       r["peer_name"]) for r in rows}
    assert got == {
        ("a + b, 16 floats, launch batch 32", "to completion"): ("25.00", "20.00", "30.00", "2.000", "torch CPU"),
        ("a + b, 16 floats, launch batch 32", "host (enqueue)"): ("12.00", "11.00", "13.00", "8.000",
                                                                  "torch CUDA host"),
        ("a + b, 16 floats, launch batch 32", "thread CPU"): ("10.50", "10.00", "11.00", "", ""),
        ("a + b, 16 floats, launch batch 32", "to completion, unbatched"): ("41.00", "40.00", "45.00", "2.000",
                                                                            "torch CPU"),
        ("conv2d 3x3 64->64, launch batch 32", "to completion"): ("400.0", "400.0", "400.0", "100.0", "torch CPU"),
        ("conv2d 3x3 64->64, launch batch 32", "host (enqueue)"): ("50.00", "50.00", "50.00", "20.00",
                                                                   "torch CUDA host"),
        ("conv2d 3x3 64->64, launch batch 32", "thread CPU"): ("45.00", "45.00", "45.00", "", ""),
        ("a.add_(b) breakdown, 16 floats, launch batch 32", "backend Python (enqueue stubbed)"): (
            "5.500", "5.000", "6.000", "", ""),
        ("a.add_(b) breakdown, 16 floats, launch batch 32", "pyopencl call, back to back"): (
            "4.250", "4.000", "4.500", "", "")}
    assert {(r["benchmark"], r["device"], r["load"], r["command"], r["commit"]) for r in rows} == {
        ("overhead", "Acme GPU", "1.50", COMMON["command"], "0123456789ab")}
    without_cuda = _script("overhead").host_rows(measured, {}, None, size=16, batch=0, **COMMON)
    host = [r for r in without_cuda if r["measure"] == "host (enqueue)"]
    assert [(r["peer_us"], r["peer_name"]) for r in host] == [("", ""), ("", "")]


def test_eager_phases_rows_hold_both_recorded_rounds_per_phase():
    script = _script("eager_phases")
    steps = 3
    wall = [(0.004 + i * 1e-3, 0.010, 0.002, 0.050 + i * 1e-3) for i in range(steps)]   # seconds per phase
    cpu = [(0.003, 0.001, 0.002, 0.006)] * steps
    rounds = {"no sync": (wall, cpu), "sync per phase": (wall[::-1], cpu), "no sync again": ([], [])}
    rows = script.host_rows(rounds, "resnet18 batch 2 image 32 train, launches real", **COMMON)
    assert len(rows) == 2 * 2 * len(script.PHASES)
    by = {(r["case"], r["measure"]): r for r in rows}
    forward = by["resnet18 batch 2 image 32 train, launches real: forward + loss", "no sync: wall"]
    assert (forward["ours_us"], forward["ours_min_us"], forward["ours_max_us"]) == ("5000", "4000", "6000")
    step = by["resnet18 batch 2 image 32 train, launches real: step", "sync per phase: thread CPU"]
    assert (step["ours_us"], step["peer_us"], step["benchmark"]) == ("6000", "", "eager_phases")
    assert not any("again" in r["measure"] for r in rows)


def test_optimizer_step_rows_one_per_printed_figure():
    rows = _script("optimizer_step").host_rows(
        {"host": [4e-4, 5e-4, 4.5e-4], "thread CPU": [6e-4, 6e-4, 7e-4], "wall (synchronized per round)": [0.2]},
        "resnet18 (62 tensors) adam fused, launches real", **COMMON)
    assert [(r["measure"], r["ours_us"], r["ours_min_us"], r["ours_max_us"]) for r in rows] == [
        ("host", "450.0", "400.0", "500.0"), ("thread CPU", "600.0", "600.0", "700.0"),
        ("wall (synchronized per round)", "200000", "200000", "200000")]
    assert {(r["peer_us"], r["peer_name"]) for r in rows} == {("", "")}


def test_optimizer_step_rows_carry_the_cuda_peer_timed_in_the_same_run():
    script = _script("optimizer_step")
    ours = {"host": [4e-4, 5e-4, 4.5e-4], "thread CPU": [6e-4], "wall (synchronized per round)": [0.2]}
    peer = {"host": [1e-4, 3e-4, 2e-4], "thread CPU": [1.5e-4], "wall (synchronized per round)": [0.1]}
    rows = script.host_rows(ours, "resnet18 (62 tensors) adam fused, launches real", peer=peer, **COMMON)
    assert [(r["measure"], r["peer_us"], r["peer_name"]) for r in rows] == [
        ("host", "200.0", "torch CUDA"), ("thread CPU", "150.0", "torch CUDA"),
        ("wall (synchronized per round)", "100000", "torch CUDA")]
    line = script._line("host µs per step", ours["host"], peer["host"])
    assert "torch CUDA    200.0" in line and "ratio 2.25x" in line


def test_host_rows_are_appended_under_one_header_and_shown_latest_per_case(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNECL_CODE_VERSION", "fedcba987654")
    path = tmp_path / "host.csv"

    def row(ours: list[float], **changes):
        values = {"device": "Acme GPU", "benchmark": "optimizer_step", "case": "tiny adam fused, launches real",
                  "measure": "host", "samples_us": ours, "load": 0.25, "command": "python benchmarks/o.py --a 'b c'",
                  "commit": record.code_version()}
        return record.host_row(**{**values, **changes})

    record.append(path, [row([10.0, 12.0])], record.HOST_COLUMNS)
    first = path.read_text()
    record.append(path, [row([7.0, 9.0, 8.0]), row([1.0], device="Other device", peer_us=2.0, peer_name="torch CPU",
                                                   load=float("nan"), case="a, b c")], record.HOST_COLUMNS)
    assert path.read_text().startswith(first)   # appended, not rewritten
    rows = _read(path)
    assert [r["ours_us"] for r in rows] == ["11.00", "8.000", "1.000"]
    assert rows[0]["commit"] == "fedcba987654" and rows[0]["command"] == "python benchmarks/o.py --a 'b c'"
    assert rows[2]["load"] == "" and rows[2]["case"] == "a, b c"
    shown = _script("plot_results").host_markdown(path)
    assert "### Acme GPU" in shown and "### Other device" in shown
    assert "11.00" not in shown   # only the latest row of a case and measure
    (latest,) = [line for line in shown.splitlines() if "tiny adam fused" in line]
    assert "| optimizer_step | tiny adam fused, launches real | host | 8.000 | 7.000-9.000 | - | - | 0.25 |" in latest
    assert "at fedcba987654" in latest and "`python benchmarks/o.py --a 'b c'`" in latest
    (other,) = [line for line in shown.splitlines() if "a, b c" in line]
    assert "| 1.000 | 1.000-1.000 | 2.000 (torch CPU) | 0.50 | - |" in other


def test_a_file_of_the_other_kind_is_refused_and_left_as_it_was(tmp_path):
    results = tmp_path / "results.csv"
    results.write_text(",".join(record.COLUMNS) + "\n")
    with pytest.raises(TuneclError, match="header is not tunecl's host-time columns"):
        record.append(results, [], record.HOST_COLUMNS)
    assert results.read_text() == ",".join(record.COLUMNS) + "\n"
    host = tmp_path / "host.csv"
    host.write_text(",".join(record.HOST_COLUMNS) + "\n")
    with pytest.raises(TuneclError, match="header is not tunecl's results columns"):
        record.check_file(host)
    assert _script("plot_results").HOST_COLUMNS == record.HOST_COLUMNS


def test_a_host_row_needs_samples_and_a_named_positive_peer():
    values = {"device": "d", "benchmark": "b", "case": "c", "measure": "m", "load": None, "command": "x",
              "commit": ""}
    with pytest.raises(TuneclError, match="no usable samples"):
        record.host_row(samples_us=[], **values)
    with pytest.raises(TuneclError, match="no usable samples"):
        record.host_row(samples_us=[1.0, float("nan")], **values)
    with pytest.raises(TuneclError, match="a peer needs"):
        record.host_row(samples_us=[1.0], peer_us=0.0, peer_name="torch CPU", **values)
    with pytest.raises(TuneclError, match="a peer needs"):
        record.host_row(samples_us=[1.0], peer_us=1.0, **values)
    assert record.host_row(samples_us=[3.0, 1.0, 2.0], **values)["ours_us"] == f"{statistics.median([3, 1, 2]):.3f}"


@pytest.mark.parametrize("script", ["overhead", "eager_phases", "optimizer_step"])
def test_a_record_file_of_other_columns_is_a_usage_error_before_anything_runs(script, tmp_path):
    other = tmp_path / "results.csv"
    other.write_text(",".join(record.COLUMNS) + "\n")
    with pytest.raises(SystemExit, match=rf"error: --record {other}: its header is not tunecl's host-time columns"):
        _script(script).main(["--record", str(other)])
