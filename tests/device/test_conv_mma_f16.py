"""conv_implicit_gemm_mma_f16: the implicit-GEMM convolution on tensor cores for float16 problems
(half x, w, dy and outputs, fp32 bias, mma.sync m16n8k16 f16 with fp32 accumulation), all directions.

As test_conv_mma.py does for the TF32 family: on a device without the "mma_f16" capability (PoCL in CI)
the algorithm never applies, and its kernel is checked end to end by building it with ``emulate=True``
(``MMA_STUB``: plain OpenCL C computes the same .f16x2 fragments, reading each half with vload_half),
so every index of the f16 variant — the packing of two halves per register, KPAIR, PAD, STAGES, SPLIT
with its half-output reduction, bias, beta, the rounding of the output — runs against torch on the CPU
in float64 of the same half inputs. The same checks run with the real PTX where the device has the
capability and are skipped elsewhere.

Tolerance: the conv harness's for float16 problems: the fp32 tolerance of the reduction plus one
rounding of the output to half (``half_output_tolerance``: ``2**-11 * |ref|`` and the subnormal term).
"""

from __future__ import annotations

import functools
import types

import numpy as np
import draws
import pytest

from tunecl import kernels, runtime
from tunecl.cli import main
from tunecl.kernels.conv import conv_implicit_gemm_mma as mma_module
from tunecl.kernels.conv.conv_common import reduction_length
from tunecl.kernels.conv.conv_implicit_gemm_mma import ConvImplicitGemmMmaF16, ConvImplicitGemmMmaTF32
from tunecl.precision import FP32, TF32
from tunecl.problems import DIRECTIONS, ConvProblem
from tunecl.search.harness import reduction_tolerance
from tunecl.search.harness_conv import ConvHarness, operand_shapes, reference
from tunecl.search.measure import TimingPolicy
from tunecl.search.tuner import Tuner

MMA = ConvImplicitGemmMmaF16()
FAST = TimingPolicy(warmup=1, min_time=0.002, min_repeats=3, max_repeats=10, timeout=20.0)

# test_conv_mma.py's shapes, plus stride 3 and 32 groups
SHAPES = {
    "3x3_odd": "n=2,c=8,h=9,w=11,k=12,r=3,s=3,pad=1",          # H, W not multiples of any tile
    "3x3_s2": "n=2,c=6,h=10,w=9,k=8,r=3,s=3,stride=2,pad=1",
    "3x3_s3": "n=1,c=8,h=11,w=10,k=8,r=3,s=3,stride=3,pad=1",
    "3x3_p0": "n=1,c=8,h=7,w=9,k=8,r=3,s=3,pad=0",
    "3x3_p2_dil2": "n=1,c=4,h=10,w=9,k=6,r=3,s=3,pad=2,dil=2",
    "groups2": "n=2,c=8,h=7,w=8,k=6,r=3,s=3,pad=1,groups=2",
    "groups32": "n=2,c=64,h=6,w=5,k=64,r=3,s=3,pad=1,groups=32",
    "1x1_s2": "n=2,c=16,h=7,w=9,k=12,r=1,s=1,stride=2",
    "c3_7x7_s2_b1": "n=1,c=3,h=15,w=13,k=8,r=7,s=7,stride=2,pad=3",  # a first layer, batch 1
    "k1000": "n=1,c=8,h=3,w=3,k=1000,r=3,s=3,pad=1",
    "multi_tile": "n=2,c=40,h=12,w=12,k=72,r=3,s=3,pad=1",   # several tiles and steps everywhere
}
# per direction, spread over the shapes: a few per run, drawn with the day's seed; 8 with
# TUNECL_RANDOM_CONFIGS=full (tests/draws.py)
RANDOM_CONFIGS = draws.count(per_run=3, full=8)


def _fake_device(capabilities=frozenset({runtime.MMA_F16}), local_mem=48 * 1024, max_wg=1024):
    fingerprint = types.SimpleNamespace(vendor="NVIDIA Corporation", device_type="gpu", compute_units=132)
    return types.SimpleNamespace(local_mem_size=local_mem, max_work_group_size=max_wg,
                                 fingerprint=fingerprint, capabilities=capabilities)


H200 = _fake_device()   # an H200's limits (48 KiB local memory, 132 SMs), the capability granted


def has_capability(device) -> bool:
    return runtime.MMA_F16 in device.capabilities


