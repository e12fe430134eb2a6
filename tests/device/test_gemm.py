"""gemm_tiled and gemm_direct: what is their own, on this machine's OpenCL device (PoCL in CI) against
numpy in float64 (``gemm_checks.py``). What every GEMM family promises (defaults and random configs on
the edge shapes and layouts, refusals, registration) is ``test_gemm_contract.py``.
"""

from __future__ import annotations

import draw_spaces
import numpy as np
import pytest
from gemm_checks import ALIGNED, TRANSPOSES, UNALIGNED, check_run, gpu_double, problem, tiled_workspace

from tunecl.kernels.gemm import gemm_tiled, gemm_direct
from tunecl.problems import GemmProblem

ALGORITHMS = {"gemm_tiled": gemm_tiled.GemmTiled(), "gemm_direct": gemm_direct.GemmDirect()}
H200 = gpu_double()


# ---- seeded random configs ---------------------------------------------------------------------------

def test_random_configs_are_distinct_and_cover_variants():
    """The random draws exercise the variants that matter (staging, double buffering, strides)."""
    full = range(draw_spaces.RANDOM_FULL)
    tiled = [draw_spaces.random_config(ALGORITHMS["gemm_tiled"], i)[1] for i in full]
    assert len({tuple(sorted(c.items())) for c in tiled}) == len(tiled)
    for name in ("SA", "DB", "STRM", "STRN", "PAD", "GM", "KWI", "VWA", "SPLITK"):
        assert len({c[name] for c in tiled}) > 1, f"random tiled configs never vary {name}"
    assert any(c["SA"] == 0 for c in tiled), "no unstaged config among the random tiled draws"
    direct = [draw_spaces.random_config(ALGORITHMS["gemm_direct"], i)[1] for i in full]
    for name in ("KSL", "VWK", "MWID", "NWID"):
        assert len({c[name] for c in direct}) > 1, f"random direct configs never vary {name}"


def test_mixed_staging_and_unstaged_configs(device, rng):
    """Valid configs outside the searched space (one operand staged, none staged) still compute."""
    algorithm = ALGORITHMS["gemm_tiled"]
    for transposes in TRANSPOSES:
        p = problem((33, 127, 257), transposes, batch=2)
        base = algorithm.default(p, device)
        unstaged = {**base, "SA": 0, "SB": 0, "DB": 0, "PAD": 0, "MDIMA": base["MDIMC"],
                    "NDIMB": base["NDIMC"], "VWA": 1, "VWB": 1}
        only_a = {**base, "SB": 0, "DB": 1, "NDIMB": base["NDIMC"], "VWB": 1}
        only_b = {**base, "SA": 0, "DB": 1, "MDIMA": base["MDIMC"], "VWA": 1}
        for config in (unstaged, only_a, only_b):
            assert not algorithm.space(p, device).violations(config)
            check_run(device, algorithm, p, config, ALIGNED if transposes[0] else UNALIGNED, rng,
                      workspace=tiled_workspace(device, p, config))


# ---- invalid configs and run arguments ---------------------------------------------------------------

def _refuse_to_compile(*args, **kwargs):
    raise AssertionError("an invalid config reached the compiler")


@pytest.mark.parametrize("name, changes, violation", [
    ("gemm_tiled", {"MWG": 16, "MDIMC": 16, "VWM": 4}, "MWI_multiple_of_VWM"),
    ("gemm_tiled", {"MWG": 64, "MDIMC": 32, "MDIMA": 8, "KWG": 8, "VWA": 4}, "A_tile_load_layout"),
    ("gemm_tiled", {"MWG": 16, "MDIMC": 32}, "MWG_multiple_of_MDIMC"),
    ("gemm_tiled", {"SA": 0, "SB": 0, "DB": 1}, "DB_PAD_need_local_memory"),
])
def test_invalid_config_is_named_and_never_compiled(device, monkeypatch, name, changes, violation):
    algorithm = ALGORITHMS[name]
    p = problem((64, 64, 64), (False, False))
    config = {**algorithm.default(p, device), **changes}
    assert any(violation in v for v in algorithm.space(p, device).violations(config))
    monkeypatch.setattr(device, "build", _refuse_to_compile)
    with pytest.raises(ValueError, match=violation.split("=")[0]):
        algorithm.build(p, device, config)


