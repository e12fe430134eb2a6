"""gemm_mma_tf32 (tensor cores through inline PTX) and the "mma_tf32" capability.

On a device without the capability (PoCL in CI) the algorithm never applies and nothing changes; its
kernel is still checked end to end there by building it with ``emulate=True``, which replaces the two
PTX instructions (cvt.rna.tf32.f32, mma.sync m16n8k8) by plain OpenCL C computing the same fragments
(``MMA_STUB`` in ``gemm_mma.cl``): every index of the kernel (tile loads, edges, transposes, KPAIR,
padding, double buffering, C stores) is exercised against numpy in float64. The same checks run with
the real PTX where the device has the capability (an NVIDIA GPU whose probe passed), and are skipped
elsewhere.

Tolerance: the fp32 tolerance of ``test_gemm.py`` (8·eps32·sqrt(K)·S) plus the TF32 rounding of the
inputs, ``tunecl.search.harness.tf32_tolerance`` (8·2**-11 times a bound of the 2-norm of the terms;
its docstring justifies it).
"""

from __future__ import annotations

import json
import math
import random
import types
import warnings

import draws
import numpy as np
import pyopencl as cl
import pytest
from test_gemm import (
    ALIGNED,
    ALIGNED_NAN_C,
    BROADCAST_A,
    BROADCAST_B,
    PACKED_NAN_C,
    TRANSPOSES,
    UNALIGNED,
    Layout,
    matrix_view,
    place,
)

from tunecl import config, kernels, runtime
from tunecl.cli import main
from tunecl.db import TuningDB
from tunecl.kernels import gemm_mma
from tunecl.kernels.gemm import GemmTiled
from tunecl.kernels.gemm_mma import GemmMmaTF32
from tunecl.precision import FP32, TF32, at_least
from tunecl.problems import GemmProblem
from tunecl.runtime import probes
from tunecl.search.harness import gemm_spread, tf32_tolerance
from tunecl.search.measure import TimingPolicy
from tunecl.search.tuner import NoAlgorithmError, Tuner
from tunecl.tune import record_outcome

MMA = GemmMmaTF32()
EPS32 = float(np.finfo(np.float32).eps)
# The shapes every config runs: 1x1x1, odd edges, more than one tile in every dimension, whole tiles.
SHAPES = [(1, 1, 1), (7, 33, 127), (257, 129, 65), (128, 128, 128)]
LAYOUTS = [PACKED_NAN_C, ALIGNED, UNALIGNED, ALIGNED_NAN_C, BROADCAST_A, BROADCAST_B]
FAST = TimingPolicy(warmup=1, min_time=0.002, min_repeats=3, max_repeats=10, timeout=20.0)


def _fake_device(
    capabilities=frozenset({runtime.MMA_TF32, runtime.CP_ASYNC}), local_mem=48 * 1024, max_wg=1024
):
    fingerprint = types.SimpleNamespace(vendor="NVIDIA Corporation", device_type="gpu", compute_units=132)
    return types.SimpleNamespace(
        local_mem_size=local_mem,
        max_work_group_size=max_wg,
        fingerprint=fingerprint,
        capabilities=capabilities,
    )


H200 = _fake_device()  # the limits of an H200 (48 KiB local memory), both capabilities granted
DRAW_SHAPE = (2048, 512, 256)  # its space keeps tiles from 16 to 256 and every warp layout


def has_capability(device) -> bool:
    return runtime.MMA_TF32 in device.capabilities


needs_mma = pytest.mark.skipif(
    "not has_capability(runtime.select_device())",
    reason="the device has no mma_tf32 capability (no tensor cores via PTX)",
)
MODES = ["emulated", pytest.param("ptx", marks=[needs_mma, pytest.mark.gpu])]