needs_mma = pytest.mark.skipif("not has_capability(runtime.select_device())",
                               reason="the device has no mma_f16 capability (no f16 tensor cores via PTX)")
MODES = ["emulated", pytest.param("ptx", marks=[needs_mma, pytest.mark.gpu])]


def problem(shape: str, direction: str) -> ConvProblem:
    return ConvProblem.parse(SHAPES[shape] + ",dtype=float16").with_direction(direction)


def check_plan(device, p: ConvProblem, config, emulate: bool, seed: int = 0) -> None:
    """Build, run through the tuner's harness (beta 0 on a NaN output; beta 0.5 with a bias in fwd;
    inputs and guards untouched), verified at the fp32 tolerance plus one rounding to half."""
    plan = MMA.build(p, device, config, emulate=emulate)
    assert (plan.algorithm, plan.precision) == (MMA.name, FP32)
    binding = ConvHarness(p, device, seed=seed).bind(plan)
    try:
        message = binding.check()
    finally:
        binding.release()
    assert message is None, f"{p.key} {config}: {message}"


# ---- registration, applies, default plans -------------------------------------------------------------


def test_registered_right_after_the_tf32_family():
    names = [a.name for a in kernels.algorithms("conv")]
    assert names[-2:] == [ConvImplicitGemmMmaTF32.name, MMA.name]
    assert kernels.algorithm(MMA.name).precision == FP32


def test_applies_only_to_float16_problems_with_the_capability():
    p = problem("3x3_odd", "fwd")
    assert MMA.applies(p, H200)
    assert not MMA.applies(p, _fake_device(capabilities=frozenset({runtime.MMA_TF32})))
    assert not MMA.applies(p, types.SimpleNamespace(fingerprint=H200.fingerprint))   # no attribute: none
    fp32 = ConvProblem.parse(SHAPES["3x3_odd"])
    both = _fake_device(capabilities=frozenset({runtime.MMA_F16, runtime.MMA_TF32}))
    assert not MMA.applies(fp32, both) and ConvImplicitGemmMmaTF32().applies(fp32, both)
    assert not ConvImplicitGemmMmaTF32().applies(p, both)
    # no other family computes float16 problems: where it applies, it is the untuned default
    for shape in SHAPES:
        for direction in DIRECTIONS:
            found = [a.name for a in kernels.algorithms("conv") if a.applies(problem(shape, direction), both)]
            assert found == [MMA.name], (shape, direction, found)


def test_without_the_capability_it_never_applies(device):
    if has_capability(device):
        pytest.skip("this device has the capability")
    for shape in SHAPES:
        for direction in DIRECTIONS:
            p = problem(shape, direction)
            assert not any(a.applies(p, device) for a in kernels.algorithms("conv"))
    with pytest.raises(ValueError, match="mma_f16 capability"):
        MMA.build(problem("3x3_odd", "fwd"), device, MMA.default(problem("3x3_odd", "fwd"), H200))
    with pytest.raises(ValueError, match="does not apply"):   # an fp32 problem, even emulated
        p = ConvProblem.parse(SHAPES["3x3_odd"])
        MMA.build(p, device, MMA.default(problem("3x3_odd", "fwd"), H200), emulate=True)


