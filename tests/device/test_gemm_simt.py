"""gemm_simt (CUTLASS-style warp tiling): what is its own, on this machine's OpenCL device (PoCL in CI)
against numpy in float64 (``gemm_checks.py``). What every GEMM family promises (defaults and random
configs on the edge shapes and layouts, refusals, registration) is ``test_gemm_contract.py``.

Each compiled config runs several shapes and layouts (M, N, K, lds, offsets and batch are run-time
arguments of the same binary); the layouts cover both compiled variants (vector loads, and the scalar
fallback for unaligned offsets / leading dimensions / strides) and beta == 0 with C full of NaN.
"""

from __future__ import annotations

import draw_spaces
import pytest
from gemm_checks import (
    ALIGNED,
    ALIGNED_NAN_C,
    BROADCAST_A,
    BROADCAST_B,
    TRANSPOSE_IDS,
    TRANSPOSES,
    UNALIGNED,
    check_run,
    gpu_double,
    problem,
)

from tunecl import kernels
from tunecl.kernels.gemm import gemm_simt
from tunecl.problems import GemmProblem

SIMT = gemm_simt.GemmSimt()
H200 = gpu_double()


def gpu_default(transposes: tuple[bool, bool]) -> dict[str, int]:
    """The H200 default at 4096^3 without its NVIDIA-only register cap (PoCL takes no such option)."""
    return {**SIMT.default(GemmProblem(4096, 4096, 4096, *transposes), H200), "MAXRREG": 0}


CLASSIC = {"MWG": 128, "NWG": 128, "KWG": 8, "WM": 32, "WN": 64, "LM": 4, "LN": 8, "VW": 4, "LIL": 2,
           "DB": 1}


# ---- defaults ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("transposes", TRANSPOSES, ids=TRANSPOSE_IDS)
def test_the_gpu_default_matches_numpy(device, rng, transposes):
    """The NVIDIA default (CUTLASS's 128x128x8, 8 warps of 4x8 lanes, 8x8 per thread, double-buffered)
    computed here: several tiles and a partial one in M and N, K a multiple of KWG and not, K < KWG."""
    assert SIMT.default(GemmProblem(4096, 4096, 4096, *transposes), H200)["MAXRREG"] == 128
    config = gpu_default(transposes)
    assert {k: config[k] for k in CLASSIC} == CLASSIC
    cases = [((257, 300, 64), ALIGNED_NAN_C), ((129, 131, 37), UNALIGNED), ((128, 256, 5), ALIGNED),
             ((200, 136, 24), BROADCAST_B)]
    for shape, layout in cases:
        check_run(device, SIMT, problem(shape, transposes, layout.batch), config, layout, rng)


# ---- seeded random configs ---------------------------------------------------------------------------

def test_random_configs_are_distinct_and_cover_variants():
    """test_gemm_contract.py's draws: two of three from the space a GPU searches (vendor-neutral,
    32-lane warps), one of three from a CPU's (16-lane warps, VW < 4)."""
    drawn = [draw_spaces.random_config(SIMT, i)[1] for i in range(draw_spaces.RANDOM_FULL)]
    assert len({tuple(sorted(c.items())) for c in drawn}) == len(drawn)
    for name in ("MWG", "NWG", "KWG", "WM", "WN", "LM", "VW", "LIL", "VWA", "DB", "PAD", "GM"):
        assert len({c[name] for c in drawn}) > 1, f"random simt configs never vary {name}"


@pytest.mark.parametrize("changes", [
    {"KWG": 32, "WM": 64, "WN": 32, "LM": 8, "LN": 4, "LIL": 2, "DB": 0, "GM": 4},  # 8x8, 8x4 lanes; 48 KiB
    {"WM": 32, "WN": 128, "LM": 4, "LN": 8, "LIL": 2, "DB": 0, "GM": 16},         # 8x16 per thread
    {"MWG": 64, "NWG": 32, "WM": 16, "WN": 16, "LM": 8, "LN": 4, "VW": 2, "LIL": 1, "VWA": 2, "VWB": 1},
    {"MWG": 32, "NWG": 64, "WM": 8, "WN": 32, "LM": 8, "LN": 4, "VW": 1, "LIL": 1, "KWG": 16, "VWA": 2,
     "RWGS": 1},
], ids=["lanes8x4_k32", "thread8x16", "vw2", "vw1_rwgs"])
def test_hand_picked_valid_configs_match_numpy(device, rng, changes):
    """Valid corners the seeded draws may miss: 8x4 lanes, 8x16 thread tiles, VW 1 and 2, KWG 32."""
    for transposes, layout, shape in zip(TRANSPOSES, [ALIGNED_NAN_C, UNALIGNED, ALIGNED, BROADCAST_A],
                                         [(257, 300, 64), (129, 131, 37), (65, 97, 3), (1, 1, 1)], strict=True):
        p = problem(shape, transposes, layout.batch)
        config = {**gpu_default(transposes), **changes}
        assert not SIMT.space(p, device).violations(config), SIMT.space(p, device).violations(config)
        check_run(device, SIMT, p, config, layout, rng)


