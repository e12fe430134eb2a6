"""Smoke tests of the benchmark scripts: they run end to end on a tiny shape and write what they claim."""

import ast
import importlib.util
import itertools
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tuner_convergence_writes_curves(tmp_path, capsys):
    script = load_script("tuner_convergence")
    space_json = tmp_path / "space.json"
    # a reduced-space optimum to compare against, in gemm_space.py's format
    space_json.write_text(json.dumps({"problem": "gemm:m=32,n=32,k=32,ta=0,tb=0,batch=1,dtype=float32",
                                      "exhaustive_best_s": 1.0, "exhaustive_best_config": {},
                                      "reduced_space": 1, "measured": 1}))
    out = tmp_path / "convergence.json"
    assert script.main(["--shape", "32,32,32", "--trials", "4", "--sampler", "random", "--min-time", "0.001",
                        "--exhaustive-reference", str(space_json), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "early stopping off" in printed and "best-so-far GFLOP/s at trial" in printed
    data = json.loads(out.read_text())
    assert data["early_stopping"] is False and data["exhaustive"]["best_s"] == 1.0
    (run,) = data["runs"]
    assert run["sampler"] == "random" and run["trials"] == 4 and run["stop_reason"] == "trials"
    curve = run["best_so_far_s"]
    assert len(curve) == 4 and curve[-1] == run["final_best_s"] == data["overall_best_s"]
    assert all(a >= b for a, b in itertools.pairwise(curve))  # best-so-far never gets worse
    assert run["within"]["own"]["5%"] <= run["within"]["own"]["1%"] <= 4
    assert run["within"]["exhaustive"] == {"5%": 1, "1%": 1}  # any kernel beats a 1 s "optimum"

    # runs of separate invocations (one sampler each) are compared without measuring again
    both = tmp_path / "both.json"
    assert script.main(["--shape", "32,32,32", "--report-only", "--include", str(out), "--include", str(out),
                        "--json", str(both)]) == 0
    combined = json.loads(both.read_text())
    assert len(combined["runs"]) == 2 and combined["runs"][0]["from"] == str(out)
    assert combined["runs"][0]["within"]["overall"] == run["within"]["overall"]


def test_convergence_points():
    script = load_script("tuner_convergence")
    curve = [None, 10.0, 10.0, 5.2, 5.0]
    assert script.first_within(curve, 5.0, 0.05) == 4  # 5.2 s is within 5% of 5.0 s's speed
    assert script.first_within(curve, 5.0, 0.01) == 5
    assert script.first_within(curve, 1.0, 0.05) is None


def test_conv_benchmark_states_each_precision(tmp_path, capsys, monkeypatch):
    """conv.py at fp32 and tf32 times every layer with its precision; at fp16 it says, per layer, when no
    float16 algorithm applies (PoCL) instead of timing something else."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # tiny_net as a user model
    monkeypatch.setenv("TUNECL_DB", str(tmp_path / "db.sqlite"))
    script = load_script("conv")
    common = ["--net", "tiny_net:build", "--batch", "1", "--image-size", "6", "--trials", "2",
              "--min-time", "0.001", "--storage", f"sqlite:///{tmp_path / 'studies.sqlite'}"]
    for precision in ("fp32", "tf32"):
        out = tmp_path / f"{precision}.json"
        assert script.main([*common, "--precision", precision, "--json", str(out)]) == 0
        data = json.loads(out.read_text())
        assert data["precision"] == precision and data["rows"]
        assert all(r["tuned_precision"] in ("fp32", "tf32") and r["tuned_s"] > 0 for r in data["rows"])
        if precision == "fp32":
            assert all(r["tuned_precision"] == "fp32" for r in data["rows"])
        assert f"precision {precision}" in capsys.readouterr().out
    out = tmp_path / "fp16.json"
    assert script.main([*common, "--precision", "fp16", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    if not any(r.get("tuned_s") for r in rows):   # no float16 conv algorithm on this device
        assert all("float16" in r["problem"] and "no float16 conv algorithm applies" in r["error"] for r in rows)


def test_gemm_benchmark_times_named_defaults(tmp_path, capsys):
    """gemm.py --algorithms times each named algorithm's default (with parameters changed) next to the
    tuned plan, and names an invalid change instead of compiling it."""
    script = load_script("gemm")
    out = tmp_path / "gemm.json"
    assert script.main(["--shapes", "24,40,16", "--trials", "2", "--min-time", "0.001", "--rounds", "1",
                        "--algorithms", "gemm_simt", "gemm_simt:KWG=16,DB=0", "gemm_simt:VW=3",
                        "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    named = {entry["label"]: entry for entry in row["named"]}
    assert named["gemm_simt"]["status"] == "ok" and named["gemm_simt"]["gflops"] > 0
    assert named["gemm_simt"]["vs_tuned"] > 0
    changed = named["gemm_simt:KWG=16,DB=0"]
    assert changed["status"] == "ok" and (changed["config"]["KWG"], changed["config"]["DB"]) == (16, 0)
    invalid = named["gemm_simt:VW=3"]
    assert invalid["gflops"] is None and "VW=3 not in" in invalid["message"]
    assert "gemm_simt default:" in capsys.readouterr().out


def test_gemm_benchmark_fp16_makes_float16_problems(tmp_path, capsys):
    """gemm.py --precision fp16 benchmarks each shape as a float16 GEMM (tuned at fp32, the f16 families'
    precision); where no float16 family applies (PoCL) each row says so and the run still succeeds."""
    script = load_script("gemm")
    out = tmp_path / "gemm.json"
    assert script.main(["--precision", "fp16", "--shapes", "24,40,16", "32,32,32", "--trials", "2",
                        "--min-time", "0.001", "--rounds", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["precision"] == "fp16" and len(data["rows"]) == 2
    for row in data["rows"]:
        assert "dtype=float16" in row["problem"]
        if "error" in row:
            assert "float16 GEMMs need the mma_f16 or wgmma capability" in row["error"]
        else:
            assert row["tuned_precision"] == "fp32" and row["tuned_gflops"] > 0
    assert "precision: fp16" in capsys.readouterr().out


def test_launch_cost_times_each_part_of_a_launch(capsys):
    script = load_script("launch_cost")
    assert script.main(["--calls", "20", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    split = next(i for i, line in enumerate(lines) if line.startswith("enqueue variants"))
    rows = [line.split() for line in lines[1:split] if line.strip() and line.split()[0].isdigit()]
    room = int(script.runtime.select_device(None).cl_device.max_parameter_size)
    assert [row[0] for row in rows] == [str(c) for c in (1, 4, 16, 32, 64, 128, 256) if c * 8 <= room]
    assert all(float(value) > 0 for row in rows for value in row[1:])
    assert any(line.startswith("create_buffer 4 KiB") for line in lines)
    assert any(line.startswith("torch.empty(16) on opencl") for line in lines)
    # each queue kind at 1 and at 2^20 work-items, through pyopencl and straight through the loader
    variants = [line.split() for line in lines[split:] if line.split() and line.split()[0] in ("1", "1048576")]
    assert [(row[0], row[1]) for row in variants] == [("1", "profiling"), ("1", "plain"),
                                                      ("1048576", "profiling"), ("1048576", "plain")]
    assert all(float(value) > 0 for row in variants for value in row[2:])


def test_launch_cost_pointer_table_checks_the_table_and_times_both_launches(capsys):
    script = load_script("launch_cost")
    assert script.main(["--pointer-table", "--calls", "5", "--repeats", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [row[0] for row in rows] == ["8", "32", "64", "128"]
    # every launch by table reached each of its buffers exactly once (PoCL's buffers are host memory)
    assert all(row[-1] == "yes" and float(row[-2]) > 0 for row in rows)


def test_pointwise_benchmark_times_each_op_and_size_next_to_torch(tmp_path, capsys):
    pytest.importorskip("torch")
    script = load_script("pointwise")
    out = tmp_path / "pw.json"
    assert script.main(["--batch", "2", "--iterations", "2", "--sizes", "3,5", "8,9", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["op"], r["shape"]) for r in rows] == [(op, shape) for op in ("relu", "threshold_backward", "add")
                                                     for shape in ([2, 3, 5, 5], [2, 8, 9, 9])]
    assert all(r["tunecl_s"] > 0 and r["peer_s"] > 0 for r in rows)
    assert [r["bytes"] for r in rows[:2]] == [2 * 4 * 150, 2 * 4 * 1296]
    assert "sum" in capsys.readouterr().out


def test_batch_norm_benchmark_times_each_shape_next_to_torch(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():   # (the script runs its CUDA peer before registering the backend, which
        # this process has done: autograd on CUDA then trips an internal assert of torch's engine)
        pytest.skip("the CUDA peer needs a process without the opencl backend (run the script itself)")
    script = load_script("batch_norm")
    out = tmp_path / "bn.json"
    assert script.main(["--batch", "2", "--iterations", "2", "--shapes", "3,5", "8,4", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["shape"] for r in rows] == [[2, 3, 5, 5], [2, 8, 4, 4]]
    assert all(r["tunecl_s"] > 0 and r["peer_s"] > 0 and r["max_abs_error"] < 1e-4 for r in rows)
    assert "sum" in capsys.readouterr().out


def test_overhead_layer_cases_time_each_op_next_to_cpu_torch(tmp_path, capsys):
    script = load_script("overhead")
    record = tmp_path / "host.csv"
    script.main(["--ops", "20", "--repeats", "1", "--layers", "--layer-ops", "3", "--only", "2", "--record",
                 str(record)])
    printed = capsys.readouterr().out
    rows = {line[:24].strip(): line[24:].split() for line in printed.splitlines()
            if line.startswith(("conv2d", "batch_norm"))}
    assert set(rows) == {"conv2d 3x3 64->64", "conv2d 1x1 64->256", "conv2d 3x3 backward"}  # names with "2"
    for values in rows.values():   # (then, with launch batching, the unbatched time)
        cpu, opencl, host, ratio = values[:4]
        assert float(cpu) > 0 and float(host) > 0 and float(opencl) >= float(host) and ratio.endswith("x")
    assert "ops served by the CPU fallback: none" in printed
    recorded = _recorded(record)
    for name, values in rows.items():   # the recorded figures are the printed ones
        case = next(r for r in recorded if r["case"].startswith(name + ",") and r["measure"] == "to completion")
        assert float(case["ours_us"]) == pytest.approx(float(values[1]), rel=1e-3, abs=0.01)
        assert float(case["peer_us"]) == pytest.approx(float(values[0]), rel=1e-3, abs=0.01)
    assert "a.add_(b) breakdown" in recorded[-1]["case"]


def test_overhead_peer_child_times_plain_torch_without_the_backend():
    """The CUDA column's child: the same cases on a plain torch device, tunecl.backend never imported
    (timed here on the CPU, the device every machine has)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(BENCHMARKS / "overhead.py"), "--peer-device", "cpu", "--ops", "5",
                           "--repeats", "1", "--layers", "--layer-ops", "2", "--only", "conv2d 1x1"],
                          check=True, capture_output=True, text=True)
    assert json.loads(done.stdout.splitlines()[-1]).keys() == {"conv2d 1x1 64->256"}
    assert all(v > 0 for v in json.loads(done.stdout.splitlines()[-1]).values())