def test_device_limits_are_named_constraints():
    p = problem((4096, 4096, 4096), (False, True))
    small = gpu_double(local_mem=8 * 1024, max_wg=128)
    tiled = ALGORITHMS["gemm_tiled"]
    config = tiled.default(p, H200)
    assert (config["MDIMC"] * config["NDIMC"], config["KWG"], config["DB"]) == (256, 16, 1)
    assert {"work_group_size_within_device", "local_memory_within_device"} <= set(
        tiled.space(p, small).violations(config))
    assert tiled.space(p, small).is_valid(tiled.default(p, small))
    direct = ALGORITHMS["gemm_direct"]
    config = {**direct.default(p, small), "KSL": 32, "NDIMD": 8, "MDIMD": 4}
    assert "work_group_size_within_device" in direct.space(p, small).violations(config)


# ---- the spaces ----------------------------------------------------------------------------------------


# 4096^3: 82k configs, and 57k more with a stream-K tail (big tiles only)
@pytest.mark.parametrize("spec, low, high", [("4096,4096,4096", 10_000, 150_000),
                                             ("64,1000,2048", 1_000, 80_000)])
def test_tiled_space_on_an_h200_like_device(spec, low, high):
    p = GemmProblem.from_spec(spec)
    space = ALGORITHMS["gemm_tiled"].space(p, H200)
    configs = space.configs()
    assert low <= len(configs) <= high
    assert ALGORITHMS["gemm_tiled"].default(p, H200) in configs


def test_tiled_space_contains_the_fast_h200_shapes():
    """128x128 / 128x256 tiles, 128-256 threads, 8x8 and 16x8 per thread, float4, double buffering."""
    p = GemmProblem(4096, 4096, 4096)
    configs = ALGORITHMS["gemm_tiled"].space(p, H200).configs()
    shapes = [(128, 128, 8, 16), (128, 128, 16, 16), (256, 128, 16, 16), (128, 256, 8, 32)]
    for mwg, nwg, mdimc, ndimc in shapes:
        fast = {"MWG": mwg, "NWG": nwg, "MDIMC": mdimc, "NDIMC": ndimc, "VWA": 4, "VWB": 4, "VWM": 4,
                "VWN": 4, "DB": 1, "SA": 1, "SB": 1}
        matches = [c for c in configs if all(c[k] == v for k, v in fast.items())]
        assert matches, f"no {fast} in the 4096^3 space"
        assert {c["MAXRREG"] for c in matches} > {0} and {c["RWGS"] for c in matches} == {0, 1}
        assert {c["PAD"] for c in matches} == {0, 1} and {c["GM"] for c in matches} == {1, 8}


@pytest.mark.parametrize("shape, batch", [((3, 8, 4), 72), ((1, 1, 1), 500), ((2, 2, 2), 4096)])
def test_many_small_batched_matrices_have_a_default(device, rng, shape, batch):
    """Pruning once emptied gemm_tiled's space for tiny batched problems, and default() crashed."""
    m, n, k = shape
    p = GemmProblem(m, n, k, batch=batch)
    tiled = ALGORITHMS["gemm_tiled"]
    config = tiled.default(p, device)
    assert tiled.space(p, device).is_valid(config)
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    c = np.empty((batch, m, n), np.float32)
    ab, bb, cb = device.upload(a), device.upload(b), device.upload(c)
    tiled.build(p, device, config).run(ab, bb, cb)
    np.testing.assert_allclose(device.download(cb, c.shape), a @ b, rtol=1e-5, atol=1e-5)