def test_the_cli_says_no_algorithm_applies_to_a_float16_conv_here(device, tmp_path, capsys):
    if has_capability(device):
        pytest.skip("this device has the capability")
    spec = SHAPES["3x3_odd"] + ",dtype=float16"
    code = main(["tune", "--conv", spec, "--db", str(tmp_path / "t.sqlite"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert "no convolution algorithm applies to conv:" in err and "dtype=float16" in err, err
    assert MMA.name in err and "mma_f16" in err, err   # the family that would, and what it needs


# ---- spaces and defaults on an H200-like device -----------------------------------------------------

RESNET_LIKE = ["n=16,c=64,h=56,w=56,k=64,r=3,s=3,pad=1", "n=16,c=256,h=56,w=56,k=128,r=1,s=1,stride=2",
               "n=16,c=512,h=7,w=7,k=512,r=3,s=3,pad=1", "n=16,c=3,h=224,w=224,k=64,r=7,s=7,stride=2,pad=3",
               "n=1,c=2048,h=7,w=7,k=1000,r=1,s=1"]


@pytest.mark.parametrize("spec", RESNET_LIKE)
def test_spaces_stay_searchable_and_defaults_are_valid(spec):
    for direction in DIRECTIONS:
        p = ConvProblem.parse(spec + ",dtype=float16").with_direction(direction)
        space = MMA.space(p, H200)
        assert 100 <= len(space) <= 6000, (p.key, len(space))
        default = MMA.default(p, H200)
        assert space.is_valid(default), (p.key, default)
        assert {c["KWG"] for c in space.configs()} <= {16, 32, 64}
        for config in space.configs()[:: max(1, len(space) // 50)]:
            assert mma_module.local_memory_bytes(config, direction, f16=True) <= 48 * 1024
            assert 32 * mma_module.warps(config) <= 1024 and mma_module.accumulators(config) <= 128


def test_big_problems_get_big_deep_tiles_and_small_ones_a_split():
    big = MMA.default(ConvProblem.parse(RESNET_LIKE[0] + ",dtype=float16"), H200)
    assert big["MWG"] * big["NWG"] >= 64 * 64 and big["KWG"] == 32 and big["SPLIT"] == 1, big
    dw = MMA.default(ConvProblem.parse(RESNET_LIKE[0] + ",dtype=float16").with_direction("bwd_weight"), H200)
    assert dw["SPLIT"] > 1, dw


def test_local_memory_counts_halves():
    config = {"MWG": 128, "NWG": 128, "KWG": 32, "WARPS_M": 2, "WARPS_N": 4, "KPAIR": 1, "PAD": 1,
              "STAGES": 2, "SPLIT": 1}
    # A: 128 x (32 + 16) halves; B (GN-contiguous): 32 x (128 + 8) halves; two stages
    assert mma_module.local_memory_bytes(config, "fwd", f16=True) == 2 * 2 * (128 * 48 + 32 * 136)
    # B (GK-contiguous, bwd_weight): 128 x (32 + 16) halves
    assert mma_module.local_memory_bytes(config, "bwd_weight", f16=True) == 2 * 2 * (128 * 48 + 128 * 48)
    assert mma_module.local_memory_bytes({**config, "KWG": 16}, "bwd_weight", f16=True) == 2 * 2 * 2 * 128 * 16


@pytest.mark.parametrize("changes, violation", [
    ({"KWG": 8}, "KWG=8 not in"),   # shallower than one m16n8k16 step
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


# ---- correctness: default and random configs against torch (float64) ------------------------------


@functools.cache
def _space_configs(shape: str, direction: str) -> list[dict[str, int]]:
    return MMA.space(problem(shape, direction), H200).configs()


def random_configs(direction: str, seed: int | None = None) -> list[tuple[str, dict[str, int]]]:
    """RANDOM_CONFIGS distinct (shape, config) pairs for a direction, configs drawn from the H200-like
    space with the day's seed (or ``seed``), shapes every third from a drawn start."""
    return draws.shape_configs(draws.rng(f"conv_mma_f16/{direction}", seed), list(SHAPES),
                               lambda shape: _space_configs(shape, direction), RANDOM_CONFIGS, stride=3)


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
    for name, values in (("KPAIR", {0, 1}), ("PAD", {0, 1}), ("STAGES", {1, 2}), ("KWG", {16, 32, 64})):
        assert {c[name] for c in drawn} == values, name
    assert any(c["SPLIT"] > 1 for c in drawn) and any(c["MWG"] >= 64 for c in drawn)
    assert any(c["WARPS_M"] * c["WARPS_N"] >= 4 for c in drawn)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("split", [1, 2])
def test_the_output_is_rounded_once_to_nearest_even(device, mode, split):
    """Against float64 of the same half inputs rounded once to half: nearly every element equal (an
    fp32 sum can land on the other side of a rounding boundary: then one half ulp apart), none further
    than one ulp plus the fp32 error of the sum (which exceeds an ulp only where terms cancel); with and
    without the split's fp32 partial sums."""
    p = problem("multi_tile", "bwd_weight")
    config = {"MWG": 32, "NWG": 64, "KWG": 32, "WARPS_M": 2, "WARPS_N": 2, "KPAIR": 1, "PAD": 1,
              "STAGES": 2, "SPLIT": split}
    plan = MMA.build(p, device, config, emulate=mode == "emulated")
    rng = np.random.default_rng(7)
    a_shape, b_shape, out_shape = operand_shapes(p)
    a = rng.uniform(-1, 1, a_shape).astype(np.float16)
    b = rng.uniform(-1, 1, b_shape).astype(np.float16)
    out = device.upload(np.full(out_shape, np.nan, np.float16))
    plan.run(device.upload(a), device.upload(b), out)
    device.synchronize()
    got = device.download(out, out_shape, np.float16)
    exact = reference(p, a, b, None)
    rounded = exact.astype(np.float16)
    assert np.mean(got == rounded) > 0.99
    ulp = np.spacing(np.abs(rounded)).astype(np.float64)
    fp32 = reduction_tolerance(reduction_length(p)) * reference(p, np.abs(a), np.abs(b), None)
    assert np.all(np.abs(got.astype(np.float64) - exact) <= ulp + fp32)


def test_split_reduction_is_deterministic(device):
    p = problem("multi_tile", "bwd_weight")
    config = {"MWG": 32, "NWG": 64, "KWG": 16, "WARPS_M": 2, "WARPS_N": 2, "KPAIR": 1, "PAD": 1,
              "STAGES": 2, "SPLIT": 4}
    plan = MMA.build(p, device, config, emulate=True)
    assert plan.workspace_bytes == 4 * int(np.prod(p.weight_shape)) * 4   # fp32 partial sums
    rng = np.random.default_rng(3)
    a_shape, b_shape, out_shape = operand_shapes(p)
    a = device.upload(rng.uniform(-1, 1, a_shape).astype(np.float16))
    b = device.upload(rng.uniform(-1, 1, b_shape).astype(np.float16))
    results = []
    for _ in range(2):
        out = device.upload(np.zeros(out_shape, np.float16))
        assert len(plan.run(a, b, out)) == 2   # the kernel and the fixed-order split_reduce
        device.synchronize()
        results.append(device.download(out, out_shape, np.float16))
    assert np.array_equal(results[0].view(np.uint16), results[1].view(np.uint16))


# ---- the harness and the tuner at float16 -------------------------------------------------------------


def test_the_harness_checks_float16_problems_on_half_buffers(device):
    p = problem("multi_tile", "fwd")
    harness = ConvHarness(p, device)
    data = harness._prepare()
    assert data["a"].dtype == data["b"].dtype == data["out_nan"].dtype == np.float16
    assert data["bias"].dtype == np.float32   # half values, as the backend passes a half bias
    g = harness.guard
    bias = data["bias"][g:-g]
    assert np.array_equal(bias, bias.astype(np.float16).astype(np.float32))
    plan = MMA.build(p, device, MMA.default(p, H200), emulate=True)
    binding = harness.bind(plan)
    try:
        binding.launch()
        device.synchronize()
        out = device.download(binding.out, data["out0"].shape, np.float16)
    finally:
        binding.release()
    assert harness.compare(out, 0.0, False, plan.algorithm, FP32) is None
    wrong = out.copy()
    wrong[g + 5] += np.float16(0.25)   # one misplaced term
    assert "1 of" in harness.compare(wrong, 0.0, False, plan.algorithm, FP32)
    guard = out.copy()
    guard[g - 1] = 0   # a write into the half guard
    assert "guard region before" in harness.compare(guard, 0.0, False, plan.algorithm, FP32)


class EmulatedConvMmaF16(ConvImplicitGemmMmaF16):
    """conv_implicit_gemm_mma_f16 made to apply here, built with the plain-C mma (plumbing, not speed)."""

    def applies(self, problem, device):
        return problem.kind == "conv" and problem.dtype == "float16"

    def space(self, problem, device):
        return super().space(problem, H200)   # a GPU's limits keep the space small

    def default(self, problem, device):
        return super().default(problem, H200)

    def build(self, problem, device, config, *, emulate=True):
        return super().build(problem, device, config, emulate=True)


@pytest.mark.parametrize("precision", [FP32, TF32])
def test_a_float16_study_verifies_the_f16_conv(device, tmp_path, precision):
    p = problem("3x3_odd", "bwd_data")
    storage = f"sqlite:///{tmp_path / 'studies.sqlite'}"
    tuner = Tuner(device, storage, algorithms=kernels.algorithms("conv")[:-1] + [EmulatedConvMmaF16()],
                  precision=precision, policy=FAST)
    assert [a.name for a in tuner.applicable(p)] == [MMA.name]
    outcome = tuner.tune(p, trials=4)
    assert outcome.precisions == {MMA.name: FP32}
    assert outcome.per_algorithm[MMA.name].ok, outcome.per_algorithm
    assert outcome.winner is not None and outcome.winner.algorithm == MMA.name