def _recorded(path: Path) -> list[dict[str, str]]:
    """The rows of a host-time results CSV, checked by plot_results.py's reader."""
    import csv

    assert "## Host time" in load_script("plot_results").host_markdown(path)
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_eager_phases_prints_each_phase_in_three_rounds(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "torch"))   # tiny_nets
    script = load_script("eager_phases")
    record = tmp_path / "host.csv"
    script.main(["--net", "tiny_nets:tiny_cnn", "--batch", "2", "--image-size", "16", "--repeats", "1",
                 "--record", str(record)])
    printed = capsys.readouterr().out
    rounds = [line.split() for line in printed.splitlines() if "step wall" in line]
    assert len(rounds) == 3
    for words in rounds:
        times = [float(words[words.index(name) + 1]) for name in ("forward", "backward", "optimizer")]
        wall = float(words[words.index("wall") + 1])
        assert all(t > 0 for t in times) and wall >= max(times)
    assert "launches real, autograd on the caller thread" in printed
    recorded = {(r["case"].rsplit(": ", 1)[1], r["measure"]): float(r["ours_us"]) for r in _recorded(record)}
    assert len(recorded) == 16
    assert recorded["step", "no sync: wall"] / 1e3 == pytest.approx(float(rounds[0][-1]), abs=0.01)


