"""gemm_tiled with split K (SPLITK > 1) on this machine's OpenCL device (PoCL in CI) against numpy in
float64, with gemm_checks.py's K-scaled tolerance, layouts and NaN-filled C when beta == 0.

SPLITK work-groups per C tile each sum one K slice into the plan's workspace; the last of them to finish
adds the slices in a fixed order and applies alpha and beta (``FINISH_SPLITS``; else a second launch
does, with the same sums). What can go wrong, and what checks it: a slice
that misses or repeats K steps (K not a multiple of KWG or of SPLITK, K smaller than SPLITK so that
slices are empty), a reduction that reads C when beta == 0 (C holds NaN), writes outside C (guards),
batches and broadcasts mixed up with slices (batch > 1, stride 0), and run-to-run differences
(bit-identical results required: no atomics, fixed summation order).
"""

from __future__ import annotations

import functools
import random
import types

import draw_spaces
import draws
import numpy as np
import pytest
from gemm_checks import (
    ALIGNED,
    ALIGNED_NAN_C,
    BROADCAST_A,
    BROADCAST_B,
    PACKED_NAN_C,
    TRANSPOSE_IDS,
    TRANSPOSES,
    UNALIGNED,
    check_launchable_draw,
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
# (shape, layout): K = 1 (all slices but the first empty), K prime and not a multiple of any KWG or
# split, M or N = 1, batches with offsets, padded and unaligned leading dimensions, broadcasts.
CASES = [((1, 1, 1), PACKED_NAN_C), ((7, 33, 127), UNALIGNED), ((33, 127, 257), ALIGNED),
         ((257, 7, 33), ALIGNED_NAN_C), ((1, 257, 127), BROADCAST_A), ((33, 1, 257), BROADCAST_B)]


def _split_config(transposes: tuple[bool, bool], splitk: int, device) -> dict[str, int]:
    """This device's default for a mid-sized problem, split ``splitk`` ways."""
    return {**TILED.default(problem((33, 127, 257), transposes), device), "SPLITK": splitk}


@pytest.mark.parametrize("splitk", [2, 4, 8, 32])
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=TRANSPOSE_IDS)
def test_split_k_matches_numpy(device, rng, transposes, splitk):
    config = _split_config(transposes, splitk, device)
    for shape, layout in CASES:
        p = problem(shape, transposes, layout.batch)
        assert TILED.space(p, device).is_valid(config)
        check_tiled_run(device, TILED, p, config, layout, rng)


SPLIT_DRAWS = 12
# the draws checked against numpy: 4 of 1000 per run, drawn with the day's seed; the first SPLIT_DRAWS
# with TUNECL_RANDOM_CONFIGS=full (tests/draws.py)
PICKS = draws.Picks("gemm_splitk/random", per_run=4, full=SPLIT_DRAWS)


@functools.cache
def _searched_splits(transposes: tuple[bool, bool]) -> list[dict[str, int]]:
    """The split configs a GPU-like device searches for DRAW_SHAPE (enumerated once per layout)."""
    device = draw_spaces.DRAW_DEVICE
    searched = draw_spaces.tiled_configs(problem(draw_spaces.DRAW_SHAPE, transposes), device,
                                         CP_ASYNC in core.capabilities(device))
    return [c for c in searched if c["SPLITK"] > 1]


@pytest.mark.parametrize("position", range(len(PICKS)))
def test_random_split_configs_match_numpy(device, rng, position):
    """Seeded draws among the searched split configs of a GPU-like device (every variant of the tiled
    kernel: staging, double buffering, strides, vector widths, combined with a split)."""
    index = PICKS[position]
    def draw(index, attempt):
        transposes = TRANSPOSES[index % 4]
        return transposes, random.Random(7000 + index + 1000 * attempt).choice(_searched_splits(transposes))

    def check(transposes, config):
        for step in range(2):
            shape, layout = CASES[(index + 2 * step) % len(CASES)]
            check_tiled_run(device, TILED, problem(shape, transposes, layout.batch), config, layout, rng)

    check_launchable_draw(draw, index, check)


