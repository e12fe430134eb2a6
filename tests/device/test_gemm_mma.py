"""gemm_mma_tf32 (tensor cores through inline PTX) and the "mma_tf32" capability: what is the family's
own. Its results against numpy (emulated on any device, with the real PTX where the capability is
granted: defaults and random configs on the edge shapes and layouts, at the TF32 tolerance) are checked
by ``test_gemm_contract.py`` with every GEMM family.

On a device without the capability (PoCL in CI) the algorithm never applies and nothing changes; its
kernel is built there with ``emulate=True``, which replaces the two PTX instructions (cvt.rna.tf32.f32,
mma.sync m16n8k8) by plain OpenCL C computing the same fragments (``MMA_STUB`` in ``gemm_mma.cl``).
"""

from __future__ import annotations

import json
import warnings

import draw_spaces
import numpy as np
import pyopencl as cl
import pytest
from gemm_checks import gpu_double, problem

from tunecl import config, kernels, runtime
from tunecl.cli import main
from tunecl.db import TuningDB
from tunecl.kernels.gemm import gemm_mma
from tunecl.kernels.gemm.gemm_tiled import GemmTiled
from tunecl.kernels.gemm.gemm_mma import GemmMmaTF32
from tunecl.precision import FP32, TF32, at_least
from tunecl.problems import GemmProblem
from tunecl.runtime import probes
from tunecl.search.measure import TimingPolicy
from tunecl.search.tuner import NoAlgorithmError, Tuner
from tunecl.tune import record_outcome

MMA = GemmMmaTF32()
FAST = TimingPolicy(warmup=1, min_time=0.002, min_repeats=3, max_repeats=10, timeout=20.0)


def _fake_device(capabilities=frozenset({runtime.MMA_TF32, runtime.CP_ASYNC}), local_mem=48 * 1024, max_wg=1024):
    return gpu_double(local_mem=local_mem, max_wg=max_wg, capabilities=capabilities)


H200 = _fake_device()  # the limits of an H200 (48 KiB local memory), both capabilities granted


def has_capability(device) -> bool:
    return runtime.MMA_TF32 in device.capabilities


# ---- the capability and the registry -----------------------------------------------------------------


def test_registered_after_the_fp32_families():
    names = [a.name for a in kernels.algorithms("gemm")]
    assert names[:2] == ["gemm_tiled", "gemm_direct"] and names.index("gemm_mma_tf32") > 1
    assert kernels.algorithm("gemm_mma_tf32").precision == TF32
    assert not hasattr(kernels.algorithm("gemm_tiled"), "precision")  # fp32 families are implicitly fp32


def test_without_the_capability_nothing_applies(device, monkeypatch):
    if has_capability(device):
        pytest.skip("this device has the capability")
    assert runtime.MMA_TF32 not in device.capabilities
    assert not MMA.applies(GemmProblem(256, 256, 256), device)
    names = [a.name for a in kernels.algorithms("gemm") if a.applies(GemmProblem(64, 64, 64), device)]
    assert names[:2] == ["gemm_tiled", "gemm_direct"]  # the untuned default stays the fp32 tiled GEMM
    assert names and not any(n.startswith(("gemm_mma", "gemm_wgmma")) for n in names)  # no tensor cores
    if not probes._may_compile_ptx(device.fingerprint):  # skipped by vendor: no compile, no file
        monkeypatch.setattr(probes, "_PROBES", {runtime.MMA_TF32: _refuse_to_probe})
        assert runtime.capability_probes(device)[runtime.MMA_TF32].startswith("not an NVIDIA")


def _refuse_to_probe(device):
    raise AssertionError("a device that cannot compile PTX was probed")


def test_the_probe_fails_quietly_where_ptx_does_not_compile(device):
    """Forced onto this device, the probe's build fails: a reason, no capability, no Python warning."""
    if has_capability(device):
        pytest.skip("this device has the capability")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reason = runtime.capability_probes(device, force=True)[runtime.MMA_TF32]
    assert reason.startswith(("build failed", "launch failed", "wrong result")) and not caught


