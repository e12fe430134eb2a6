"""gemm_mma_f16 (float16 GEMM on tensor cores through inline PTX) and the "mma_f16" capability: what is
the family's own. Its results against numpy (emulated on any device, with the real PTX where the
capability is granted: defaults and random configs on the edge shapes and layouts, with the half
output's rounding in the tolerance) are checked by ``test_gemm_contract.py`` with every GEMM family.

As for gemm_mma_tf32 (``test_gemm_mma.py``): on a device without the capability (PoCL in CI) the
algorithm never applies, and its kernel is built with ``emulate=True`` (``MMA_STUB``: plain OpenCL C
computes the m16n8k16 fragments from the same per-lane .f16x2 registers).
"""

from __future__ import annotations

import warnings

import draw_spaces
import numpy as np
import pyopencl as cl
import pytest
from gemm_checks import PACKED_NAN_C, TRANSPOSES, check_run, gpu_double

from tunecl import kernels, runtime
from tunecl.db import TuningDB
from tunecl.kernels.gemm import gemm_mma
from tunecl.kernels.gemm.gemm_mma import GemmMmaF16, GemmMmaTF32
from tunecl.precision import FP32, TF32
from tunecl.problems import GemmProblem
from tunecl.runtime import probes
from tunecl.search.harness import GemmHarness
from tunecl.search.measure import TimingPolicy
from tunecl.search.tuner import NoAlgorithmError, Tuner
from tunecl.tune import record_outcome

MMA = GemmMmaF16()
FAST = TimingPolicy(warmup=1, min_time=0.002, min_repeats=3, max_repeats=10, timeout=20.0)
ALL = frozenset({runtime.MMA_TF32, runtime.CP_ASYNC, runtime.MMA_F16})


def _fake_device(capabilities=ALL, local_mem=48 * 1024, max_wg=1024):
    return gpu_double(local_mem=local_mem, max_wg=max_wg, capabilities=capabilities)


H200 = _fake_device()


def has_capability(device) -> bool:
    return runtime.MMA_F16 in device.capabilities


def problem(shape, transposes, batch=1) -> GemmProblem:
    return GemmProblem(*shape, *transposes, batch=batch, dtype="float16")


# ---- the capability and the registry -----------------------------------------------------------------


def test_registered_after_the_tf32_family():
    names = [a.name for a in kernels.algorithms("gemm")]
    assert names.index("gemm_mma_f16") > names.index("gemm_mma_tf32") > 1
    algorithm = kernels.algorithm("gemm_mma_f16")
    assert isinstance(algorithm, GemmMmaF16) and algorithm.precision == FP32 and algorithm.kind == "gemm"
    assert kernels.algorithm("gemm_mma_tf32").precision == TF32


def test_only_the_f16_family_applies_to_float16_where_every_capability_is_granted():
    """(Without wgmma: where it is granted too, gemm_wgmma_f16 comes first, test_gemm_wgmma.py.)"""
    p = GemmProblem(64, 64, 64, dtype="float16")
    assert [a.name for a in kernels.algorithms("gemm") if a.applies(p, H200)] == ["gemm_mma_f16"]


def test_without_the_capability_nothing_applies_to_float16(device, tmp_path):
    if has_capability(device):
        pytest.skip("this device has the capability")
    assert runtime.MMA_F16 not in device.capabilities
    p = GemmProblem(64, 64, 64, dtype="float16")
    assert not [a.name for a in kernels.algorithms("gemm") if a.applies(p, device)]
    with pytest.raises(NoAlgorithmError, match="dtype=float16"):
        Tuner(device, f"sqlite:///{tmp_path / 'studies.sqlite'}").applicable(p)


def test_the_f16_probe_fails_quietly_where_ptx_does_not_compile(device):
    if has_capability(device):
        pytest.skip("this device has the capability")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reason = runtime.capability_probes(device, force=True)[runtime.MMA_F16]
    assert reason.startswith(("build failed", "launch failed", "wrong result")) and not caught