def check_run(
    device, problem: GemmProblem, config, layout: Layout, rng, emulate: bool, expect_tf32: bool = False
) -> None:
    """Build ``config`` for ``problem`` laid out as ``layout``, run it, compare with numpy in float64
    within the fp32 tolerance plus the TF32 one (``expect_tf32``: also show that the inputs really were
    rounded, i.e. some output misses the fp32 tolerance)."""
    p = problem
    plan = MMA.build(p, device, config, emulate=emulate)
    assert (plan.algorithm, plan.problem, plan.config, plan.precision) == (MMA.name, p, config, TF32)
    shape_a = (p.k, p.m) if p.trans_a else (p.m, p.k)
    shape_b = (p.n, p.k) if p.trans_b else (p.k, p.n)
    lds = (layout.ld(0, shape_a[1]), layout.ld(1, shape_b[1]), layout.ld(2, p.n))
    strides = [shape_a[0] * lds[0] + layout.gap, shape_b[0] * lds[1] + layout.gap, p.m * lds[2] + layout.gap]
    if layout.broadcast:
        strides["ab".index(layout.broadcast)] = 0
    a_flat, a_mats, _ = place(rng, p.batch, *shape_a, layout.offsets[0], lds[0], strides[0])
    b_flat, b_mats, _ = place(rng, p.batch, *shape_b, layout.offsets[1], lds[1], strides[1])
    c_flat, c_mats, c_mask = place(
        rng,
        p.batch,
        p.m,
        p.n,
        layout.offsets[2],
        lds[2],
        strides[2],
        fill=np.nan if layout.beta == 0 else None,
        outside=None,
    )
    a_buf, b_buf, c_buf = device.upload(a_flat), device.upload(b_flat), device.upload(c_flat)
    names = ("a_offset", "b_offset", "c_offset", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c")
    layout_args = {} if layout.packed else dict(zip(names, (*layout.offsets, *lds, *strides), strict=True))
    events = plan.run(a_buf, b_buf, c_buf, alpha=layout.alpha, beta=layout.beta, **layout_args)
    events[-1].wait()
    out_flat = device.download(c_buf, c_flat.shape)

    op_a = a_mats.astype(np.float64).transpose(0, 2, 1) if p.trans_a else a_mats.astype(np.float64)
    op_b = b_mats.astype(np.float64).transpose(0, 2, 1) if p.trans_b else b_mats.astype(np.float64)
    ref = layout.alpha * (op_a @ op_b)
    scale = abs(layout.alpha) * (np.abs(op_a) @ np.abs(op_b))
    if layout.beta != 0:
        ref += layout.beta * c_mats
        scale += abs(layout.beta) * np.abs(c_mats)
    out = np.stack(
        [matrix_view(out_flat, layout.offsets[2] + b * strides[2], lds[2], p.m, p.n) for b in range(p.batch)]
    )
    fp32_tolerance = 8 * EPS32 * math.sqrt(p.k) * scale
    tolerance = fp32_tolerance + abs(layout.alpha) * tf32_tolerance(gemm_spread(op_a, op_b))
    error = np.abs(out - ref)
    bad = ~(error <= tolerance)  # NaN counts as bad
    where = f"{MMA.name} {'emulated' if emulate else 'ptx'} {p.key} {layout} config={config}"
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} outputs wrong, first at {np.argwhere(bad)[0]}: "
        f"{out[bad][0]} vs {ref[bad][0]}; {where}"
    )
    np.testing.assert_array_equal(out_flat[~c_mask], c_flat[~c_mask], err_msg=f"wrote outside C: {where}")
    if expect_tf32:
        assert (error > fp32_tolerance).any(), f"no output shows TF32 rounding: {where}"


def problem(shape, transposes, batch=1) -> GemmProblem:
    return GemmProblem(*shape, *transposes, batch=batch)


# ---- the capability and the registry -----------------------------------------------------------------


def test_registered_after_the_fp32_families():
    names = [a.name for a in kernels.algorithms("gemm")]
    assert names[:2] == ["gemm_tiled", "gemm_direct"] and names.index("gemm_mma_tf32") > 1
    assert kernels.algorithm("gemm_mma_tf32").precision == TF32
    assert not hasattr(kernels.algorithm("gemm_tiled"), "precision")  # fp32 families are implicitly fp32


def test_applies_only_with_the_capability():
    p = GemmProblem(64, 64, 64)
    assert MMA.applies(p, H200)
    assert not MMA.applies(p, _fake_device(capabilities=frozenset()))
    assert not MMA.applies(p, types.SimpleNamespace(fingerprint=H200.fingerprint))  # no attribute: none
    assert not MMA.applies(GemmProblem(64, 64, 64, dtype="float16"), H200)


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
        ({"KWG": 12}, "KWG=12 not in"),
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


# ---- correctness: emulated on any device, PTX where the capability is present ----------------------------

_spaces: dict[tuple[tuple[bool, bool], bool], list[dict[str, int]]] = {}
RANDOM_CONFIGS = 12   # the draws the variant-coverage test checks
# the draws checked against numpy: 4 of 1000 per run, drawn with the day's seed; the 12 above with
# TUNECL_RANDOM_CONFIGS=full (tests/draws.py)
PICKS = draws.Picks("gemm_mma/random", per_run=4, full=RANDOM_CONFIGS)