def test_probe_verdicts_are_cached_per_fingerprint(device, tmp_path, monkeypatch):
    calls = []

    def fake_probe(dev):
        calls.append(dev)
        return ""

    monkeypatch.setattr(probes, "_may_compile_ptx", lambda fingerprint: True)
    monkeypatch.setattr(probes, "_PROBES", {runtime.MMA_TF32: fake_probe})
    with config.override(cache_dir=str(tmp_path)):
        assert runtime.capability_probes(device) == {runtime.MMA_TF32: ""}
        assert runtime.capability_probes(device) == {runtime.MMA_TF32: ""}
        assert len(calls) == 1  # the second answer came from the cache
        cached = tmp_path / "probe" / f"{device.fingerprint.key}.capabilities.json"
        data = json.loads(cached.read_text())
        cached.write_text(json.dumps({**data, "version": data["version"] - 1}))  # another probe version
        runtime.capability_probes(device)
        assert len(calls) == 2


def test_the_cp_async_probe_expects_zero_fill():
    src = np.arange(1, 129, dtype=np.float32)
    expected = probes._cp_async_expected(src)
    # zero-filled: 2 words of 16-byte lanes 1, 4, 7, 10, 13; 1 of 8-byte lanes 16, 19, 22; 4-byte 25, 28, 31
    assert (expected == 0).sum() == 2 * 5 + 3 + 3
    copied = expected[:88]  # words 88.. are nobody's: they keep the -1 the kernel writes first
    assert (copied[copied != 0] == src[:88][copied != 0]).all() and (expected[88:] == -1).all()


def test_the_probe_data_tells_rounding_from_truncation():
    from tunecl.precision import tf32_round

    a, b, c = probes._mma_probe_data()
    rounded = tf32_round(a).astype(np.float64) @ tf32_round(b).astype(np.float64) + c
    truncated = (a.view(np.uint32) & 0xFFFFE000).view(np.float32).astype(np.float64) @ (
        b.view(np.uint32) & 0xFFFFE000
    ).view(np.float32).astype(np.float64) + c
    assert np.abs(rounded - truncated).max() > 1e-4  # a truncating cvt fails the probe
    assert np.abs(rounded - (a.astype(np.float64) @ b + c)).max() > 1e-4  # so does no rounding at all
    assert np.abs(rounded - (a.astype(np.float64) @ b.T[:, ::-1].T + c)).max() > 1  # and a misplaced B


# ---- the space on an H200-like device ------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, low, high",
    [
        ("4096,4096,4096", 500, 5000),
        ("1024,1024,1024", 500, 5000),
        ("64,1000,2048", 100, 5000),
        ("1,1,1", 1, 100),
    ],
)
def test_space_on_an_h200_like_device(spec, low, high):
    p = GemmProblem.from_spec(spec)
    configs = MMA.space(p, H200).configs()
    assert low <= len(configs) <= high
    assert MMA.default(p, H200) in configs
    assert all(gemm_mma.local_memory_bytes(c, p) <= 48 * 1024 for c in configs)


def test_default_and_fast_shapes_on_an_h200_like_device():
    p = GemmProblem(4096, 4096, 4096)
    default = MMA.default(p, H200)
    assert default == {
        "MWG": 128,
        "NWG": 128,
        "KWG": 16,
        "WARPS_M": 2,
        "WARPS_N": 4,
        "VW": 4,
        "KPAIR": 1,
        "PAD": 1,
        "ASYNC": 0,
        "STAGES": 2,
        "GM": 8,
        "MAXRREG": 0,
    }
    assert gemm_mma.accumulators(default) == 64
    configs = MMA.space(p, H200).configs()
    for shape in [(128, 128, 2, 2), (128, 256, 2, 4), (256, 128, 4, 2), (128, 128, 4, 2), (64, 64, 2, 2)]:
        matches = [c for c in configs if (c["MWG"], c["NWG"], c["WARPS_M"], c["WARPS_N"]) == shape]
        assert matches, f"no {shape} in the 4096^3 space"
        assert {(c["ASYNC"], c["STAGES"]) for c in matches} >= {(0, 1), (0, 2), (1, 2), (1, 3)}, shape
    for name in ("KWG", "KPAIR", "PAD", "ASYNC", "STAGES", "GM", "MAXRREG"):
        assert len({c[name] for c in configs}) > 1, f"the 4096^3 space never varies {name}"
    without_cp_async = MMA.space(p, _fake_device(capabilities=frozenset({runtime.MMA_TF32}))).configs()
    assert {c["ASYNC"] for c in without_cp_async} == {0} and default in without_cp_async
    smaller = MMA.default(GemmProblem(1024, 1024, 1024), H200)  # 128x128 would leave SMs idle
    assert (smaller["MWG"], smaller["NWG"]) == (64, 64)


