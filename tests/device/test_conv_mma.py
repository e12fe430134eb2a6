"""conv_implicit_gemm_mma_tf32: the implicit-GEMM convolution on tensor cores (TF32), all directions.

On a device without the "mma_tf32" capability (PoCL in CI) the algorithm never applies, so no default
plan and no fp32 study ever sees it; its kernel is still checked end to end there by building it with
``emulate=True``, which replaces the PTX (cvt.rna.tf32.f32, mma.sync m16n8k8) by plain OpenCL C that
computes the same fragments (``MMA_STUB``): every index of the kernel (im2col gathers, edges, strides,
padding, dilation, groups, KPAIR, PAD, STAGES, SPLIT with its fixed-order reduction, bias, beta) runs
against torch on the CPU in float64. The same checks run with the real PTX where the device has the
capability (an NVIDIA GPU whose probe passed) and are skipped elsewhere.

Tolerance: the conv harness's (``tunecl.search.harness_conv``): the fp32 tolerance of the reduction
plus, for a TF32 plan, ``tf32_tolerance`` of the exact 2-norm of each output's terms.
"""

from __future__ import annotations

import functools
import types

import draws
import numpy as np
import pytest

from tunecl import kernels, runtime
from tunecl.kernels.conv import conv_implicit_gemm_mma as mma_module
from tunecl.kernels.conv.conv_implicit_gemm import ConvImplicitGemm
from tunecl.kernels.conv.conv_implicit_gemm_mma import ConvImplicitGemmMmaTF32
from tunecl.precision import FP32, TF32, algorithm_precision, tf32_round
from tunecl.problems import DIRECTIONS, ConvProblem
from tunecl.search.harness_conv import ConvHarness, operand_shapes, reference
from tunecl.search.measure import TimingPolicy
from tunecl.search.tuner import Tuner

MMA = ConvImplicitGemmMmaTF32()
FAST = TimingPolicy(warmup=1, min_time=0.002, min_repeats=3, max_repeats=10, timeout=20.0)

SHAPES = {
    "3x3_odd": "n=2,c=8,h=9,w=11,k=12,r=3,s=3,pad=1",          # H, W not multiples of any tile
    "3x3_s2": "n=2,c=6,h=10,w=9,k=8,r=3,s=3,stride=2,pad=1",
    "3x3_p0": "n=1,c=8,h=7,w=9,k=8,r=3,s=3,pad=0",
    "3x3_p2_dil2": "n=1,c=4,h=10,w=9,k=6,r=3,s=3,pad=2,dil=2",
    "groups2": "n=2,c=8,h=7,w=8,k=6,r=3,s=3,pad=1,groups=2",
    "1x1_s2": "n=2,c=16,h=7,w=9,k=12,r=1,s=1,stride=2",
    "c3_7x7_s2_b1": "n=1,c=3,h=15,w=13,k=8,r=7,s=7,stride=2,pad=3",  # a first layer, batch 1
    "k1000": "n=1,c=8,h=3,w=3,k=1000,r=3,s=3,pad=1",
    "multi_tile": "n=2,c=40,h=12,w=12,k=72,r=3,s=3,pad=1",   # several tiles and steps everywhere
}
# per direction, spread over the shapes: a few per run, drawn with the day's seed; 8 with
# TUNECL_RANDOM_CONFIGS=full (tests/draws.py)
RANDOM_CONFIGS = draws.count(per_run=3, full=8)


def _fake_device(capabilities=frozenset({runtime.MMA_TF32}), local_mem=48 * 1024, max_wg=1024):
    fingerprint = types.SimpleNamespace(vendor="NVIDIA Corporation", device_type="gpu", compute_units=132)
    return types.SimpleNamespace(local_mem_size=local_mem, max_work_group_size=max_wg,
                                 fingerprint=fingerprint, capabilities=capabilities)


H200 = _fake_device()   # an H200's limits (48 KiB local memory, 132 SMs), the capability granted


def has_capability(device) -> bool:
    return runtime.MMA_TF32 in device.capabilities


needs_mma = pytest.mark.skipif("not has_capability(runtime.select_device())",
                               reason="the device has no mma_tf32 capability (no tensor cores via PTX)")
