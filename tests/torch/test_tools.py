"""``tunecl validate`` and ``tunecl bench`` on a tiny conv net (their library functions and the CLI)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import warnings
from pathlib import Path

import pytest
import tiny_nets
import torch
from torch import nn

import tunecl.backend  # noqa: F401
from tunecl import config
from tunecl.cli import build_parser, main
from tunecl.errors import DeviceNotFoundError, TuneclError
from tunecl.tools.bench import bench_net, measure_in_subprocess
from tunecl.tools.tolerances import Tolerances
from tunecl.tools.validate import validate_net

TINY = "tiny_nets:tiny_cnn"   # tests/torch/tiny_nets.py, on sys.path like every module of this folder
OFF = "tiny_nets:off_on_device"
BESSEL = "tiny_nets:bessel_net"
DROPOUT = "tiny_nets:dropout_cnn"
SMALL = {"batch": 2, "image_size": 16}


# -- validate ----------------------------------------------------------------------------------------
def test_validate_tiny_net_inference_passes():
    report = validate_net(TINY, **SMALL)
    assert report.passed and report.exit_code == 0, report.failures or report.error
    assert [c.kind for c in report.checks] == ["output"]
    assert report.checks[0].max_rel <= Tolerances().output


def test_validate_tiny_net_train_step_passes_and_checks_every_parameter(capsys):
    assert main(["validate", "--net", TINY, "--train", "--batch", "2", "--image-size", "16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["error"] is None
    names = [n for n, _ in tiny_nets.tiny_cnn().named_parameters()]
    kinds = [(c["kind"], c["name"]) for c in data["checks"]]
    assert kinds == [("output", "output"), ("loss", "loss")] + [("grad", n) for n in names] \
        + [("param", n) for n in names]
    assert all(c["max_abs"] is not None for c in data["checks"])
    # every tensor is also measured against the float64 run, and says which criterion passed it
    assert all(c["fp64_error"] is not None and c["cpu_fp64_error"] is not None for c in data["checks"])
    assert {c["passed_by"] for c in data["checks"]} <= {"fp32", "fp64", "zero", "own output", "own gradient"}
    assert set(data["seconds"]) == {"cpu", "fp64", "device"}
    assert data["tolerances"]["multiplier"] == Tolerances().multiplier


def test_validate_draws_the_same_dropout_and_stochastic_depth_masks_in_all_three_runs():
    """Masks that differed would put the device O(1) off both references (p = 0.5 everywhere)."""
    report = validate_net(DROPOUT, train=True, **SMALL)
    assert report.passed, report.failures or report.error
    assert all(c.fp64_error < 1e-5 for c in report.checks if c.kind in ("output", "grad"))


def test_validate_compiled_compares_the_replayed_training_step_masks_included():
    """``--compile``: the model and its Adam step through torch.compile, the replay compared; dropout and
    stochastic depth draw the masks the CPU runs draw."""
    report = validate_net(DROPOUT, train=True, compiled=True, **SMALL)
    assert report.passed, report.failures or report.error
    assert all(c.fp64_error < 1e-5 for c in report.checks if c.kind in ("output", "grad"))
    stats = report.compile_stats
    assert stats["captures"] == 3 and stats["replays"] == 3, stats   # forward, backward, Adam step
    assert not any(key.startswith("eager") for key in stats), stats


def test_the_compiled_runs_restart_from_a_state_that_keeps_its_version_metadata():
    """Between its compiled calls validate loads the starting state back; modules that check the version
    of a state they load (torchvision's MNASNet) refuse one without its ``_metadata``."""
    from tunecl.tools.validate import _cloned_state

    class Versioned(nn.Linear):
        _version = 2

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
            if local_metadata.get("version") != 2:
                raise ValueError(f"version should be 2 instead of {local_metadata.get('version')}")
            super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)

    model = nn.Sequential(Versioned(3, 2)).to("opencl")
    start = _cloned_state(model)
    with torch.no_grad():
        model[0].weight.add_(1)
    model.load_state_dict(start)
    torch.testing.assert_close(model[0].weight.cpu(), start["0.weight"].cpu())
    assert start["0.weight"].data_ptr() != model[0].weight.data_ptr()   # a copy, not the live tensor
    with pytest.raises(ValueError, match="version should be 2"):
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})


