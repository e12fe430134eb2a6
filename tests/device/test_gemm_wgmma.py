"""gemm_wgmma_tf32 / gemm_wgmma_f16 (Hopper warpgroup MMA through inline PTX) and the "wgmma" capability:
what is the families' own. Their results against numpy at their defaults and random configs (emulated
on any device, with the real PTX where the capability is granted: every transpose, odd shapes, K = 1,
batches with offsets, padded leading dimensions, gaps and broadcasts) are checked by
``test_gemm_contract.py`` with every GEMM family; here, each local layout the probe checks (swizzles),
the wgmma kept in flight and the pretransposed operands of TF32.

On a device without the capability (PoCL in CI) neither family applies; the kernel is built with
``emulate=True`` (``WGMMA_STUB``): cp.async becomes a plain copy and the wgmma a plain-C product that
decodes the kernel's own matrix descriptors (start address, LBO, SBO, swizzle mode) by the PTX ISA's
canonical layouts and reads local memory through them, each thread computing its own accumulator
fragment. So the local layouts (K-major and MN-major, no swizzle and 32/64/128-byte swizzles), the
descriptor encoding and the fragment mapping are all checked against numpy in float64 (the tolerances
of ``gemm_checks.py``: TF32 with its truncation term, the tensor cores and the emulation truncate the
inputs to TF32; f16 with the half output's rounding). The same runs use the real PTX where the device
has the capability (an H200 whose probe passed).
"""

from __future__ import annotations

import json
import warnings

import draw_spaces
import numpy as np
import pyopencl as cl
import pytest
from gemm_checks import (
    ALIGNED,
    BROADCAST_A,
    BROADCAST_B,
    PACKED_NAN_C,
    TRANSPOSE_IDS,
    TRANSPOSES,
    UNALIGNED,
    Layout,
    gpu_double,
)
from gemm_checks import check_run as check_numpy

from tunecl import kernels, runtime
from tunecl.kernels.gemm import gemm_wgmma
from tunecl.kernels.gemm.gemm_wgmma import GemmWgmmaF16, GemmWgmmaTF32
from tunecl.precision import FP32, TF32
from tunecl.problems import GemmProblem
from tunecl.runtime import probes

TF32_ALG = GemmWgmmaTF32()
F16_ALG = GemmWgmmaF16()


def _fake_device(capabilities=frozenset({runtime.WGMMA}), local_mem=48 * 1024, max_wg=1024):
    return gpu_double(local_mem=local_mem, max_wg=max_wg, capabilities=capabilities)


H200 = _fake_device()


def has_capability(device) -> bool:
    return runtime.WGMMA in device.capabilities


needs_wgmma = pytest.mark.skipif(
    "not has_capability(runtime.select_device())",
    reason="the device has no wgmma capability (no Hopper tensor cores via PTX)",
)
MODES = ["emulated", pytest.param("ptx", marks=[needs_wgmma, pytest.mark.gpu])]
DTYPES = ["float32", "float16"]


def algorithm(dtype: str) -> GemmWgmmaTF32:
    return F16_ALG if dtype == "float16" else TF32_ALG


def problem(shape, transposes, dtype, batch=1) -> GemmProblem:
    return GemmProblem(*shape, *transposes, batch=batch, dtype=dtype)


def build(alg, p, device, config, emulate):
    """Build with the H200's limits checked (PoCL's own would accept other configs)."""
    assert alg.space(p, H200).is_valid(config), alg.space(p, H200).violations(config)
    return alg.build(p, device, config, emulate=emulate)


def check_run(device, p: GemmProblem, config, layout: Layout, rng, emulate: bool) -> None:
    """Build ``config`` for ``p`` (valid on the H200), run it laid out as ``layout``, compare with numpy."""
    alg = algorithm(p.dtype)
    check_numpy(device, alg, p, config, layout, rng,
                build=lambda p, device, config: build(alg, p, device, config, emulate))


# ---- the capability, the registry, the space ---------------------------------------------------------