MODES = ["emulated", pytest.param("ptx", marks=[needs_mma, pytest.mark.gpu])]


def problem(shape: str, direction: str) -> ConvProblem:
    return ConvProblem.parse(SHAPES[shape]).with_direction(direction)


def check_plan(device, p: ConvProblem, config, emulate: bool, seed: int = 0) -> None:
    """Build, run through the tuner's harness (beta 0 on a NaN output; beta 0.5 with a bias in fwd;
    inputs and guards untouched), verified at the TF32 tolerance."""
    plan = MMA.build(p, device, config, emulate=emulate)
    assert (plan.algorithm, plan.precision) == (MMA.name, TF32)
    binding = ConvHarness(p, device, seed=seed).bind(plan)
    try:
        message = binding.check()
    finally:
        binding.release()
    assert message is None, f"{p.key} {config}: {message}"


# ---- registration, applies, default plans -------------------------------------------------------------


def test_registered_after_every_fp32_conv_family():
    algorithms = kernels.algorithms("conv")
    names = [a.name for a in algorithms]
    # the TF32 families, then only the float16 sibling (which never applies to fp32 problems)
    assert names[-2:] == [MMA.name, "conv_implicit_gemm_mma_f16"]
    assert kernels.algorithm(MMA.name).precision == TF32
    precisions = [algorithm_precision(a) for a in algorithms[:-1]]
    first_tf32 = precisions.index(TF32)
    assert set(precisions[:first_tf32]) == {FP32} and set(precisions[first_tf32:]) == {TF32}


def test_applies_only_with_the_capability():
    p = problem("3x3_odd", "fwd")
    assert MMA.applies(p, H200)
    assert not MMA.applies(p, _fake_device(capabilities=frozenset()))
    assert not MMA.applies(p, types.SimpleNamespace(fingerprint=H200.fingerprint))   # no attribute: none
    assert not MMA.applies(ConvProblem.parse(SHAPES["3x3_odd"] + ",dtype=float16"), H200)
    # wherever it applies, the fp32 implicit GEMM (earlier in the order) does too: never the default
    for shape in SHAPES:
        for direction in DIRECTIONS:
            assert ConvImplicitGemm().applies(problem(shape, direction), H200)


def test_without_the_capability_it_never_applies_nor_serves_a_default(device):
    if has_capability(device):
        pytest.skip("this device has the capability")
    for shape in SHAPES:
        for direction in DIRECTIONS:
            p = problem(shape, direction)
            assert not MMA.applies(p, device)
            first = next(a for a in kernels.algorithms("conv") if a.applies(p, device))
            assert first.name != MMA.name
    with pytest.raises(ValueError, match="mma_tf32 capability"):
        MMA.build(problem("3x3_odd", "fwd"), device, MMA.default(problem("3x3_odd", "fwd"), H200))


# ---- spaces and defaults on an H200-like device -----------------------------------------------------

RESNET_LIKE = ["n=16,c=64,h=56,w=56,k=64,r=3,s=3,pad=1", "n=16,c=256,h=56,w=56,k=128,r=1,s=1,stride=2",
               "n=16,c=512,h=7,w=7,k=512,r=3,s=3,pad=1", "n=16,c=3,h=224,w=224,k=64,r=7,s=7,stride=2,pad=3",
               "n=1,c=2048,h=7,w=7,k=1000,r=1,s=1"]