def test_random_split_draws_vary_the_split():
    drawn = set()
    for index in range(SPLIT_DRAWS):
        drawn.add(random.Random(7000 + index).choice(_searched_splits(TRANSPOSES[index % 4]))["SPLITK"])
    assert len(drawn) > 1


def _run_bits(device, plan, a, b, c_init, **kwargs) -> np.ndarray:
    c = device.upload(c_init)
    events = plan.run(device.upload(a), device.upload(b), c, **kwargs)
    events[-1].wait()
    return device.download(c, c_init.shape).view(np.uint32)


def test_split_k_is_bit_identical_run_to_run(device, rng):
    p = GemmProblem(37, 61, 1000, trans_b=True, batch=2)
    plan = TILED.build(p, device, {**TILED.default(p, device), "SPLITK": 8})
    a = rng.standard_normal((2, 37, 1000)).astype(np.float32)
    b = rng.standard_normal((2, 61, 1000)).astype(np.float32)
    c = rng.standard_normal((2, 37, 61)).astype(np.float32)
    first = _run_bits(device, plan, a, b, c, alpha=0.5, beta=-2.0)
    for _ in range(2):  # the same plan (its workspace reused) and a fresh one
        np.testing.assert_array_equal(_run_bits(device, plan, a, b, c, alpha=0.5, beta=-2.0), first)
    again = TILED.build(p, device, dict(plan.config))
    np.testing.assert_array_equal(_run_bits(device, again, a, b, c, alpha=0.5, beta=-2.0), first)