def test_compile_warmup_prints_each_call_by_phase(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "torch"))   # tiny_nets
    script = load_script("compile_warmup")
    assert script.main(["--net", "tiny_nets:tiny_cnn", "--batch", "2", "--image-size", "16", "--steps", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line.split() for line in lines if line.startswith("call"))
    rows = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in "123"}
    assert sorted(rows) == ["1", "2", "3"] and "dynamo" in header and "captures" in header
    phase = {name: float(rows["1"][2 + k]) for k, name in enumerate(("dynamo", "aot", "rewrites", "compilers",
                                                                     "warmup", "captures", "replays"))}
    assert phase["dynamo"] > 0 and phase["aot"] > 0 and phase["warmup"] > 0 and phase["captures"] == 0
    # the second call captures; the third replays (a tiny net's replay may print as 0.000 s: its count says)
    assert float(rows["2"][2 + 5]) > 0 and float(rows["3"][2 + 5]) == 0 and float(rows["3"][2 + 6]) >= 0
    assert all(float(rows[c][1]) > 0 for c in rows)
    summary = next(line for line in lines if line.startswith("warm-up (the first call to the third"))
    counts = ast.literal_eval(summary.split("; ", 1)[1])
    assert counts["captures"] >= 2 and counts["replays"] >= 2, counts   # forward and backward, at least