def test_the_f16_probe_data_tells_wrong_fragments_apart():
    a, b, c = probes._mma_f16_probe_data()
    assert a.dtype == b.dtype == np.float16 and a.shape == (16, 16) and b.shape == (16, 8)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    right = a64 @ b64 + c
    assert np.array_equal(right, (a.astype(np.float32) @ b.astype(np.float32) + c))  # exact in fp32

    def bfloat16(x):
        return (x.astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32).astype(np.float64)

    swap_pairs = np.arange(16).reshape(8, 2)[:, ::-1].ravel()  # the halves of each .f16x2 swapped
    wrong = {
        "bfloat16 operands": bfloat16(a) @ bfloat16(b) + c,
        "halves of the A registers swapped": a64[:, swap_pairs] @ b64 + c,
        "halves of the B registers swapped": a64 @ b64[swap_pairs] + c,
        "k halves 0-7 and 8-15 exchanged in A": a64[:, np.r_[8:16, 0:8]] @ b64 + c,
        "B columns mirrored": a64 @ b64[:, ::-1] + c,
        "no accumulate": a64 @ b64,
    }
    for name, result in wrong.items():
        assert np.abs(result - right).max() > 1e-3, name


# ---- the space on an H200-like device ------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, low, high",
    [("4096,4096,4096", 500, 6000), ("1024,1024,1024", 500, 6000), ("64,1000,2048", 100, 6000), ("1,1,1", 1, 100)],
)
def test_space_on_an_h200_like_device(spec, low, high):
    p = GemmProblem.from_spec(spec + ",dtype=float16")
    configs = MMA.space(p, H200).configs()
    assert low <= len(configs) <= high
    assert MMA.default(p, H200) in configs
    assert all(gemm_mma.local_memory_bytes(c, p) <= 48 * 1024 for c in configs)
    assert {c["KWG"] for c in configs} <= {16, 32, 64}


def test_default_and_fast_shapes_on_an_h200_like_device():
    p = GemmProblem(4096, 4096, 4096, dtype="float16")
    default = MMA.default(p, H200)
    assert default == {
        "MWG": 128, "NWG": 128, "KWG": 32, "WARPS_M": 2, "WARPS_N": 4, "VW": 8, "KPAIR": 1, "PAD": 1,
        "ASYNC": 0, "STAGES": 2, "GM": 8, "MAXRREG": 0,
    }
    for transposes in TRANSPOSES:  # two stages of 128 x 128 x 32 halves fit 48 KiB in every layout
        assert gemm_mma.local_memory_bytes(default, problem((4096,) * 3, transposes)) <= 48 * 1024
    configs = MMA.space(p, H200).configs()
    for name in ("KWG", "KPAIR", "PAD", "ASYNC", "STAGES", "GM", "MAXRREG"):
        assert len({c[name] for c in configs}) > 1, f"the 4096^3 space never varies {name}"
    # the widest loads the tile and the packed layout allow (128-bit where the tile splits evenly)
    assert {c["VW"] for c in configs} == {4, 8}
    assert all(c["VW"] == 8 for c in configs if c["MWG"] * c["KWG"] % (256 * gemm_mma.warps(c)) == 0
               and c["NWG"] * c["KWG"] % (256 * gemm_mma.warps(c)) == 0)
    odd = MMA.space(GemmProblem(512, 512, 511, dtype="float16"), H200).configs()
    assert 8 in {c["VW"] for c in odd}  # B (K x N) still takes 8; A's scalar variant is the plan's
    smaller = MMA.default(GemmProblem(1024, 1024, 1024, dtype="float16"), H200)
    assert (smaller["MWG"], smaller["NWG"]) == (64, 64)