@pytest.mark.parametrize(
    "changes, violation",
    [
        ({"MWG": 32, "WARPS_M": 4}, "warp_tile_rows_multiple_of_16"),
        ({"NWG": 16, "WARPS_N": 4}, "warp_tile_cols_multiple_of_8"),
        ({"MWG": 256, "NWG": 128, "WARPS_M": 2, "WARPS_N": 2}, "at_most_128_accumulators"),
        ({"KWG": 32, "STAGES": 2}, "local_memory_within_device"),
        ({"ASYNC": 0, "STAGES": 3}, "STAGES_1_or_2_through_registers"),
        ({"ASYNC": 1, "STAGES": 1}, "STAGES_2_to_4_with_cp_async"),
        ({"MWG": 16, "NWG": 16, "WARPS_M": 1, "WARPS_N": 2, "KWG": 8, "VW": 4}, "A_tile_loads_split_evenly"),
    ],
)
def test_invalid_configs_are_named_and_never_compiled(device, monkeypatch, changes, violation):
    p = GemmProblem(4096, 4096, 4096)
    config = {**MMA.default(p, H200), **changes}
    assert any(violation in v for v in MMA.space(p, H200).violations(config))
    monkeypatch.setattr(device, "build", _refuse_to_compile)
    with pytest.raises(ValueError, match=violation.split("=")[0]):
        MMA.build(p, H200, config)


def _refuse_to_compile(*args, **kwargs):
    raise AssertionError("an invalid config reached the compiler")


def test_device_limits_are_named_constraints():
    p = GemmProblem(4096, 4096, 4096)
    small = _fake_device(local_mem=16 * 1024, max_wg=64)
    config = MMA.default(p, H200)
    assert {"work_group_size_within_device", "local_memory_within_device"} <= set(
        MMA.space(p, small).violations(config)
    )
    assert MMA.space(p, small).is_valid(MMA.default(p, small))


# ---- the draws test_gemm_contract.py runs ----------------------------------------------------------------


def test_random_configs_cover_the_variants():
    drawn = [draw_spaces.random_config(MMA, i)[1] for i in range(draw_spaces.RANDOM_FULL)]
    assert len({tuple(sorted(c.items())) for c in drawn}) == len(drawn)
    for name in ("MWG", "NWG", "KWG", "WARPS_M", "WARPS_N", "KPAIR", "PAD", "ASYNC", "STAGES"):
        assert len({c[name] for c in drawn}) > 1, f"random configs never vary {name}"


def test_some_hardware_configs_do_not_fit_the_h200_emulated():
    """The plain-C mma needs ``MMA_STUB_WORDS`` more local words per warp: on the H200 the emulated build
    refuses such a config (the contract's emulated runs pass over it to the next draw)."""
    refused = {"MWG": 64, "NWG": 64, "KWG": 32, "WARPS_M": 2, "WARPS_N": 4, "VW": 4, "KPAIR": 0, "PAD": 0,
               "ASYNC": 1, "STAGES": 3, "GM": 1, "MAXRREG": 0}
    p = problem(draw_spaces.DRAW_SHAPE, (True, True))
    assert MMA.space(p, H200).is_valid(refused)
    assert gemm_mma.local_memory_bytes(refused, p, emulate=True) > H200.local_mem_size
    with pytest.raises(ValueError, match="the emulated mma needs more local memory"):
        MMA.build(p, H200, refused, emulate=True)