def test_registered_before_the_mma_families_so_it_gives_the_float16_default():
    names = [a.name for a in kernels.algorithms("gemm")]
    assert names.index("gemm_mma_f16") > names.index("gemm_wgmma_f16") > names.index("gemm_simt")
    everything = _fake_device(capabilities=frozenset({runtime.WGMMA, runtime.MMA_TF32, runtime.MMA_F16,
                                                      runtime.CP_ASYNC}))

    def first(dtype):
        return next(a.name for a in kernels.algorithms("gemm") if a.applies(GemmProblem(64, 64, 64, dtype=dtype),
                                                                            everything))
    assert first("float16") == "gemm_wgmma_f16" and first("float32") == "gemm_tiled"
    assert kernels.algorithm("gemm_wgmma_tf32").precision == TF32
    assert kernels.algorithm("gemm_wgmma_f16").precision == FP32


def test_without_the_capability_nothing_applies(device):
    if has_capability(device):
        pytest.skip("this device has the capability")
    for dtype in DTYPES:
        assert not algorithm(dtype).applies(GemmProblem(256, 256, 256, dtype=dtype), device)


def test_the_probe_fails_quietly_where_ptx_does_not_compile(device):
    if has_capability(device):
        pytest.skip("this device has the capability")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reason = runtime.capability_probes(device, force=True)[runtime.WGMMA]
    assert reason.startswith(("build failed", "launch failed", "wrong result")) and not caught