def test_padding_mirrors_the_kernel_rules():
    base = {"PAD": 1, "KPAIR": 1, "KWG": 32}
    assert gemm_mma.padding(base, True, f16=True) == 16  # KWG/16 even: an odd multiple of 8 words
    assert gemm_mma.padding({**base, "KWG": 16}, True, f16=True) == 0
    assert gemm_mma.padding({**base, "KPAIR": 0}, True, f16=True) == 8
    assert gemm_mma.padding(base, False, f16=True) == 8
    assert gemm_mma.padding({**base, "PAD": 0}, False, f16=True) == 0
    assert gemm_mma.padding(base, True) == 8 and gemm_mma.padding(base, False) == 4  # TF32 unchanged


@pytest.mark.parametrize(
    "changes, violation",
    [
        ({"MWG": 32, "WARPS_M": 4}, "warp_tile_rows_multiple_of_16"),
        ({"MWG": 256, "NWG": 128, "WARPS_M": 2, "WARPS_N": 2}, "at_most_128_accumulators"),
        ({"KWG": 64, "STAGES": 2}, "local_memory_within_device"),
        ({"ASYNC": 0, "STAGES": 3}, "STAGES_1_or_2_through_registers"),
        ({"MWG": 16, "NWG": 16, "WARPS_M": 1, "WARPS_N": 2, "KWG": 16, "VW": 8}, "A_tile_loads_split_evenly"),
    ],
)
def test_invalid_configs_are_named_and_never_compiled(device, monkeypatch, changes, violation):
    p = GemmProblem(4096, 4096, 4096, dtype="float16")
    config = {**MMA.default(p, H200), **changes}
    assert any(violation in v for v in MMA.space(p, H200).violations(config))
    monkeypatch.setattr(device, "build", _refuse_to_compile)
    with pytest.raises(ValueError, match=violation.split("=")[0]):
        MMA.build(p, H200, config)


def _refuse_to_compile(*args, **kwargs):
    raise AssertionError("an invalid config reached the compiler")


# ---- correctness beyond the contract's, and the draws it runs -------------------------------------------


def test_random_configs_cover_the_variants():
    drawn = [draw_spaces.random_config(MMA, i)[1] for i in range(draw_spaces.RANDOM_FULL)]
    assert len({tuple(sorted(c.items())) for c in drawn}) == len(drawn)
    for name in ("MWG", "NWG", "KWG", "WARPS_M", "WARPS_N", "KPAIR", "PAD", "ASYNC", "STAGES"):
        assert len({c[name] for c in drawn}) > 1, f"random configs never vary {name}"


def _emulated(p, device, config):
    return MMA.build(p, device, config, emulate=True)


def test_the_default_at_h200_size_with_cp_async(device, rng):
    """The 128 x 128 x 32 default (VW 8, KPAIR, padding) and its cp.async form on a matrix of several
    tiles in every dimension (the emulated build needs the local memory of a CPU device)."""
    if device.local_mem_size < 64 * 1024:
        pytest.skip("the emulated 128 x 128 tiles need more local memory than this device has")
    for transposes in TRANSPOSES:
        p = problem((257, 263, 97), transposes)
        default = MMA.default(GemmProblem(4096, 4096, 4096, *transposes, dtype="float16"), H200)
        for config in (default, {**default, "ASYNC": 1, "STAGES": 3, "KWG": 16}):
            check_run(device, MMA, p, config, PACKED_NAN_C, rng, build=_emulated)