@pytest.mark.parametrize("spec", RESNET_LIKE)
def test_spaces_stay_searchable_and_defaults_are_valid(spec):
    for direction in DIRECTIONS:
        p = ConvProblem.parse(spec).with_direction(direction)
        space = MMA.space(p, H200)
        assert 100 <= len(space) <= 6000, (p.key, len(space))
        default = MMA.default(p, H200)
        assert space.is_valid(default), (p.key, default)
        for config in space.configs()[:: max(1, len(space) // 50)]:
            assert mma_module.local_memory_bytes(config, direction) <= 48 * 1024
            assert 32 * mma_module.warps(config) <= 1024 and mma_module.accumulators(config) <= 128


def test_big_problems_get_big_tiles_and_small_ones_a_split():
    big = MMA.default(ConvProblem.parse(RESNET_LIKE[0]), H200)
    assert big["MWG"] * big["NWG"] >= 64 * 64 and big["SPLIT"] == 1, big
    dw = MMA.default(ConvProblem.parse(RESNET_LIKE[0]).with_direction("bwd_weight"), H200)
    assert dw["SPLIT"] > 1, dw


@pytest.mark.parametrize("changes, violation", [
    ({"MWG": 48}, "MWG=48 not in"),
    ({"MWG": 16, "WARPS_M": 2}, "warp_tile_rows_multiple_of_16"),
    ({"MWG": 256, "NWG": 256, "WARPS_M": 1, "WARPS_N": 1}, "at_most_128_accumulators"),
    ({"SPLIT": 64}, "split_has_work"),
])
def test_invalid_configs_are_named_and_never_compiled(device, monkeypatch, changes, violation):
    p = problem("3x3_odd", "bwd_weight")
    config = {**MMA.default(p, H200), **changes}
    monkeypatch.setattr(device, "build", lambda *a, **k: pytest.fail("compiled an invalid config"))
    with pytest.raises(ValueError, match=violation):
        MMA.build(p, device, config, emulate=True)


def test_local_memory_limit_is_a_named_constraint():
    small = _fake_device(local_mem=16 * 1024)
    p = ConvProblem.parse(RESNET_LIKE[0])
    config = {"MWG": 128, "NWG": 128, "KWG": 32, "WARPS_M": 2, "WARPS_N": 4, "KPAIR": 1, "PAD": 1,
              "STAGES": 1, "SPLIT": 1}   # 37 KiB
    assert "local_memory_within_device" in MMA.space(p, small).violations(config)
    assert "local_memory_within_device" not in MMA.space(p, H200).violations(config)
    assert "local_memory_within_device" in MMA.space(p, H200).violations({**config, "STAGES": 2})


# ---- correctness: default and random configs against torch (float64) ------------------------------


@functools.cache
def _space_configs(shape: str, direction: str) -> list[dict[str, int]]:
    return MMA.space(problem(shape, direction), H200).configs()


def random_configs(direction: str, seed: int | None = None) -> list[tuple[str, dict[str, int]]]:
    """RANDOM_CONFIGS distinct (shape, config) pairs for a direction, configs drawn from the H200-like
    space with the day's seed (or ``seed``), shapes in turn from a drawn start."""
    return draws.shape_configs(draws.rng(f"conv_mma/{direction}", seed), list(SHAPES),
                               lambda shape: _space_configs(shape, direction), RANDOM_CONFIGS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_default_config_matches_torch(device, direction, mode):
    for index, shape in enumerate(SHAPES):
        p = problem(shape, direction)
        config = MMA.default(p, H200 if mode == "emulated" else device)
        check_plan(device, p, config, emulate=mode == "emulated", seed=index)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_random_configs_match_torch(device, direction, mode):
    drawn = random_configs(direction)
    assert len({tuple(sorted(c.items())) for _, c in drawn}) == RANDOM_CONFIGS
    for index, (shape, config) in enumerate(drawn):
        check_plan(device, problem(shape, direction), config, emulate=mode == "emulated", seed=100 + index)


def test_random_configs_cover_the_variants():
    """The draws of seeds 1-21 (three weeks of days) together cover every variant."""
    drawn = [c for seed in range(1, 22) for d in DIRECTIONS for _, c in random_configs(d, seed)]
    for name, values in (("KPAIR", {0, 1}), ("PAD", {0, 1}), ("STAGES", {1, 2})):
        assert {c[name] for c in drawn} == values, name
    assert any(c["SPLIT"] > 1 for c in drawn) and any(c["MWG"] >= 64 for c in drawn)
    assert any(c["WARPS_M"] * c["WARPS_N"] >= 4 for c in drawn)


@pytest.mark.parametrize("mode", MODES)
def test_inputs_are_really_rounded_to_tf32(device, mode):
    """The result matches torch on TF32-rounded inputs within the fp32 tolerance, and misses the
    exact result by more than it: the rounding happens (once per element, to nearest)."""
    p = problem("multi_tile", "fwd")
    config = MMA.default(p, H200 if mode == "emulated" else device)
    plan = MMA.build(p, device, config, emulate=mode == "emulated")
    rng = np.random.default_rng(7)
    a_shape, b_shape, out_shape = operand_shapes(p)
    a = rng.uniform(-1, 1, a_shape).astype(np.float32)
    b = rng.uniform(-1, 1, b_shape).astype(np.float32)
    out = device.upload(np.full(out_shape, np.nan, np.float32))
    plan.run(device.upload(a), device.upload(b), out)
    device.synchronize()
    got = device.download(out, out_shape).astype(np.float64)
    rounded = reference(p, tf32_round(a).astype(np.float64), tf32_round(b).astype(np.float64), None)
    exact = reference(p, a, b, None)
    assert np.max(np.abs(got - rounded)) < 1e-4
    assert np.max(np.abs(got - exact)) > 1e-3


def test_split_reduction_is_deterministic(device):
    p = problem("multi_tile", "bwd_weight")
    config = {"MWG": 32, "NWG": 64, "KWG": 16, "WARPS_M": 2, "WARPS_N": 2, "KPAIR": 1, "PAD": 1,
              "STAGES": 2, "SPLIT": 4}
    plan = MMA.build(p, device, config, emulate=True)
    assert plan.workspace_bytes == 4 * int(np.prod(p.weight_shape)) * 4
    rng = np.random.default_rng(3)
    a_shape, b_shape, out_shape = operand_shapes(p)
    a = device.upload(rng.uniform(-1, 1, a_shape).astype(np.float32))
    b = device.upload(rng.uniform(-1, 1, b_shape).astype(np.float32))
    results = []
    for _ in range(2):
        out = device.upload(np.zeros(out_shape, np.float32))
        assert len(plan.run(a, b, out)) == 2   # the kernel and the fixed-order split_reduce
        device.synchronize()
        results.append(device.download(out, out_shape))
    assert np.array_equal(results[0].view(np.uint32), results[1].view(np.uint32))


# ---- the harness and the tuner at TF32 -------------------------------------------------------------


def test_the_harness_checks_tf32_plans_at_the_tf32_tolerance(device):
    p = problem("multi_tile", "fwd")
    harness = ConvHarness(p, device)
    plan = MMA.build(p, device, MMA.default(p, H200), emulate=True)
    binding = harness.bind(plan)
    try:
        binding.launch()
        device.synchronize()
        out = device.download(binding.out, harness._prepare()["out0"].shape)
    finally:
        binding.release()
    assert harness.compare(out, 0.0, False, plan.algorithm, TF32) is None
    assert harness.compare(out, 0.0, False, plan.algorithm, FP32) is not None   # TF32 misses fp32's
    with pytest.raises(ValueError, match="precision"):
        harness.compare(out, 0.0, False, plan.algorithm, "fp16")


class EmulatedConvMma(ConvImplicitGemmMmaTF32):
    """conv_implicit_gemm_mma_tf32 made to apply here, built with the plain-C mma (plumbing, not speed)."""

    def applies(self, problem, device):
        return problem.kind == "conv" and problem.dtype == "float32"

    def space(self, problem, device):
        return super().space(problem, H200)   # a GPU's limits keep the space small

    def default(self, problem, device):
        return super().default(problem, H200)

    def build(self, problem, device, config, *, emulate=True):
        return super().build(problem, device, config, emulate=True)


def test_a_tf32_study_verifies_the_tf32_conv_and_a_strict_one_never_sees_it(device, tmp_path):
    p = problem("3x3_odd", "bwd_data")
    storage = f"sqlite:///{tmp_path / 'studies.sqlite'}"
    both = [ConvImplicitGemm(), EmulatedConvMma()]
    assert [a.name for a in Tuner(device, storage, algorithms=both).applicable(p)] == ["conv_implicit_gemm"]
    tuner = Tuner(device, storage, algorithms=both, precision="tf32", policy=FAST)
    outcome = tuner.tune(p, trials=4)
    assert outcome.precisions == {"conv_implicit_gemm": FP32, MMA.name: TF32}
    assert outcome.per_algorithm[MMA.name].ok, outcome.per_algorithm   # verified at the TF32 tolerance
