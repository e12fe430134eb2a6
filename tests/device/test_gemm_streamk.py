"""gemm_tiled's stream-K tail (STREAMK > 0) on this machine's OpenCL device (PoCL in CI) against numpy in
float64, with gemm_checks.py's K-scaled tolerance, layouts, guards and NaN-filled C when beta == 0.

With G = STREAMK x compute units, the whole waves of tiles run whole and G more work-groups share the k
steps of the rest; parts of split tiles meet in a workspace and a fixup launch adds them. What can go
wrong, and what checks it: steps done twice or never (tile counts below, at and above a multiple of G,
K not a multiple of KWG), groups without steps (fewer steps than groups: K = 1), a fixup that reads a
part nobody wrote or adds one twice, C read when beta == 0 (NaN C), writes outside C (guards), batches
and broadcasts mixed into the tile order, every way of staging tiles (plain, double-buffered, cp.async
emulated), and run-to-run differences. G is set here by the compute-unit count the plan reads, so each
case sees the same splits on any machine.
"""

from __future__ import annotations

import numpy as np
import pytest
from gemm_checks import (
    ALIGNED,
    ALIGNED_NAN_C,
    BROADCAST_A,
    BROADCAST_B,
    PACKED_NAN_C,
    UNALIGNED,
    check_tiled_run,
    gpu_double,
    problem,
)

from tunecl.kernels.gemm import core, gemm_tiled
from tunecl.problems import GemmProblem
from tunecl.runtime import CP_ASYNC
from tunecl.search.evaluate import evaluate

TILED = gemm_tiled.GemmTiled()
H200 = gpu_double()
# (shape, layout) with 16 x 16 tiles: 1, 6, 72, 34, 51 and 6 tiles over the batch, so that G = 1 .. 10
# meets tile counts below, at and above its multiples; K = 1 leaves most groups without steps.
CASES = [((1, 1, 1), PACKED_NAN_C), ((7, 33, 127), UNALIGNED), ((33, 127, 257), ALIGNED),
         ((257, 7, 33), ALIGNED_NAN_C), ((1, 257, 127), BROADCAST_A), ((33, 1, 257), BROADCAST_B)]
# How the tiles are staged: registers -> local memory, double-buffered, cp.async (emulated on PoCL).
STAGING = {"plain": {"DB": 0, "ASYNC": 0}, "db": {"DB": 1, "ASYNC": 0}, "async": {"DB": 0, "ASYNC": 3}}


def small_tiles(streamk: int, staging: str, kwg: int = 8) -> dict[str, int]:
    """A 16 x 16-tile config (4 outputs per thread) with scalar loads, valid for every layout."""
    return {"MWG": 16, "NWG": 16, "KWG": kwg, "SPLITK": 1, "STREAMK": streamk, "MDIMC": 8, "NDIMC": 8,
            "VWM": 2, "VWN": 2, "STRM": 0, "STRN": 0, "KWI": 2, "SA": 1, "SB": 1, "MDIMA": 8, "NDIMB": 8,
            "VWA": 1, "VWB": 1, "PAD": 0, "GM": 1, "RWGS": 0, "MAXRREG": 0, **STAGING[staging]}


class Tiled:
    """gemm_tiled, with cp.async emulated where the device's probe did not grant it."""

    name = TILED.name

    def build(self, p, device, config):
        return TILED.build(p, device, config, emulate=CP_ASYNC not in core.capabilities(device))


@pytest.fixture
def units(monkeypatch):
    """Set the compute-unit count the plans read (G = STREAMK x units)."""
    def set_units(count: int) -> None:
        monkeypatch.setattr(gemm_tiled, "compute_units", lambda device: count)
    return set_units


@pytest.mark.parametrize("count", [1, 3, 5])
@pytest.mark.parametrize("streamk", [1, 2])
@pytest.mark.parametrize(("staging", "transposes", "gm"), [("plain", (False, False), 1), ("db", (False, True), 8),
                                                           ("async", (True, False), 1), ("async", (True, True), 8)],
                         ids=["plain-nn", "db-nt", "async-tn", "async-tt"])
def test_streamk_matches_numpy(device, rng, units, count, streamk, staging, transposes, gm):
    units(count)
    config = {**small_tiles(streamk, staging, kwg=16 if staging == "db" else 8), "GM": gm}
    for shape, layout in CASES:
        p = problem(shape, transposes, layout.batch)
        assert not TILED._space(p, device, True).violations(config)
        check_tiled_run(device, Tiled(), p, config, layout, rng)