def test_output_is_rounded_to_nearest_even(device):
    """Outputs exactly halfway between two halves go to the even one (vstore_half_rte), and alpha,
    beta apply in fp32 before that one rounding."""
    p = GemmProblem(16, 8, 1, dtype="float16")
    plan = MMA.build(p, device, MMA.default(p, H200), emulate=True)
    # a (m) * b (n) = 1 + (odd) * 2**-11: exactly between 1 + k * 2**-10 and its neighbour
    a = (1 + (2 * np.arange(16) + 1) * 2.0**-11).astype(np.float32)  # not halves: passed as alpha below
    ones = np.ones((16, 1), np.float16)
    b = np.ones((1, 8), np.float16)
    c = np.zeros((16, 8), np.float16)
    bufs = [device.upload(ones), device.upload(b), device.upload(c)]
    for row, alpha in enumerate(a):
        plan.run(*bufs, alpha=float(alpha), beta=0.0)[-1].wait()
        out = device.download(bufs[2], (16, 8), np.float16)
        assert np.all(out.astype(np.float64) == np.float64(np.float16(alpha))), (row, alpha, out[0, 0])
    plan.run(*bufs, alpha=2.0**-11, beta=1.0)[-1].wait()  # C = 1 (from the last run) + 2**-11: a tie
    out = device.download(bufs[2], (16, 8), np.float16)
    expected = np.float16(np.float16(a[-1]).astype(np.float64) + 2.0**-11)
    assert np.all(out == expected)


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


# ---- verification and tuning of float16 problems -------------------------------------------------------


class EmulatedF16(GemmMmaF16):
    """gemm_mma_f16 made to apply here, built with the plain-C mma (the plumbing, not the speed)."""

    def applies(self, problem, device):
        return isinstance(problem, GemmProblem) and problem.dtype == "float16"

    def space(self, problem, device):
        return super().space(problem, H200)

    def build(self, problem, device, config, *, emulate=True):
        return super().build(problem, device, config, emulate=True)


def test_the_harness_verifies_half_buffers_and_catches_a_wrong_term(device):
    p = GemmProblem(33, 17, 29, True, False, batch=2, dtype="float16")
    harness = GemmHarness(p, device)
    algorithm = EmulatedF16()
    binding = harness.bind(algorithm.build(p, device, algorithm.default(p, device)))
    try:
        assert binding.check() is None
        data = harness._prepare()
        assert data["a"].dtype == data["c"].dtype == np.float16
        binding._run(1.0, 0.0)[-1].wait()
        out = device.download(binding.c, data["c"].shape, np.float16)
        assert harness.compare(out, 1.0, 0.0) is None
        a0 = data["a"][harness.guard:harness.guard + p.k * p.m].reshape(p.k, p.m).astype(np.float64)
        b0 = data["b"][harness.guard:harness.guard + p.k * p.n].reshape(p.k, p.n).astype(np.float64)
        k = int(np.argmax(np.abs(a0[:, 0] * b0[:, 5])))
        wrong = out.copy()
        wrong[harness.guard + 5] += np.float16(a0[k, 0] * b0[k, 5])  # output (0, 5) counts a term twice
        assert "1 of" in harness.compare(wrong, 1.0, 0.0)
        guards = out.copy()
        guards[0] = 0
        assert "guard region before" in harness.compare(guards, 1.0, 0.0)
    finally:
        binding.release()


def test_a_float16_study_verifies_and_records_fp32_results(device, tmp_path):
    p = GemmProblem(33, 17, 29, dtype="float16")
    tuner = Tuner(device, f"sqlite:///{tmp_path / 'studies.sqlite'}", algorithms=[GemmMmaTF32(), EmulatedF16()],
                  policy=FAST)
    assert [a.name for a in tuner.applicable(p)] == ["gemm_mma_f16"]
    outcome = tuner.tune(p, trials=4)
    assert outcome.per_algorithm["gemm_mma_f16"].ok, outcome.per_algorithm
    assert outcome.precision == FP32 and outcome.precisions == {"gemm_mma_f16": FP32}
    with TuningDB(str(tmp_path / "tuning.sqlite")) as db:
        record_outcome(db, device.fingerprint, outcome)
        hit = db.lookup(device.fingerprint, p)
        assert hit is not None and hit.algorithm == "gemm_mma_f16"
        assert db.lookup(device.fingerprint, GemmProblem(33, 17, 29)) is None  # float32: another problem