# ---- invalid configs, limits, spaces ------------------------------------------------------------------

def _refuse_to_compile(*args, **kwargs):
    raise AssertionError("an invalid config reached the compiler")


@pytest.mark.parametrize("changes, violation", [
    ({"WM": 64, "MWG": 32}, "MWG_multiple_of_WM"),
    ({"WN": 32, "LN": 16, "VW": 4}, "thread_tile_multiple_of_VW"),
    ({"WM": 128, "MWG": 128, "LM": 4}, "register_tile_at_most_16x16_and_128"),
    ({"LM": 1, "LIL": 2}, "LIL_divides_LM"),
    ({"MWG": 16, "WM": 16}, "A_tile_load_layout"),  # 64 threads, 32 float4 in the A tile
])
def test_invalid_config_is_named_and_never_compiled(device, monkeypatch, changes, violation):
    p = problem((64, 64, 64), (False, False))
    config = {**gpu_default((False, False)), **changes}
    assert any(violation in v for v in SIMT.space(p, device).violations(config))
    monkeypatch.setattr(device, "build", _refuse_to_compile)
    with pytest.raises(ValueError, match=violation.split("=")[0]):
        SIMT.build(p, device, config)


def test_device_limits_are_named_constraints():
    p = problem((4096, 4096, 4096), (False, True))
    small = gpu_double(local_mem=8 * 1024, max_wg=128)
    config = SIMT.default(p, H200)
    assert gemm_simt.threads(config) == 256 and gemm_simt.local_memory_bytes(config) == 2 * 8 * 264 * 4
    assert {"work_group_size_within_device", "local_memory_within_device"} <= set(
        SIMT.space(p, small).violations({**config, "KWG": 32}))
    assert SIMT.space(p, small).is_valid(SIMT.default(p, small))


def test_searched_configs_fit_the_device_by_an_independent_count():
    """Work-group size, local memory, register tile and whole tile loads, recomputed here from the
    kernel's definitions for every config searched at 4096^3 (nt) on an H200-like device."""
    p = GemmProblem(4096, 4096, 4096, False, True)
    configs = SIMT.space(p, H200).configs()
    for c in configs:
        tm, tn = c["WM"] // c["LM"], c["WN"] // c["LN"]
        count = (c["MWG"] // c["WM"]) * (c["NWG"] // c["WN"]) * c["LM"] * c["LN"]
        local = 4 * (1 + c["DB"]) * c["KWG"] * ((c["MWG"] + 4 * c["PAD"]) + (c["NWG"] + 4 * c["PAD"]))
        assert count <= 1024 and local <= 48 * 1024 and tm * tn <= 128, c
        assert tm % c["VW"] == 0 and tn % c["VW"] == 0 and c["LM"] * c["LN"] == 32, c
        assert (c["MWG"] * c["KWG"]) % (count * c["VWA"]) == 0 and (c["NWG"] * c["KWG"]) % (count * c["VWB"]) == 0
        assert not (c["RWGS"] and c["MAXRREG"]), c


@pytest.mark.parametrize("spec, low, high", [("4096,4096,4096", 2_000, 60_000),
                                             ("1024,1024,1024", 1_000, 60_000),
                                             ("64,1000,2048", 100, 20_000)])
def test_space_on_an_h200_like_device(spec, low, high):
    p = GemmProblem.from_spec(spec)
    configs = SIMT.space(p, H200).configs()
    assert low <= len(configs) <= high
    assert SIMT.default(p, H200) in configs


def test_space_contains_the_cutlass_shapes():
    """128x128 and 128x256 tiles of 32x64 / 64x32 warp tiles, 8x8 and 8x16 per thread, KWG 8 and 16,
    with and without the register cap, double-buffered, float4 everywhere."""
    configs = SIMT.space(GemmProblem(4096, 4096, 4096), H200).configs()
    shapes = [(128, 128, 32, 64, 4, 8), (128, 128, 64, 32, 8, 4), (128, 256, 32, 128, 4, 8),
              (256, 128, 64, 64, 8, 4)]
    for mwg, nwg, wm, wn, lm, ln in shapes:
        wanted = {"MWG": mwg, "NWG": nwg, "WM": wm, "WN": wn, "LM": lm, "LN": ln, "VW": 4, "VWA": 4,
                  "VWB": 4, "DB": 1}
        matches = [c for c in configs if all(c[k] == v for k, v in wanted.items())]
        assert matches, f"no {wanted} in the 4096^3 space"
        assert {c["KWG"] for c in matches} >= {8, 16} and {c["LIL"] for c in matches} == {1, 2}
        assert {c["GM"] for c in matches} >= {1, 8} and {c["PAD"] for c in matches} == {0, 1}
    assert {c["MAXRREG"] for c in configs} == {0, 128, 168}


def test_registered_after_the_untuned_defaults():
    """gemm_simt comes after gemm_tiled and gemm_direct, so the untuned default stays gemm_tiled's."""
    names = [a.name for a in kernels.algorithms("gemm")]
    assert names.index("gemm_tiled") < names.index("gemm_direct") < names.index("gemm_simt")