@pytest.mark.parametrize(("tiles", "groups", "split"), [(1024, 264, (792, 264)), (1056, 264, (1056, 0)),
                                                        (100, 264, (0, 264)), (1, 1, (1, 0)), (7, 3, (6, 3))])
def test_whole_waves_stay_whole_and_the_rest_is_shared(tiles, groups, split):
    assert gemm_tiled.streamk_split(tiles, groups) == split


def test_plan_launches_a_fixup_only_for_a_part_filled_wave(device, units):
    units(3)  # G = 6
    a, b, c = device.alloc(4 * 64 * 64), device.alloc(4 * 64 * 64), device.alloc(4 * 64 * 64)
    full = TILED.build(GemmProblem(48, 32, 64), device, small_tiles(2, "plain"))  # 3 x 2 tiles: one wave
    assert full.streamk == (6, 0) and full.workspace_bytes == 0
    assert len(full.run(a, b, c)) == 1
    part = TILED.build(GemmProblem(64, 32, 64), device, small_tiles(2, "plain"))  # 8 tiles: 6 whole + 2
    assert part.streamk == (6, 6) and part.workspace_bytes == 4 * 2 * 6 * 16 * 16
    events = part.run(a, b, c)
    assert len(events) == 2
    events[-1].wait()


def _run_bits(device, plan, a, b, c_init) -> np.ndarray:
    c = device.upload(c_init)
    plan.run(device.upload(a), device.upload(b), c, alpha=0.5, beta=-2.0)[-1].wait()
    return device.download(c, c_init.shape).view(np.uint32)


def test_streamk_is_bit_identical_run_to_run(device, rng, units):
    units(5)
    p = GemmProblem(37, 61, 300, trans_b=True, batch=2)  # 3 x 4 x 2 = 24 tiles: 20 whole, 4 shared by 10
    plan = TILED.build(p, device, small_tiles(2, "plain"))
    a = rng.standard_normal((2, 37, 300)).astype(np.float32)
    b = rng.standard_normal((2, 61, 300)).astype(np.float32)
    c = rng.standard_normal((2, 37, 61)).astype(np.float32)
    first = _run_bits(device, plan, a, b, c)
    np.testing.assert_array_equal(_run_bits(device, plan, a, b, c), first)
    np.testing.assert_array_equal(_run_bits(device, TILED.build(p, device, dict(plan.config)), a, b, c), first)


def test_streamk_configs_verify_in_the_search_harness(device, units):
    """The tuner's path: guarded buffers, NaN C for beta == 0, the K-scaled tolerance."""
    units(2)
    result = evaluate(TILED, GemmProblem(50, 70, 99), device, small_tiles(1, "plain"))
    assert result.ok, result.message


def test_streamk_rules(device):
    p = GemmProblem(33, 65, 70)
    config = {**TILED.default(p, device), "SPLITK": 2, "STREAMK": 1}
    assert "STREAMK_without_SPLITK" in TILED.space(p, device).violations(config)
    old = {k: v for k, v in TILED.default(p, device).items() if k != "STREAMK"}  # stored before STREAMK
    assert TILED.space(p, device).complete(old)["STREAMK"] == 0
    assert TILED.build(p, device, old).streamk is None


def test_streamk_is_searched_only_for_big_tiles_before_a_part_filled_wave():
    units = H200.fingerprint.compute_units
    p = GemmProblem(4096, 4096, 4096)
    for c in TILED.space(p, H200).configs():
        if c["STREAMK"]:
            tiles, groups = core.tile_count(p, c["MWG"], c["NWG"]), c["STREAMK"] * units
            assert c["MWG"] * c["NWG"] >= 128 * 128 and groups < tiles and tiles % groups
            assert (c["MWG"] // c["MDIMC"]) * (c["NWG"] // c["NDIMC"]) >= 64
    # 4224 x 4096 in 128 x 128 tiles: 33 x 32 = 4 x 264 tiles, no part-filled wave at 2 per unit
    assert not any(c["STREAMK"] == 2 and (c["MWG"], c["NWG"]) == (128, 128)
                   for c in TILED.space(GemmProblem(4224, 4096, 4096), H200).configs())
    cpu = TILED.space(p, type(H200)(**{**vars(H200), "fingerprint": type(H200.fingerprint)(
        vendor="pocl", device_type="cpu", compute_units=2)}))
    assert not any(c["STREAMK"] for c in cpu.configs())