def test_attention_benchmark_times_fused_math_and_peer(tmp_path, capsys):
    pytest.importorskip("torch")
    script = load_script("attention")
    out, csv = tmp_path / "attention.json", tmp_path / "results.csv"
    assert script.main(["--seq", "9", "33", "--heads", "2", "--head-dim", "8", "--iterations", "1", "--rounds", "2",
                        "--backward", "--json", str(out), "--record", str(csv)]) == 0
    data = json.loads(out.read_text())
    assert data["backward"] is True and [r["seq"] for r in data["rows"]] == [9, 33]
    assert all(r[k] > 0 for r in data["rows"] for k in ("fused_device_s", "math_device_s", "peer_s"))
    lines = csv.read_text().splitlines()
    assert len(lines) == 1 + 4 and "sdpa b1 h2 L33 d8 fwd+bwd" in lines[-1]
    assert "math/fused" in capsys.readouterr().out


def test_eager_phases_runs_another_devices_shipped_plans_with_launches_stubbed(tmp_path):
    """``--plans-of h200``: the step looks its plans up as the shipped results' H200 (so its host path is
    that device's plan mix); it needs --stub-launches, and a selector naming no shipped device is refused
    with the devices listed."""
    import os
    import subprocess
    import sys

    import tunecl

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1] / "torch"),
                                                       os.environ.get("PYTHONPATH", "")]),
               TUNECL_SHIPPED_DB=str(Path(tunecl.__file__).parent / "tuning_db"))
    base = [sys.executable, str(BENCHMARKS / "eager_phases.py"), "--net", "tiny_nets:tiny_cnn", "--batch", "2",
            "--image-size", "16", "--repeats", "1"]
    done = subprocess.run(base + ["--stub-launches", "--plans-of", "h200"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "launches stubbed, autograd on the caller thread, plans of NVIDIA H200 (driver" in done.stdout
    assert len([line for line in done.stdout.splitlines() if "step wall" in line]) == 3
    worker = subprocess.run(base + ["--stub-launches", "--autograd", "worker"], capture_output=True, text=True, env=env)
    assert worker.returncode == 0 and "launches stubbed, autograd on the worker thread;" in worker.stdout, worker.stderr
    refused = subprocess.run(base + ["--plans-of", "h200"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "need --stub-launches" in refused.stderr
    unknown = subprocess.run(base + ["--stub-launches", "--plans-of", "no such device"], capture_output=True,
                             text=True, env=env)
    assert unknown.returncode == 1 and "names 0 of the shipped results' devices" in unknown.stderr
    assert "NVIDIA H200" in unknown.stderr


def test_eager_phases_counts_one_steps_launches_by_kernel(tmp_path):
    """``--launches``: one step's launches by kernel, their total first; tiny_cnn's two batch norms, with
    channels split as on 132 compute units (one part each at this size), make one launch a direction each;
    refused without --stub-launches."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1] / "torch"),
                                                       os.environ.get("PYTHONPATH", "")]))
    base = [sys.executable, str(BENCHMARKS / "eager_phases.py"), "--net", "tiny_nets:tiny_cnn", "--batch", "2",
            "--image-size", "16", "--repeats", "1", "--launches", "--compute-units", "132"]
    done = subprocess.run(base + ["--stub-launches"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "launches in one step:" in line)
    total = int(lines[at].split(":")[1].split()[0])
    counts = {line.split()[1]: int(line.split()[0]) for line in lines[at + 1:]}
    assert sum(counts.values()) == total > 0
    assert counts["bn_stats_apply"] == counts["bn_backward_reduce_apply"] == 2
    assert "bn_apply" not in counts and "bn_stats" not in counts
    refused = subprocess.run(base, capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "need --stub-launches" in refused.stderr


def test_launch_savings_alternates_on_and_off(tmp_path):
    """Each round runs the step with the savings on and off (in that order, then reversed), one process each,
    and the summary gives each side's median and the on / off ratio."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1] / "torch"),
                                                       os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "launch_savings.py"), "--nets", "tiny_nets:tiny_cnn",
                           "--rounds", "2", "--batch", "2", "--image-size", "16", "--repeats", "2"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    rounds = [line.split() for line in done.stdout.splitlines() if line.strip().startswith("round")]
    assert [(words[1], words[3]) for words in rounds] == [("1", "on"), ("1", "off"), ("2", "off"), ("2", "on")]
    summary = next(line for line in done.stdout.splitlines() if "on / off" in line and "tiny_cnn" in line)
    assert float(summary.split("on / off")[1].split()[0]) > 0


def test_launch_savings_in_process_toggles_the_named_switches(tmp_path):
    """``--in-process`` times blocks of steps with the switches on and off in one process (each round's
    medians and their ratio, then a summary) and leaves the switches on; ``--switches`` names the constants;
    a peer or a malformed switch is refused."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1] / "torch"),
                                                       os.environ.get("PYTHONPATH", "")]))
    base = [sys.executable, str(BENCHMARKS / "launch_savings.py"), "--nets", "tiny_nets:tiny_cnn", "--rounds", "2",
            "--batch", "2", "--image-size", "16", "--repeats", "2", "--in-process"]
    done = subprocess.run(base + ["--switches", "tunecl.backend.direct_calls.ENABLED,tunecl.kernels.ops.norm.ONE_LAUNCH"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    rounds = [line.split() for line in done.stdout.splitlines() if line.strip().startswith("round")]
    assert [words[1] for words in rounds] == ["1", "2"]
    assert all(float(words[words.index("on") + 1]) > 0 and float(words[words.index("off") + 1]) > 0 for words in rounds)
    assert "in one process" in done.stdout and "per round" in done.stdout
    enqueued = next(line for line in done.stdout.splitlines() if "enqueued" in line).split()
    assert float(enqueued[enqueued.index("on") + 1]) > 0 and float(enqueued[enqueued.index("off") + 1]) > 0
    refused = subprocess.run(base + ["--compare", "cuda"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "no peer" in refused.stderr
    malformed = subprocess.run(base + ["--switches", "ONE_LAUNCH"], capture_output=True, text=True, env=env)
    assert malformed.returncode == 2 and "MODULE.NAME" in malformed.stderr
    flushes = subprocess.run(base + ["--switches", "none", "--flush-every", "4"], capture_output=True, text=True,
                             env=env)
    assert flushes.returncode == 0 and "on / off per round" in flushes.stdout, flushes.stderr
    alone = subprocess.run(base[:-1] + ["--flush-every", "4"], capture_output=True, text=True, env=env)
    assert alone.returncode == 2 and "needs --in-process" in alone.stderr


def test_compile_rewrites_compares_each_variant_with_eager(capsys, monkeypatch):
    """compile_rewrites.py: eager against CPU, then each compiled variant against eager (a small net's
    compiled step gives eager's gradients on this device); an unknown variant is refused."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "torch"))   # tiny_nets
    script = load_script("compile_rewrites")
    assert script.main(["--net", "tiny_nets:tiny_cnn", "--batch", "2", "--image-size", "16",
                        "--variants", "all,-fuse_pointwise"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split(" loss ")[0].strip(): line for line in lines if " loss " in line}
    assert sorted(rows) == ["compiled -fuse_pointwise vs eager", "compiled all vs eager", "eager vs CPU"]
    for label in ("compiled all vs eager", "compiled -fuse_pointwise vs eager"):
        differing = rows[label].split("differing ")[1].split(";")[0]
        assert differing.split("/")[0] == "0" and int(differing.split("/")[1]) > 0, rows[label]
    with pytest.raises(SystemExit):
        script.main(["--net", "tiny_nets:tiny_cnn", "--variants", "-no_such_rewrite"])