def test_validate_compiled_inference_from_the_command_line(capsys):
    assert main(["validate", "--net", TINY, "--batch", "2", "--image-size", "16", "--compile"]) == 0
    out = capsys.readouterr().out
    assert "compiled (torch.compile backend='tunecl', the replay compared)" in out
    assert "compile   captures 1, replays 1" in out and "PASS: 1 of 1" in out


def test_validate_fails_with_exit_code_1_when_the_device_is_off(capsys):
    report = validate_net(OFF, **SMALL)
    assert not report.passed and report.exit_code == 1
    assert report.failures[0].kind == "output" and report.failures[0].max_rel > 5e-3
    assert report.failures[0].fp64_ratio > 1000 and report.failures[0].passed_by == ""

    assert main(["validate", "--net", OFF, "--train", "--batch", "2",
                 "--image-size", "16"]) == 1
    out = capsys.readouterr().out
    assert "FAIL:" in out and "checks over tolerance: output, grad" in out
    assert "tolerances: output rel <= 0.001" in out and "or err vs float64 <= 8 x CPU float32's" in out


def test_locate_names_the_layer_that_is_off_first(capsys):
    """--locate lists the first module outputs the device gets further from float64 than CPU float32 does:
    the broken layer's, then those after it (errors propagate); with --train the gradients too. A correct net
    has none, and exits 0."""
    from tunecl.tools.locate import MODEL, locate

    found = locate("tiny_nets:off_inside", train=True, **SMALL)
    outputs = [d.module for d in found.departures if d.phase == "output"]
    # the layer, and the conv after it; the batch norm after that normalises the 1% away
    assert outputs == ["4", "5"] and found.departures[0].kind == "_OffInside" and MODEL not in outputs
    assert all(d.device_error > 8 * d.cpu_error for d in found.departures)
    assert found.outputs == found.gradients == 12 and found.exit_code == 1   # 11 modules and the model
    assert any(d.phase == "gradient" for d in found.departures)

    clean = locate(TINY, **SMALL)
    assert not clean.departures and clean.outputs == 11 and clean.gradients == 0 and clean.exit_code == 0

    assert main(["validate", "--net", "tiny_nets:off_inside", "--batch", "2", "--image-size", "16",
                 "--locate"]) == 1
    out = capsys.readouterr().out
    first = next(line for line in out.splitlines() if line.startswith("output"))
    assert first.split()[:3] == ["output", "4", "_OffInside"] and "DEPARTS:" in out
    assert main(["validate", "--net", TINY, "--batch", "2", "--image-size", "16", "--locate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["departures"] == []
    assert main(["validate", "--net", TINY, "--locate", "--compile"]) == 1
    assert "--locate runs the model eagerly" in capsys.readouterr().err


def test_validate_help_states_the_default_tolerances():
    from tunecl.cli.validate import TOLERANCES_HELP

    tol = Tolerances()
    assert tol.floor == 1e-6 and f"err(opencl) <= {tol.multiplier:g} x err(cpu) + 1e-6," in TOLERANCES_HELP
    assert (tol.output, tol.loss, tol.grad, tol.param) == (1e-3, 1e-3, 1e-2, 1e-4)
    for line in ("output               <= 1e-3", "loss                 <= 1e-3",
                 "gradients            <= 1e-2", "parameters after     <= 1e-4"):
        assert line in TOLERANCES_HELP
    assert tol.loss_own == 1e-5 and "own output to 1e-5 rel" in TOLERANCES_HELP


def test_validate_reports_a_forbidden_fallback_as_a_failure_naming_the_op(capsys):
    with config.override(fallback="error"):
        assert main(["validate", "--net", BESSEL, "--batch", "2", "--image-size", "4"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: the device run raised (op aten::special_bessel_j0" in out
    with config.override(fallback="silent"):
        report = validate_net(BESSEL, batch=2, image_size=4)
    assert report.passed
    assert report.fallback_ops and all("bessel_j0" in op for op in report.fallback_ops)


def test_a_missing_adam_step_fails_while_sign_flips_of_tiny_gradients_pass():
    from tunecl.tools.step_checks import check_run
    from tunecl.tools.tolerances import ADAM_LR

    p = torch.randn(100)
    g = torch.randn(100) * 1e-2
    g[:3] = torch.tensor([1e-9, -1e-9, 0.0])    # rounding noise: its sign may differ between devices
    g_dev = g.clone()
    g_dev[:3] = -g[:3]

    def run(grad, step=True):
        return {"output": torch.ones(2), "loss": torch.tensor(1.0), "grads": {"p": grad},
                "params": {"p": p - ADAM_LR * grad.sign() * step}}

    ok = check_run(run(g), run(g_dev), Tolerances())
    assert all(c.passed for c in ok), ok
    assert ok[-1].note.startswith("3/100 with gradients of other signs")
    missing = check_run(run(g), run(g_dev, step=False), Tolerances())
    assert [c.kind for c in missing if not c.passed] == ["param"]


def test_the_fp64_rule_passes_a_device_as_far_from_float64_as_the_cpu_and_fails_a_worse_one():
    """An ill-conditioned tensor: CPU float32 is 30% off float64, beyond any fixed tolerance."""
    from tunecl.tools.step_checks import check_run

    tol = Tolerances()
    generator = torch.Generator().manual_seed(0)
    exact = torch.randn(1000, generator=generator, dtype=torch.float64)

    def off(scale):
        return (exact + scale * torch.randn(1000, generator=generator, dtype=torch.float64)).float()

    cpu = off(0.3)
    as_far, worse = off(0.3), off(0.3 * 20)
    (same,) = check_run({"output": cpu}, {"output": as_far}, tol, {"output": exact})
    assert same.max_rel > tol.output and same.passed and same.passed_by == "fp64"
    assert 0.5 < same.fp64_ratio < 2 and same.cpu_fp64_error == pytest.approx(0.3, rel=0.2)
    (bad,) = check_run({"output": cpu}, {"output": worse}, tol, {"output": exact})
    assert not bad.passed and bad.passed_by == "" and bad.fp64_ratio > tol.multiplier
    # without a float64 reference only the fixed tolerance judges
    (alone,) = check_run({"output": cpu}, {"output": as_far}, tol)
    assert not alone.passed and alone.fp64_error is None

    # CPU float32 exact to rounding: the floor keeps a few ulps from failing, a real error still fails
    rounded = exact.float()
    assert tol.within_fp64(1e-7, 0.0) and not tol.within_fp64(1e-4, 1e-8)
    strict = Tolerances(output=0.0)   # so that only the fp64 rule can pass
    (fine,) = check_run({"output": rounded}, {"output": rounded * (1 + 1e-7)}, strict, {"output": exact})
    assert fine.passed_by == "fp64"
    (wrong,) = check_run({"output": rounded}, {"output": rounded * (1 + 1e-4)}, strict, {"output": exact})
    assert not wrong.passed


def test_the_perturbed_rule_passes_a_gradient_as_far_as_perturbed_cpu_runs_and_fails_a_worse_one():
    """Criterion 5: a gradient behind a flipped ReLU is judged against CPU runs perturbed at the
    device's forward error; a gradient further off than those still fails."""
    from tunecl.tools.step_checks import judge_perturbed
    from tunecl.tools.tolerances import Check

    tol = Tolerances()
    assert tol.perturbation(5e-6, 1e-7) == pytest.approx(8 * 1e-7 + 1e-6)   # capped by criterion 2's bound
    assert tol.perturbation(2e-7, 1e-7) == 2e-7 and tol.perturbation(None, 1e-7) == 0.0
    generator = torch.Generator().manual_seed(0)
    exact = torch.randn(4096, generator=generator, dtype=torch.float64)

    def off(scale):
        return (exact + scale * exact.norm() / 64 * torch.randn(4096, generator=generator,
                                                                 dtype=torch.float64)).float()

    perturbed = [{"grads": {"w": off(1e-3)}}, {"grads": {"w": off(2e-3)}}]
    ref64 = {"grads": {"w": exact}}

    def failed(dev):
        error = float((dev.double() - exact).norm() / exact.norm())
        return Check("grad", "w", 1.0, 1.0, tol.grad, False, fp64_error=error, cpu_fp64_error=1e-7)

    close = judge_perturbed(failed(off(3e-3)), perturbed, ref64, 3e-6, tol)
    assert close.passed and close.passed_by == "perturbed" and "perturbed by 3.0e-06" in close.note
    far = judge_perturbed(failed(off(2e-2)), perturbed, ref64, 3e-6, tol)
    assert not far.passed and far.passed_by == "" and "CPU float32 errs" in far.note
    passed = dataclasses.replace(failed(off(2e-2)), passed=True, passed_by="fp32")
    assert judge_perturbed(passed, perturbed, ref64, 3e-6, tol) is passed
    output = dataclasses.replace(failed(off(2e-2)), kind="output")
    assert judge_perturbed(output, perturbed, ref64, 3e-6, tol) is output


def test_normwise_error_and_sign_masks_agree_with_whole_tensor_formulas_across_chunks():
    from tunecl.tools.tolerances import CHUNK, SIGN_FLOOR, normwise_error, same_sign

    generator = torch.Generator().manual_seed(1)
    ref = torch.randn(3, CHUNK + 5, generator=generator, dtype=torch.float64)
    x = (ref + 1e-3 * torch.randn(ref.shape, generator=generator, dtype=torch.float64)).float()
    mask = torch.rand(ref.shape, generator=generator) > 0.3
    assert normwise_error(x, ref) == pytest.approx(((x - ref).norm() / ref.norm()).item(), rel=1e-9)
    expected = ((x - ref)[mask].norm() / ref[mask].norm()).item()
    assert normwise_error(x, ref, mask) == pytest.approx(expected, rel=1e-9)
    g, h = x * 1e-4, -x * 1e-4 * (torch.rand(ref.shape, generator=generator) > 0.5) * 2 + x * 1e-4
    same = (g.sign() == h.sign()) & (g.abs() > SIGN_FLOOR) & (h.abs() > SIGN_FLOOR)
    assert torch.equal(same_sign(g, h), same)


def test_zero_gradients_and_the_loss_are_judged_against_float64_too():
    from tunecl.tools.step_checks import check_run
    from tunecl.tools.tolerances import ADAM_LR

    big = torch.tensor([1.0, -2.0])
    g64 = {"w": big.double(), "b": torch.tensor([1e-15, -1e-15], dtype=torch.float64)}
    # a bias gradient zero in exact arithmetic: CPU float32 happens to be far below the device's noise
    g32, g_dev = {"w": big, "b": torch.tensor([1e-12, 0.0])}, {"w": big, "b": torch.tensor([3e-9, -2e-9])}

    def run(grads, loss, own):
        params = {n: -ADAM_LR * g.sign() for n, g in grads.items()}
        return {"output": torch.ones(2), "loss": torch.tensor(loss), "grads": grads, "params": params,
                "own_loss": torch.tensor(own, dtype=torch.float64)}

    ref, ref64 = run(g32, 1.0, 1.0), run(g64, 1.0, 1.0)
    checks = {(c.kind, c.name): c for c in check_run(ref, run(g_dev, 1.002, 1.002), Tolerances(), ref64)}
    assert checks["grad", "b"].passed_by == "zero" and checks["grad", "b"].fp64_ratio > 100
    # the loss is 0.2% off both references, but it is the cross-entropy of the device's own output
    assert checks["loss", "loss"].passed_by == "own output"
    wrong = {(c.kind, c.name): c for c in check_run(ref, run(g_dev, 1.002, 1.0), Tolerances(), ref64)}
    assert not wrong["loss", "loss"].passed


def test_a_step_on_an_ill_conditioned_gradient_passes_as_adam_on_the_device_own_gradient():
    """Gradients of ~1e-5 that differ by 50%: Adam's steps differ by ~1e-3 lr (1e-3 rel on a zero bias)."""
    from tunecl.tools.step_checks import check_run
    from tunecl.tools.tolerances import ADAM_EPS, ADAM_LR

    g32, g_dev, g64 = torch.tensor([2e-5, 1.0]), torch.tensor([3e-5, 1.0]), torch.tensor([2.02e-5, 1.0])
    initial = torch.zeros(2)

    def run(g, step=True):
        after = initial - ADAM_LR * g / (g.abs() + ADAM_EPS) * step
        return {"output": torch.ones(2), "loss": torch.tensor(1.0), "grads": {"b": g}, "params": {"b": after},
                "own_loss": torch.tensor(1.0, dtype=torch.float64)}

    ref, ref64 = {**run(g32), "initial": {"b": initial}}, run(g64.double())
    grad, param = check_run(ref, run(g_dev), Tolerances(), ref64)[2:]
    assert grad.passed and param.max_rel > Tolerances().param
    assert param.fp64_ratio > Tolerances().multiplier   # CPU float32 happens to be closer to float64
    assert param.passed_by == "own gradient" and "Adam step on the device's own gradient" in param.note
    missing = check_run(ref, run(g_dev, step=False), Tolerances(), ref64)[3]
    assert not missing.passed


# -- bench -------------------------------------------------------------------------------------------
def test_bench_tiny_net_against_cpu_gives_times_and_a_ratio():
    result = bench_net(TINY, compare="cpu", warmup=1, repeats=2, **SMALL)
    ours, peer = result["ours"], result["peer"]
    assert ours["median_ms"] > 0 and len(ours["times_ms"]) == 2
    assert peer["median_ms"] > 0 and peer["process"] == "same" and peer["kind"] == "cpu"
    assert result["ratio"] == pytest.approx(ours["median_ms"] / peer["median_ms"])
    assert result["mode"] == "inference"
    assert result["fallback_calls"] == sum(result["fallback_ops"].values())
    for side in (ours, peer):   # the host time until each iteration was enqueued: within the iteration
        assert len(side["issued_ms"]) == 2 and side["issued_median_ms"] > 0
        assert all(0 < issued <= whole for issued, whole in zip(side["issued_ms"], side["times_ms"]))


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_bench_sets_the_tf32_flags_of_its_precision_on_both_sides_and_restores_them(monkeypatch, precision):
    from tunecl.tools import bench

    seen = []
    real = bench.time_iterations

    def spy(model, x, y, device, **kwargs):
        seen.append((device, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        return real(model, x, y, device, **kwargs)

    monkeypatch.setattr(bench, "time_iterations", spy)
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    result = bench.bench_net(TINY, compare="cpu", warmup=0, repeats=1, precision=precision, **SMALL)
    tf32 = precision == "tf32"
    assert seen == [("opencl", tf32, tf32), ("cpu", tf32, tf32)] and result["precision"] == precision
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before
    with pytest.raises(ValueError, match="precision must be one of"):
        bench.bench_net(TINY, compare="none", precision="fp16", **SMALL)


def test_bench_cli_train_json(capsys):
    argv = ["bench", "--net", TINY, "--batch", "2", "--image-size", "16", "--train", "--compare", "cpu",
            "--warmup", "1", "--repeats", "2", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "train" and data["ours"]["median_ms"] > 0 and data["ratio"] > 0
    assert len(data["ours"]["warmup_ms"]) == 1 and data["ours"]["warmup_ms"][0] > 0   # the untimed iteration
    assert all(0 < issued <= whole for issued, whole in zip(data["ours"]["issued_ms"], data["ours"]["times_ms"]))
    assert data["precision"] == "fp32"   # strict fp32 unless --precision tf32


def test_bench_cli_summary_without_peer(capsys):
    argv = ["bench", "--net", TINY, "--batch", "1", "--image-size", "8", "--compare", "none",
            "--warmup", "0", "--repeats", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "ours" in out and "peer" not in out and "fallback" in out
    assert next(line for line in out.splitlines() if line.startswith("enqueued")).startswith("enqueued  ours ")


def test_bench_compiled_train_prints_its_warm_up_and_replays(capsys):
    argv = ["bench", "--net", TINY, "--batch", "2", "--image-size", "16", "--train", "--compare", "none",
            "--warmup", "3", "--repeats", "1", "--compile"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    warmup = next(line for line in out.splitlines() if line.startswith("warm-up"))
    assert "the 3 untimed iterations" in warmup and "the second is captured" in warmup
    stats = dict(re.findall(r"(\w+) (\d+)", next(line for line in out.splitlines() if line.startswith("compile"))))
    # forward, backward and Adam's step, which some torch versions trace as more than one graph; each graph
    # is captured once and replayed in the third warm-up and the timed iteration at least
    assert int(stats["captures"]) >= 3 and int(stats["replays"]) >= 2 * int(stats["captures"])


def test_bench_record_appends_a_results_row_that_plot_results_reads(tmp_path, capsys):
    path = tmp_path / "results.csv"
    argv = ["bench", "--net", TINY, "--batch", "1", "--image-size", "8", "--compare", "cpu",
            "--warmup", "0", "--repeats", "1", "--record", str(path)]
    assert main(argv) == 0 and main(argv) == 0
    spec = importlib.util.spec_from_file_location(
        "plot_results", Path(__file__).resolve().parents[2] / "benchmarks" / "plot_results.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    rows = plot.load(path)   # the header once, and every ratio consistent with ours and peer
    assert len(rows) == 2 and rows[0]["workload"] == f"{TINY} batch 1 inference image 8"
    assert rows[0]["command"] == "tunecl " + " ".join(argv) and rows[0]["peer_name"].startswith("torch CPU")
    assert rows[0]["commit"] and "recorded 1 row" in capsys.readouterr().err


def test_bench_profile_reports_device_time_per_kernel(capsys):
    argv = ["bench", "--net", TINY, "--batch", "2", "--image-size", "16", "--train", "--compare", "none",
            "--warmup", "1", "--repeats", "1", "--profile", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "profile   2 more iterations:" in out and "device busy" in out
    result = bench_net(TINY, compare="none", warmup=1, repeats=1, train=True, profile=2, **SMALL)
    profile = result["profile"]
    names = [row["name"] for row in profile["kernels"]]
    assert profile["iterations"] == 2 and profile["commands"] > 0 and 0 < profile["device_busy_ms"]
    # the optimizer step (torch's foreach Adam) and the batch's copy (through a staging buffer)
    assert "foreach_map" in names and "copy device→device" in names and len(set(names)) == len(names)
    assert sum(row["share"] for row in profile["kernels"]) == pytest.approx(1.0)
    assert sum(row["ms"] for row in profile["kernels"]) == pytest.approx(profile["device_busy_ms"])
    assert bench_net(TINY, compare="none", warmup=0, repeats=1, **SMALL)["profile"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA exists here")
def test_bench_graph_times_replays_of_a_captured_step(capsys):
    eager = bench_net(TINY, compare="none", warmup=1, repeats=2, train=True, **SMALL)
    result = bench_net(TINY, compare="cpu", warmup=1, repeats=2, train=True, graph=True, profile=1, **SMALL)
    assert result["graph"] is True and result["peer"]["graph"] is False   # no graphs on the CPU peer
    assert len(result["ours"]["times_ms"]) == 2 and result["ours"]["median_ms"] > 0
    # the op counters saw the captured step once: per batch, the same plans as an eager step
    assert result["stats_batches"] == 1 and eager["stats_batches"] == 2
    assert {k: v / 1 for k, v in result["plan_sources"].items()} == \
        {k: v / 2 for k, v in eager["plan_sources"].items()}
    # a profile of replays: the graph's kernels, the batch's copies and the eager Adam step
    names = {row["name"] for row in result["profile"]["kernels"]}
    assert "foreach_map" in names and "copy device→device" in names
    argv = ["bench", "--net", TINY, "--batch", "2", "--image-size", "16", "--compare", "none",
            "--warmup", "1", "--repeats", "1", "--graph"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "graph     one step captured" in out and "(in the captured step)" in out


def test_bench_graph_of_a_net_with_dropout_draws_on_the_device_and_one_with_a_fallback_is_an_error(capsys):
    argv = ["bench", "--net", DROPOUT, "--batch", "2", "--image-size", "16", "--train", "--compare", "none",
            "--warmup", "1", "--repeats", "1", "--graph"]
    assert main(argv) == 0   # dropout and stochastic depth: masks from the graph's device generator
    capsys.readouterr()
    argv[2] = BESSEL   # an op without a kernel runs on the CPU fallback: a host round trip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # (the fallback's own once-per-op warning)
        assert main(argv) == 1
    err = capsys.readouterr().err
    assert "--graph: a step of" in err and "CPU fallback" in err


def test_bench_compare_cuda_without_cuda_is_an_error_before_measuring(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # (as on a machine without CUDA)
    assert main(["bench", "--net", TINY, "--batch", "1", "--image-size", "8", "--compare", "cuda"]) == 1
    err = capsys.readouterr().err
    assert "--compare cuda: torch.cuda.is_available() is False" in err and "measuring" not in err


def test_bench_under_fallback_error_names_the_op(capsys):
    with config.override(fallback="error"):
        assert main(["bench", "--net", BESSEL, "--batch", "2", "--image-size", "4", "--compare", "none",
                     "--warmup", "0", "--repeats", "1"]) == 1
    assert "cannot run on opencl:0: aten::special_bessel_j0" in capsys.readouterr().err


def test_peer_subprocess_never_imports_the_backend():
    """The path --compare cuda takes, run with device cpu so it works without a GPU."""
    peer = measure_in_subprocess({"net": TINY, "batch": 1, "image_size": 8, "train": True, "warmup": 0,
                                  "repeats": 1, "seed": 0, "device": "cpu"})
    assert peer["process"] == "separate" and peer["backend_imported"] is False and peer["median_ms"] > 0


def test_bench_against_cuda_times_both_cudnn_benchmark_peers(monkeypatch, capsys):
    """--compare cuda measures one child per cudnn.benchmark setting and reports each with its ratio
    (the children are stood in for here: this machine has no CUDA; the child itself is tested above)."""
    from tunecl.cli.bench import print_result
    from tunecl.tools import bench

    specs = []

    def child(spec):
        specs.append(spec)
        ms = 2.0 if spec["cudnn_benchmark"] else 4.0
        return {"kind": "cuda", "device": "torch CUDA stand-in", "process": "separate", "median_ms": ms,
                "times_ms": [ms], "settings": f"cudnn.benchmark {'on' if spec['cudnn_benchmark'] else 'off'}"}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "measure_in_subprocess", child)
    result = bench_net(TINY, compare="cuda", warmup=1, repeats=1, **SMALL)
    assert [s["cudnn_benchmark"] for s in specs] == [False, True]
    ours = result["ours"]["median_ms"]
    assert result["ratio"] == pytest.approx(ours / 4.0)
    assert result["ratio_cudnn_benchmark"] == pytest.approx(ours / 2.0)
    print_result(result)
    out = capsys.readouterr().out
    assert "cudnn.benchmark off" in out and "cudnn.benchmark on" in out and out.count("ratio ") == 2
    specs.clear()
    only_on = bench_net(TINY, compare="cuda", warmup=1, repeats=1, cudnn_benchmark="on", **SMALL)
    assert [s["cudnn_benchmark"] for s in specs] == [True] and only_on["peer_cudnn_benchmark"] is None
    assert only_on["peer"]["median_ms"] == 2.0


# -- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["bench"], "the following arguments are required: --net"),
    (["bench", "--net", "x", "--compare", "gpu"], "invalid choice: 'gpu'"),
    (["bench", "--net", "x", "--repeats", "0"], "expected a positive integer"),
    (["bench", "--net", "x", "--warmup", "-1"], "expected an integer ≥ 0"),
    (["bench", "--net", "x", "--batch", "many"], "expected a positive integer"),
    (["bench", "--net", "x", "--precision", "fp16"], "invalid choice: 'fp16'"),
    (["bench", "--net", "x", "--profile", "-2"], "expected an integer ≥ 0"),
    (["validate"], "the following arguments are required: --net"),
    (["validate", "--net", "x", "--image-size", "0"], "expected a positive integer"),
    (["validate", "--net", "x", "--compare", "cpu"], "unrecognized arguments: --compare"),
])
def test_bad_arguments_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", ["bench", "validate"])
@pytest.mark.parametrize("extra, message", [
    (["--net", "resnet19"], "unknown model 'resnet19' (close matches: resnet18"),
    (["--net", "no_such_module:factory"], "cannot build 'no_such_module:factory'"),
    (["--net", TINY, "--image-size", "1"], "cannot take a 1x3x1x1 input (is the image size or batch too"),
    (["--net", TINY, "--image-size", "2", "--train"], "cannot take a 1x3x2x2 input in train mode"),
    (["--net", TINY, "--device", "no such device"], "no OpenCL device matches 'no such device'"),
])
def test_bad_nets_and_devices_are_errors_with_exit_code_1(capsys, command, extra, message):
    assert main([command, *extra, "--batch", "1"]) == 1
    assert message in capsys.readouterr().err


def test_a_second_device_in_one_process_is_refused():
    torch.opencl.synchronize()   # the backend has picked its device
    current = torch.opencl.get_device_properties()["index"]
    from tunecl import runtime
    others = [e for e in runtime.list_devices() if e.index != current]
    if not others:
        pytest.skip("one OpenCL device only")
    with pytest.raises(TuneclError, match="already device"):
        validate_net(TINY, device=str(others[0].index), **SMALL)
    with pytest.raises(DeviceNotFoundError):
        bench_net(TINY, device="99", compare="none", repeats=1, warmup=0, **SMALL)


def test_host_profile_script_prints_where_the_host_time_goes(capsys):
    """cProfile in this process; --torch-profiler in a child process (the profiler starts torch's
    profiling threads and CUDA probing, which this test process should not keep for later tests)."""
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "host_profile.py"
    spec = importlib.util.spec_from_file_location("benchmark_host_profile", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = ["--net", TINY, "--batch", "2", "--image-size", "16", "--warmup", "1", "--iterations", "1", "--top", "5"]
    assert script.main(args) == 0
    out = capsys.readouterr().out
    assert "ms per iteration" in out and "== by tottime ==" in out and "== by cumulative ==" in out
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    child = subprocess.run([sys.executable, str(path), *args, "--train", "--torch-profiler"], capture_output=True,
                           text=True, timeout=600, env=env, check=False)
    assert child.returncode == 0, child.stderr[-2000:]
    assert "ms per iteration" in child.stdout and "Self CPU" in child.stdout and "aten::" in child.stdout