@pytest.mark.parametrize("finish", [True, False], ids=["finished_in_kernel", "reduce_launch"])
def test_split_plan_owns_its_workspace_and_enqueues_its_launches(device, monkeypatch, finish):
    """The workspace holds the slices (and a counter per C tile, zero again after every run, where the
    kernel finishes the split itself: one launch; else a second launch reduces)."""
    monkeypatch.setattr(gemm_tiled, "FINISH_SPLITS", finish)
    p = GemmProblem(9, 10, 300, batch=3)
    plain = TILED.default(p, device)
    one = TILED.build(p, device, {**plain, "SPLITK": 1})
    four = TILED.build(p, device, {**plain, "SPLITK": 4})
    assert (one.workspace_bytes, one.workspace) == (0, None)
    tiles = -(-9 // plain["MWG"]) * -(-10 // plain["NWG"]) * 3
    slices = 4 * 4 * 3 * 9 * 12
    assert four.workspace_bytes == slices + (4 * tiles if finish else 0)
    assert four.workspace.size == four.workspace_bytes
    a, b, c = device.alloc(4 * 3 * 9 * 300), device.alloc(4 * 3 * 300 * 10), device.alloc(4 * 3 * 9 * 10)
    assert len(one.run(a, b, c)) == 1
    for _ in range(3):
        events = four.run(a, b, c)
        assert len(events) == (1 if finish else 2)
        events[-1].wait()
    if finish:
        counters = device.download(four.workspace, (tiles,), np.int32, offset=slices)
        assert not counters.any(), counters


@pytest.mark.parametrize("transposes", TRANSPOSES, ids=TRANSPOSE_IDS)
def test_the_last_work_group_gives_the_reduce_launchs_bits(device, rng, monkeypatch, transposes):
    """The split finished by the kernel's last work-group of each tile equals the separate reduction,
    bit for bit, with alpha, beta, batches and unaligned C."""
    p = GemmProblem(37, 61, 700, *transposes, batch=2)
    a = rng.standard_normal((2, 700, 37) if transposes[0] else (2, 37, 700)).astype(np.float32)
    b = rng.standard_normal((2, 61, 700) if transposes[1] else (2, 700, 61)).astype(np.float32)
    c = rng.standard_normal((2, 37, 61)).astype(np.float32)
    results = []
    for finish in (True, False):
        monkeypatch.setattr(gemm_tiled, "FINISH_SPLITS", finish)
        plan = TILED.build(p, device, {**TILED.default(p, device), "SPLITK": 8})
        results.append(_run_bits(device, plan, a, b, c, alpha=0.5, beta=-2.0))
    np.testing.assert_array_equal(*results)


def test_results_stored_before_splitk_existed_still_build(device):
    """A config without SPLITK (every stored gemm_tiled result of version 1) means SPLITK = 1."""
    p = GemmProblem(33, 65, 70)
    config = TILED.default(p, device)
    old = {k: v for k, v in config.items() if k != "SPLITK"}
    space = TILED.space(p, device)
    assert not space.violations(old) and space.complete(old)["SPLITK"] == 1
    plan = TILED.build(p, device, old)
    assert plan.config == {**old, "SPLITK": 1} and plan.workspace_bytes == 0


def test_split_configs_verify_in_the_search_harness(device):
    """The tuner's path: guarded buffers, NaN C for beta == 0, the K-scaled tolerance."""
    p = GemmProblem(5, 70, 600, trans_b=True)
    config = {**TILED.default(p, device), "SPLITK": 16}
    result = evaluate(TILED, p, device, config)
    assert result.ok, result.message


def test_workspace_is_a_named_device_limit(device, monkeypatch):
    p = GemmProblem(1024, 1024, 64, batch=8)   # 16 slices x 8 x 1024 x 1024 floats: 512 MiB > the cap
    config = {**TILED.default(GemmProblem(64, 64, 1024), H200), "SPLITK": 16}
    assert "workspace_within_device" in TILED.space(p, H200).violations(config)
    small = types.SimpleNamespace(**vars(H200), max_alloc_size=2**20)
    q = GemmProblem(64, 64, 1024)
    fits, too_big = ({**TILED.default(q, small), "SPLITK": s} for s in (8, 32))  # 128 KiB, 512 KiB
    assert TILED.space(q, small).is_valid(fits)
    small.max_alloc_size = 2**18
    assert "workspace_within_device" in TILED.space(q, small).violations(too_big)


# ---- the default and the searched space ------------------------------------------------------------

@pytest.mark.parametrize("spec", ["64,1000,2048", "64,1000,2048,0,1", "32,32,8192"])
def test_h200_default_splits_long_reductions_of_small_outputs(spec):
    p = GemmProblem.from_spec(spec)
    config = TILED.default(p, H200)
    assert config["SPLITK"] > 1
    tiles = -(-p.m // config["MWG"]) * -(-p.n // config["NWG"])
    assert tiles < H200.fingerprint.compute_units and (config["SPLITK"] - 1) * gemm_tiled.k_chunk(
        p.k, config["SPLITK"], config["KWG"]) < p.k
    assert config in TILED.space(p, H200).configs()


@pytest.mark.parametrize("spec", ["4096,4096,4096", "4096,4096,4096,0,1", "1024,1024,1024", "512,512,512",
                                  "49,2048,512", "196,1024,256", "3136,64,576", "2,4096,25088,0,1"])
def test_h200_default_keeps_other_shapes_unsplit(spec):
    assert TILED.default(GemmProblem.from_spec(spec), H200)["SPLITK"] == 1


def test_cpu_default_never_splits(device):
    cpu = types.SimpleNamespace(**{**vars(H200), "fingerprint": types.SimpleNamespace(
        vendor="pocl", device_type="cpu", compute_units=2)})
    for spec in ("64,1000,2048", "32,32,8192", "1,1,100000"):
        assert TILED.default(GemmProblem.from_spec(spec), cpu)["SPLITK"] == 1
    if device.fingerprint.device_type != "gpu":
        assert TILED.default(GemmProblem.from_spec("64,1000,2048"), device)["SPLITK"] == 1


def test_splits_are_searched_only_where_tiles_leave_compute_units_idle():
    big = TILED.space(GemmProblem(4096, 4096, 4096), H200).configs()
    assert {c["SPLITK"] for c in big} == {1}
    p = GemmProblem.from_spec("64,1000,2048")
    units = H200.fingerprint.compute_units
    for c in TILED.space(p, H200).configs():
        groups = -(-p.m // c["MWG"]) * -(-p.n // c["NWG"])
        if c["SPLITK"] > 1:
            assert groups < units and groups * c["SPLITK"] < 4 * units
            assert (c["SPLITK"] - 1) * gemm_tiled.k_chunk(p.k, c["SPLITK"], c["KWG"]) < p.k