def test_the_probe_covers_every_layout_the_family_builds():
    cases = set(runtime.WGMMA_PROBE_CASES)
    assert {(0, sw, 0, 0) for sw in (0, 32, 64, 128)} <= cases
    assert {(1, sw, a, b) for sw in (0, 32, 64, 128) for a in (0, 1) for b in (0, 1)} <= cases
    for transposes in TRANSPOSES:
        assert gemm_wgmma.mn_major(problem((64, 64, 64), transposes, "float32")) == (False, False)
        a_mn, b_mn = gemm_wgmma.mn_major(problem((64, 64, 64), transposes, "float16"))
        assert (a_mn, b_mn) == (transposes[0], not transposes[1])
    for case, (f16, *_rest) in enumerate(runtime.WGMMA_PROBE_CASES):
        a, b = probes._wgmma_probe_data(bool(f16), case)
        assert a.shape == b.shape == (64, 128 // a.itemsize)
        exact = a.astype(np.float64) @ b.astype(np.float64).T
        assert np.abs(exact).max() < 2**24  # exact in fp32
        assert np.abs(exact - a.astype(np.float64) @ b.astype(np.float64)[::-1].T).max() > 1  # B misplaced


@pytest.mark.parametrize("dtype", DTYPES)
def test_space_and_default_on_an_h200_like_device(dtype):
    alg = algorithm(dtype)
    for spec in ("4096,4096,4096", "1024,1024,1024", "64,1000,2048", "1,1,1"):
        for transposes in TRANSPOSES:
            p = problem(tuple(int(v) for v in spec.split(",")), transposes, dtype)
            configs = alg.space(p, H200).configs()
            assert 1 <= len(configs) <= 5000, (spec, len(configs))
            assert alg.default(p, H200) in configs
            assert all(gemm_wgmma.local_memory_bytes(c, p) <= 48 * 1024 for c in configs)
    p = GemmProblem(4096, 4096, 4096, dtype=dtype)
    default = alg.default(p, H200)
    # the NN layout's B is MN-contiguous: TF32 transposes it first (PRETRANS), f16 reads it MN-major
    assert default == {"MWG": 128, "NWG": 128, "KWG": 16 if dtype == "float32" else 32, "WARPGROUPS": 2,
                       "STAGES": 3, "SWIZZLE": 64, "VW": 4 if dtype == "float32" else 8, "GM": 8, "INFLIGHT": 0,
                       **({"PRETRANS": 1} if dtype == "float32" else {})}
    assert gemm_wgmma.accumulators(default) == 64 and gemm_wgmma.local_memory_bytes(default, p) == 48 * 1024
    configs = alg.space(p, H200).configs()
    for name in ("MWG", "NWG", "KWG", "WARPGROUPS", "STAGES", "SWIZZLE", "GM", "INFLIGHT"):
        assert len({c[name] for c in configs}) > 1, f"the 4096^3 space never varies {name}"
    assert all(c["STAGES"] >= 3 for c in configs if c["INFLIGHT"])
    assert any((c["MWG"], c["NWG"], c["WARPGROUPS"]) == (128, 256, 2) for c in configs)


@pytest.mark.parametrize(
    "changes, violation",
    [
        ({"MWG": 64, "WARPGROUPS": 2}, "warpgroup_rows_multiple_of_64"),
        ({"MWG": 256, "NWG": 256, "WARPGROUPS": 1}, "at_most_128_accumulators"),
        ({"SWIZZLE": 128}, "swizzle_fits_the_tiles"),
        ({"STAGES": 4}, "local_memory_within_device"),
        ({"STAGES": 2, "INFLIGHT": 1}, "INFLIGHT_needs_three_stages"),
    ],
)
def test_invalid_configs_are_named_and_never_compiled(device, monkeypatch, changes, violation):
    p = GemmProblem(4096, 4096, 4096)
    config = {**TF32_ALG.default(p, H200), **changes}
    assert any(violation in v for v in TF32_ALG.space(p, H200).violations(config))
    monkeypatch.setattr(device, "build", _refuse_to_compile)
    with pytest.raises(ValueError, match=violation.split("=")[0]):
        TF32_ALG.build(p, H200, config)


def _refuse_to_compile(*args, **kwargs):
    raise AssertionError("an invalid config reached the compiler")


def test_device_limits_are_named_constraints():
    p = GemmProblem(4096, 4096, 4096)
    small = _fake_device(local_mem=16 * 1024, max_wg=128)
    config = TF32_ALG.default(p, H200)
    assert {"work_group_size_within_device", "local_memory_within_device"} <= set(
        TF32_ALG.space(p, small).violations(config)
    )
    assert TF32_ALG.space(p, small).is_valid(TF32_ALG.default(p, small))


# ---- correctness: emulated on any device, PTX where the capability is present ------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_random_configs_cover_the_variants(dtype):
    """test_gemm_contract.py's draws."""
    drawn = [draw_spaces.random_config(algorithm(dtype), i)[1] for i in range(draw_spaces.RANDOM_FULL)]
    assert len({tuple(sorted(c.items())) for c in drawn}) == len(drawn)
    for name in ("MWG", "NWG", "KWG", "WARPGROUPS", "STAGES", "SWIZZLE", "INFLIGHT"):
        assert len({c[name] for c in drawn}) > 1, f"random configs never vary {name}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=TRANSPOSE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_swizzle_matches_numpy(device, rng, dtype, transposes, swizzle, mode):
    """Each layout the probe checks, with two warpgroups and several K steps (64 x 64 tiles so that
    the 128-byte swizzle fits 48 KiB; K-major rows hold one or more swizzle patterns)."""
    elt = 2 if dtype == "float16" else 4
    config = {"MWG": 128, "NWG": 64, "KWG": max(128, 2 * swizzle) // elt // 2 if swizzle else 32 // elt * 2,
              "WARPGROUPS": 2, "STAGES": 2, "SWIZZLE": swizzle, "VW": 16 // elt // 2, "GM": 1}
    p = problem((200, 150, 3 * config["KWG"] + 5), transposes, dtype)
    check_run(device, p, config, PACKED_NAN_C, rng, emulate=mode == "emulated")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=TRANSPOSE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inflight_matches_numpy(device, rng, dtype, transposes, stages, mode):
    """INFLIGHT 1: the previous K step's wgmma keeps running while the next is issued and the copies run
    STAGES - 2 steps ahead: many K steps with a partial last one, fewer steps than the prologue fills,
    one step, and two warpgroups sharing the barriers."""
    elt = 2 if dtype == "float16" else 4
    config = {"MWG": 128, "NWG": 64, "KWG": 64 // elt, "WARPGROUPS": 2, "STAGES": stages, "SWIZZLE": 64,
              "VW": 16 // elt // 2, "GM": 1, "INFLIGHT": 1}
    for layout, k in zip([PACKED_NAN_C, ALIGNED, UNALIGNED], [9 * config["KWG"] + 3, config["KWG"] + 1, 5],
                         strict=True):
        check_run(device, problem((150, 70, k), transposes, dtype, layout.batch), config, layout, rng,
                  emulate=mode == "emulated")


PRETRANS_CONFIG = {"MWG": 64, "NWG": 64, "KWG": 32, "WARPGROUPS": 1, "STAGES": 2, "SWIZZLE": 128, "VW": 4,
                   "GM": 1, "PRETRANS": 1}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transposes", [(False, False), (True, False), (True, True)], ids=["nn", "tn", "tt"])
def test_pretransposed_operands_match_numpy(device, rng, transposes, mode):
    """TF32 with PRETRANS = 1: the MN-contiguous operands (B in nn, A and B in tn, A in tt) are
    transposed into the plan's workspace first, from offsets, padded leading dimensions, gaps between
    the matrices of a batch and broadcasts (a stride-0 operand is transposed once)."""
    for layout, shape in zip([ALIGNED, UNALIGNED, BROADCAST_A, BROADCAST_B, PACKED_NAN_C],
                             [(257, 129, 65), (7, 33, 127), (130, 300, 1), (65, 97, 40), (1, 1, 1)], strict=True):
        p = problem(shape, transposes, "float32", layout.batch)
        check_run(device, p, PRETRANS_CONFIG, layout, rng, emulate=mode == "emulated")
    p = problem((300, 200, 100), transposes, "float32", batch=2)
    plan = build(TF32_ALG, p, device, PRETRANS_CONFIG, emulate=True)
    assert isinstance(plan, gemm_wgmma.PretransposedPlan)
    assert (plan.inner.problem.trans_a, plan.inner.problem.trans_b) == (False, True)  # the K-major kernel
    assert plan.workspace_bytes == 4 * 2 * 100 * ((300 if p.trans_a else 0) + (200 if not p.trans_b else 0))


def test_pretrans_is_searched_only_where_an_operand_is_mn_contiguous():
    for transposes in TRANSPOSES:
        p = problem((2048, 512, 256), transposes, "float32")
        values = {c["PRETRANS"] for c in TF32_ALG.space(p, H200).configs()}
        assert values == ({0, 1} if gemm_wgmma.has_mn_operand(p) else {0}), transposes
        violations = TF32_ALG.space(p, H200).violations(PRETRANS_CONFIG)
        assert ("PRETRANS_only_with_an_MN_contiguous_operand" in violations) == (transposes == (False, True))
    assert "PRETRANS" not in F16_ALG.space(problem((2048, 512, 256), (False, False), "float16"), H200).params
    # a config stored before PRETRANS existed means the in-kernel path
    old = {k: v for k, v in PRETRANS_CONFIG.items() if k != "PRETRANS"}
    assert TF32_ALG.space(problem((64, 64, 64), (False, False), "float32"), H200).complete(old)["PRETRANS"] == 0


def test_local_memory_mirror_matches_the_kernel(device):
    """``local_memory_bytes`` (what the constraint checks) is what the compiled kernel declares."""
    if device.fingerprint.device_type != "cpu":
        pytest.skip("only PoCL is known to report a kernel's exact local memory")
    for dtype in DTYPES:
        picks = draw_spaces.picks(algorithm(dtype).name, at_least=4)
        for index in (picks[position] for position in range(len(picks))):
            transposes, config = draw_spaces.random_config(algorithm(dtype), index)
            p = problem((64, 64, 64), transposes, dtype)
            plan = build(algorithm(dtype), p, device, config, emulate=True)
            [kernel] = getattr(plan, "inner", plan)._kernels.values()  # (behind PRETRANS's transposes)
            used = kernel.get_work_group_info(cl.kernel_work_group_info.LOCAL_MEM_SIZE, device.cl_device)
            assert used == gemm_wgmma.local_memory_bytes(config, p), config


def test_the_benchmark_says_where_the_families_do_not_apply(device, tmp_path, capsys):
    if has_capability(device):
        pytest.skip("this device has the capability: the benchmark would time it")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gemm_wgmma.py"
    spec = importlib.util.spec_from_file_location("benchmark_gemm_wgmma", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "wgmma.json"
    assert script.main(["--json", str(out)]) == 0
    assert "do not apply on this device" in capsys.readouterr().out
    assert json.loads(out.read_text())["rows"] == []