def random_config(index: int, emulate: bool = False) -> tuple[tuple[bool, bool], dict[str, int]]:
    """Config ``index`` of a seeded draw from the space of DRAW_SHAPE on the H200-like device; with
    ``emulate``, from its configs the emulated build accepts there (the plain-C mma needs
    ``MMA_STUB_WORDS`` more local words per warp: some hardware configs no longer fit in 48 KiB)."""
    transposes = TRANSPOSES[index % 4]
    if (transposes, emulate) not in _spaces:
        p = problem(DRAW_SHAPE, transposes)
        configs = MMA.space(p, H200).configs()
        if emulate:  # (local memory depends on the config and the transposes, not on the sizes)
            configs = [c for c in configs if gemm_mma.local_memory_bytes(c, p, emulate=True) <= H200.local_mem_size]
        _spaces[(transposes, emulate)] = configs
    return transposes, random.Random(7000 + index).choice(_spaces[(transposes, emulate)])


@pytest.mark.parametrize("emulate", [False, True], ids=["ptx", "emulated"])
def test_random_configs_cover_the_variants(emulate):
    drawn = [random_config(i, emulate)[1] for i in range(RANDOM_CONFIGS)]
    assert len({tuple(sorted(c.items())) for c in drawn}) == len(drawn) >= 10
    for name in ("MWG", "NWG", "KWG", "WARPS_M", "WARPS_N", "KPAIR", "PAD", "ASYNC", "STAGES"):
        assert len({c[name] for c in drawn}) > 1, f"random configs never vary {name}"


def test_emulated_random_configs_fit_the_h200():
    """On the H200 the emulated build refused a hardware config (48 KiB of local memory); every emulated
    draw fits there, and the hardware space has configs that do not (the draws differ for a reason)."""
    for index in range(RANDOM_CONFIGS):
        transposes, config = random_config(index, emulate=True)
        p = problem(DRAW_SHAPE, transposes)
        assert gemm_mma.local_memory_bytes(config, p, emulate=True) <= H200.local_mem_size, config
    refused = {"MWG": 64, "NWG": 64, "KWG": 32, "WARPS_M": 2, "WARPS_N": 4, "VW": 4, "KPAIR": 0, "PAD": 0,
               "ASYNC": 1, "STAGES": 3, "GM": 1, "MAXRREG": 0}
    p = problem(DRAW_SHAPE, TRANSPOSES[11 % 4])
    assert MMA.space(p, H200).is_valid(refused)
    assert gemm_mma.local_memory_bytes(refused, p, emulate=True) > H200.local_mem_size


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=["nn", "nt", "tn", "tt"])
def test_default_config_matches_numpy(device, rng, transposes, mode):
    for index, shape in enumerate(SHAPES):
        layout = LAYOUTS[index % len(LAYOUTS)]
        p = problem(shape, transposes, layout.batch)
        config = MMA.default(p, H200)
        check_run(
            device, p, config, layout, rng, emulate=mode == "emulated", expect_tf32=shape == (128, 128, 128)
        )
    p = problem((257, 129, 65), transposes, batch=3)  # batch 3, offsets, ld > rows, gaps: ALIGNED
    check_run(device, p, MMA.default(p, H200), ALIGNED, rng, emulate=mode == "emulated")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("position", range(len(PICKS)))
def test_random_config_matches_numpy(device, rng, position, mode):
    index = PICKS[position]
    transposes, config = random_config(index, emulate=mode == "emulated")
    layouts = ([PACKED_NAN_C, ALIGNED] if index % 2 == 0 else [ALIGNED_NAN_C, UNALIGNED]) + [
        (BROADCAST_A, BROADCAST_B)[index % 4 // 2]
    ]
    for step, layout in enumerate(layouts):
        shape = SHAPES[(index + step) % len(SHAPES)]
        check_run(
            device, problem(shape, transposes, layout.batch), config, layout, rng, emulate=mode == "emulated"
        )


def test_local_memory_mirror_matches_the_kernel(device):
    """``local_memory_bytes`` (what the constraint checks) is what the compiled kernel declares."""
    if device.fingerprint.device_type != "cpu":
        pytest.skip("only PoCL is known to report a kernel's exact local memory")
    for index in (PICKS[position] for position in range(len(PICKS))):
        transposes, config = random_config(index, emulate=True)
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
