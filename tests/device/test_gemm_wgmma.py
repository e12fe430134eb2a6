"""gemm_wgmma_tf32 / gemm_wgmma_f16 (Hopper warpgroup MMA through inline PTX) and the "wgmma" capability.

On a device without the capability (PoCL in CI) neither family applies; the kernel is checked end to
end by building it with ``emulate=True`` (``WGMMA_STUB``): cp.async becomes a plain copy and the wgmma a
plain-C product that decodes the kernel's own matrix descriptors (start address, LBO, SBO, swizzle
mode) by the PTX ISA's canonical layouts and reads local memory through them, each thread computing its
own accumulator fragment. So the local layouts (K-major and MN-major, no swizzle and 32/64/128-byte
swizzles), the descriptor encoding and the fragment mapping are all checked against numpy in float64,
at the defaults and seeded random valid configs, for every transpose, odd shapes, K = 1, batches with
offsets, padded leading dimensions, gaps and broadcasts. The same runs use the real PTX where the
device has the capability (an H200 whose probe passed).

Tolerances: TF32 as ``test_gemm_mma.py`` (fp32 tolerance plus ``tf32_tolerance``, here with its truncation
term: the tensor cores, and the emulation, truncate the inputs to TF32), f16 as ``test_gemm_mma_f16.py``.
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

from tunecl import kernels, runtime
from tunecl.kernels import gemm_wgmma
from tunecl.kernels.gemm_wgmma import GemmWgmmaF16, GemmWgmmaTF32
from tunecl.precision import FP32, TF32
from tunecl.problems import GemmProblem
from tunecl.runtime import probes
from tunecl.search.harness import gemm_spread, half_output_tolerance, tf32_tolerance

TF32_ALG = GemmWgmmaTF32()
F16_ALG = GemmWgmmaF16()
EPS32 = float(np.finfo(np.float32).eps)
# 1x1x1, odd edges, K = 1, more than one tile in every dimension, whole tiles
SHAPES = [(1, 1, 1), (7, 33, 127), (257, 129, 65), (130, 300, 1), (128, 128, 128)]
ALIGNED8 = Layout(batch=2, alpha=0.75, beta=-1.25, offsets=(8, 16, 8), pads=(8, 0, 8), gap=8, align=8)
LAYOUTS = [PACKED_NAN_C, ALIGNED, UNALIGNED, ALIGNED_NAN_C, BROADCAST_A, BROADCAST_B, ALIGNED8]
DRAW_SHAPE = (2048, 512, 256)
RANDOM_CONFIGS = 10
# the draws checked against numpy: 4 of 1000 per run, drawn with the day's seed; the first RANDOM_CONFIGS
# with TUNECL_RANDOM_CONFIGS=full (tests/draws.py)
PICKS = draws.Picks("gemm_wgmma/random", per_run=4, full=RANDOM_CONFIGS)


def _fake_device(capabilities=frozenset({runtime.WGMMA}), local_mem=48 * 1024, max_wg=1024):
    fingerprint = types.SimpleNamespace(vendor="NVIDIA Corporation", device_type="gpu", compute_units=132)
    return types.SimpleNamespace(
        local_mem_size=local_mem, max_work_group_size=max_wg, fingerprint=fingerprint, capabilities=capabilities
    )


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


def _place(rng, dtype, *args, **kwargs):
    flat, mats, mask = place(rng, *args, **kwargs)
    if dtype == "float16":
        flat = flat.astype(np.float16)
        batch, rows, cols, offset, ld, stride = args
        mats = np.stack([matrix_view(flat, offset + b * stride, ld, rows, cols) for b in range(batch)])
    return flat, mats, mask


def check_run(device, p: GemmProblem, config, layout: Layout, rng, emulate: bool) -> None:
    """Build ``config`` for ``p`` laid out as ``layout``, run it, compare with numpy in float64."""
    alg = algorithm(p.dtype)
    plan = build(alg, p, device, config, emulate)
    assert (plan.algorithm, plan.problem, plan.precision) == (alg.name, p, TF32 if p.dtype == "float32" else FP32)
    shape_a = (p.k, p.m) if p.trans_a else (p.m, p.k)
    shape_b = (p.n, p.k) if p.trans_b else (p.k, p.n)
    lds = (layout.ld(0, shape_a[1]), layout.ld(1, shape_b[1]), layout.ld(2, p.n))
    strides = [shape_a[0] * lds[0] + layout.gap, shape_b[0] * lds[1] + layout.gap, p.m * lds[2] + layout.gap]
    if layout.broadcast:
        strides["ab".index(layout.broadcast)] = 0
    a_flat, a_mats, _ = _place(rng, p.dtype, p.batch, *shape_a, layout.offsets[0], lds[0], strides[0])
    b_flat, b_mats, _ = _place(rng, p.dtype, p.batch, *shape_b, layout.offsets[1], lds[1], strides[1])
    c_flat, c_mats, c_mask = _place(
        rng, p.dtype, p.batch, p.m, p.n, layout.offsets[2], lds[2], strides[2],
        fill=np.nan if layout.beta == 0 else None, outside=None,
    )
    a_buf, b_buf, c_buf = device.upload(a_flat), device.upload(b_flat), device.upload(c_flat)
    names = ("a_offset", "b_offset", "c_offset", "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c")
    layout_args = {} if layout.packed else dict(zip(names, (*layout.offsets, *lds, *strides), strict=True))
    events = plan.run(a_buf, b_buf, c_buf, alpha=layout.alpha, beta=layout.beta, **layout_args)
    events[-1].wait()
    out_flat = device.download(c_buf, c_flat.shape, c_flat.dtype)

    op_a = a_mats.astype(np.float64).transpose(0, 2, 1) if p.trans_a else a_mats.astype(np.float64)
    op_b = b_mats.astype(np.float64).transpose(0, 2, 1) if p.trans_b else b_mats.astype(np.float64)
    ref = layout.alpha * (op_a @ op_b)
    scale = abs(layout.alpha) * (np.abs(op_a) @ np.abs(op_b))
    if layout.beta != 0:
        ref += layout.beta * c_mats.astype(np.float64)
        scale += abs(layout.beta) * np.abs(c_mats.astype(np.float64))
    out = np.stack(
        [matrix_view(out_flat, layout.offsets[2] + b * strides[2], lds[2], p.m, p.n) for b in range(p.batch)]
    ).astype(np.float64)
    fp32_tolerance = 8 * EPS32 * math.sqrt(p.k) * scale
    if p.dtype == "float16":
        tolerance = half_output_tolerance(ref, fp32_tolerance)
    else:
        # (the tensor cores truncate the inputs: the value term bounds the bias that gives)
        tolerance = fp32_tolerance + abs(layout.alpha) * tf32_tolerance(gemm_spread(op_a, op_b), op_a @ op_b)
    bad = ~(np.abs(out - ref) <= tolerance)  # NaN counts as bad
    where = f"{alg.name} {'emulated' if emulate else 'ptx'} {p.key} {layout} config={config}"
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} outputs wrong, first at {np.argwhere(bad)[0]}: "
        f"{out[bad][0]} vs {ref[bad][0]}; {where}"
    )
    np.testing.assert_array_equal(
        out_flat[~c_mask].view(np.uint8), c_flat[~c_mask].view(np.uint8), err_msg=f"wrote outside C: {where}"
    )


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


@pytest.mark.parametrize("dtype", DTYPES)
def test_applies_only_with_the_capability_and_its_dtype(dtype):
    alg, other = (F16_ALG, TF32_ALG) if dtype == "float16" else (TF32_ALG, F16_ALG)
    p = GemmProblem(64, 64, 64, dtype=dtype)
    assert alg.applies(p, H200) and not other.applies(p, H200)
    mma_only = _fake_device(capabilities=frozenset({runtime.MMA_TF32, runtime.MMA_F16, runtime.CP_ASYNC}))
    assert not alg.applies(p, mma_only)
    assert not alg.applies(p, types.SimpleNamespace(fingerprint=H200.fingerprint))
    for transposes in TRANSPOSES:  # every layout the backend passes
        assert alg.applies(problem((33, 17, 29), transposes, dtype), H200)


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
        ({"KWG": 12}, "KWG=12 not in"),
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

_spaces: dict[tuple[str, tuple[bool, bool]], list[dict[str, int]]] = {}


def random_config(dtype: str, index: int) -> tuple[tuple[bool, bool], dict[str, int]]:
    """Config ``index`` of a seeded draw from DRAW_SHAPE's space on the H200-like device."""
    transposes = TRANSPOSES[index % 4]
    if (dtype, transposes) not in _spaces:
        _spaces[(dtype, transposes)] = algorithm(dtype).space(problem(DRAW_SHAPE, transposes, dtype), H200).configs()
    return transposes, random.Random(9000 + index + (100 if dtype == "float16" else 0)).choice(
        _spaces[(dtype, transposes)]
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_configs_cover_the_variants(dtype):
    drawn = [random_config(dtype, i)[1] for i in range(RANDOM_CONFIGS)]
    assert len({tuple(sorted(c.items())) for c in drawn}) == len(drawn)
    for name in ("MWG", "NWG", "KWG", "WARPGROUPS", "STAGES", "SWIZZLE", "INFLIGHT"):
        assert len({c[name] for c in drawn}) > 1, f"random configs never vary {name}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_default_config_matches_numpy(device, rng, dtype, transposes, mode):
    alg = algorithm(dtype)
    for index, shape in enumerate(SHAPES):
        layout = LAYOUTS[index % len(LAYOUTS)]
        p = problem(shape, transposes, dtype, layout.batch)
        check_run(device, p, alg.default(p, H200), layout, rng, emulate=mode == "emulated")
    p = problem((257, 129, 65), transposes, dtype, batch=3)  # batch 3, offsets, ld > rows, gaps
    check_run(device, p, alg.default(p, H200), ALIGNED, rng, emulate=mode == "emulated")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=["nn", "nt", "tn", "tt"])
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
@pytest.mark.parametrize("position", range(len(PICKS)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_config_matches_numpy(device, rng, dtype, position, mode):
    index = PICKS[position]
    transposes, config = random_config(dtype, index)
    layouts = ([PACKED_NAN_C, ALIGNED] if index % 2 == 0 else [ALIGNED_NAN_C, UNALIGNED]) + [
        (BROADCAST_A, BROADCAST_B)[index % 4 // 2]
    ]
    for step, layout in enumerate(layouts):
        shape = SHAPES[(index + step) % len(SHAPES)]
        check_run(device, problem(shape, transposes, dtype, layout.batch), config, layout, rng,
                  emulate=mode == "emulated")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=["nn", "nt", "tn", "tt"])
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
        for index in range(4):
            transposes, config = random_config(dtype, index)
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