def test_local_memory_mirror_matches_the_kernel(device):
    """``local_memory_bytes`` (what the constraint checks) is what the compiled kernel declares, for
    four of today's random draws (the first ones test_gemm_contract.py runs)."""
    if device.fingerprint.device_type != "cpu":
        pytest.skip("only PoCL is known to report a kernel's exact local memory")
    picks = draw_spaces.picks(MMA.name, at_least=4)
    for index in (picks[position] for position in range(len(picks))):
        transposes, config = draw_spaces.random_config(MMA, index)
        p = problem((64, 64, 64), transposes)
        plan = MMA.build(p, device, config, emulate=True)
        [kernel] = plan._kernels.values()
        used = kernel.get_work_group_info(cl.kernel_work_group_info.LOCAL_MEM_SIZE, device.cl_device)
        assert used == gemm_mma.local_memory_bytes(config, p, emulate=True), config


# ---- tuning at TF32 precision -------------------------------------------------------------------------


class EmulatedMma(GemmMmaTF32):
    """gemm_mma_tf32 made to apply here, built with the plain-C mma (the plumbing, not the speed)."""

    def applies(self, problem, device):
        return isinstance(problem, GemmProblem) and problem.dtype == "float32"

    def space(self, problem, device):
        return super().space(problem, H200)  # a GPU's limits keep the space small

    def build(self, problem, device, config, *, emulate=True):
        return super().build(problem, device, config, emulate=True)


def test_precision_decides_which_algorithms_a_study_sees(device, tmp_path):
    p = GemmProblem(33, 17, 29)
    storage = f"sqlite:///{tmp_path / 'studies.sqlite'}"
    both = [GemmTiled(), EmulatedMma()]
    assert [a.name for a in Tuner(device, storage, algorithms=both).applicable(p)] == ["gemm_tiled"]
    assert [a.name for a in Tuner(device, storage, algorithms=both, precision="tf32").applicable(p)] == [
        "gemm_tiled",
        "gemm_mma_tf32",
    ]
    with pytest.raises(NoAlgorithmError, match="at fp32 precision|applies to"):
        Tuner(device, storage, algorithms=[EmulatedMma()]).applicable(p)
    with pytest.raises(ValueError, match="unknown precision"):
        Tuner(device, storage, precision="fp16")


def test_a_tf32_study_verifies_and_records_each_precision(device, tmp_path):
    p = GemmProblem(33, 17, 29)
    tuner = Tuner(
        device,
        f"sqlite:///{tmp_path / 'studies.sqlite'}",
        algorithms=[GemmTiled(), EmulatedMma()],
        precision="tf32",
        policy=FAST,
    )
    outcome = tuner.tune(p, trials=6)
    assert outcome.precision == TF32 and outcome.precisions == {"gemm_tiled": FP32, "gemm_mma_tf32": TF32}
    assert outcome.per_algorithm["gemm_mma_tf32"].ok, outcome.per_algorithm  # verified at TF32 tolerance
    assert outcome.to_dict()["per_algorithm"]["gemm_mma_tf32"]["precision"] == TF32
    with TuningDB(str(tmp_path / "tuning.sqlite")) as db:
        record_outcome(db, device.fingerprint, outcome)
        assert {(r.algorithm, r.precision) for r in db.results()} == {
            ("gemm_tiled", FP32),
            ("gemm_mma_tf32", TF32),
        }
        assert db.lookup(device.fingerprint, p).algorithm == "gemm_tiled"  # strict: never the TF32 one
        assert db.lookup(device.fingerprint, p, precision=at_least(TF32)) is not None


def test_cli_tune_at_tf32_without_the_capability_records_fp32_results(device, tmp_path, capsys):
    if has_capability(device):
        pytest.skip("this device has the capability")
    db_path = tmp_path / "cli.sqlite"
    code = main(
        [
            "tune",
            "--gemm",
            "33,17,29",
            "--precision",
            "tf32",
            "--trials",
            "3",
            "--min-time",
            "0.002",
            "--no-progress",
            "--json",
            "--db",
            str(db_path),
            "--storage",
            str(tmp_path / "cli-studies.sqlite"),
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["precision"] == TF32 and "gemm_mma_tf32" not in data["per_algorithm"]
    assert {v["precision"] for v in data["per_algorithm"].values() if v} == {FP32}
    with TuningDB(str(db_path)) as db:
        records = db.results()
        assert records and {r.precision for r in records} == {FP32}
        assert db.lookup(device.fingerprint, GemmProblem(33, 17, 29)) is not None  # strict requests served
