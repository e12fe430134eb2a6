"""gemm_tiled with ASYNC (cp.async staging) against numpy, emulated on this machine's device.

cp.async is PTX, so on PoCL the kernel is built with ``emulate=True`` (``ASYNC_STUB``: the copies are
plain loads and stores, in the same order, into the same ASYNC buffers). That checks what the host and
the kernel decide: the buffer ring and its indexing, the prologue and the tiles still in flight at
the end, zero fill at the matrix edges, the scalar variant for unaligned layouts, split K, and the
transposed copies a plan makes for an operand stored the other way. The PTX itself runs in the same
tests on a GPU whose probe granted ``cp_async`` (see docs/kernels.md, capability probes).
"""

from __future__ import annotations

import random

import draw_spaces
import draws
import pytest
from gemm_checks import (
    ALIGNED,
    ALIGNED_NAN_C,
    BROADCAST_A,
    BROADCAST_B,
    EDGE_SHAPES,
    PACKED_NAN_C,
    TRANSPOSES,
    UNALIGNED,
    check_launchable_draw,
    check_tiled_run,
    gpu_double,
    problem,
)

from tunecl.kernels.gemm import core, gemm_tiled, gemm_pretrans
from tunecl.runtime import CP_ASYNC

TILED = gemm_tiled.GemmTiled()
CONFIGS = 12   # the draws the coverage test checks
# the draws checked against numpy: 4 of 1000 per run, drawn with the day's seed; the 12 above with
# TUNECL_RANDOM_CONFIGS=full (tests/draws.py)
PICKS = draws.Picks("gemm_async/configs", per_run=4, full=CONFIGS)
_drawn: dict[tuple[bool, bool], list[dict[str, int]]] = {}


class Emulated:
    """gemm_tiled with the real cp.async where the device's probe granted it, else emulate=True; the
    attributes check_run reads."""

    name = TILED.name

    def build(self, p, device, config):
        return TILED.build(p, device, config, emulate=CP_ASYNC not in core.capabilities(device))


def async_config(index: int, attempt: int = 0) -> tuple[tuple[bool, bool], dict[str, int]]:
    """Config ``index`` of a seeded draw of ASYNC configs from DRAW_SHAPE's space with cp.async
    (``attempt`` > 0: the next draws, for a device that cannot launch the first)."""
    transposes = TRANSPOSES[index % 4]
    if transposes not in _drawn:
        p = problem(draw_spaces.DRAW_SHAPE, transposes)
        searched = draw_spaces.tiled_configs(p, draw_spaces.DRAW_DEVICE, True)
        _drawn[transposes] = [c for c in searched if c["ASYNC"]]
    return transposes, random.Random(7 * index + 1 + 1000 * attempt).choice(_drawn[transposes])


@pytest.mark.parametrize("position", range(len(PICKS)))
def test_async_config_matches_numpy(device, rng, position):
    index = PICKS[position]

    def check(transposes, config):
        layouts = ([PACKED_NAN_C, ALIGNED] if index % 2 == 0 else [ALIGNED_NAN_C, UNALIGNED]) + [
            (BROADCAST_A, BROADCAST_B)[index % 4 // 2]]
        for step, layout in enumerate(layouts):
            shape = EDGE_SHAPES[(index + 3 * step) % len(EDGE_SHAPES)]
            check_tiled_run(device, Emulated(), problem(shape, transposes, layout.batch), config, layout, rng)

    check_launchable_draw(async_config, index, check)


def test_async_draws_cover_the_stages_and_splits():
    configs = [async_config(i)[1] for i in range(CONFIGS)]
    assert {c["ASYNC"] for c in configs} == {2, 3, 4}
    assert len({tuple(sorted(c.items())) for c in configs}) == CONFIGS


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_async_with_split_k_and_every_layout(device, rng, stages):
    """Split K slices end inside the ring (short and empty slices), for each stored layout."""
    for transposes in TRANSPOSES:
        p = problem((33, 65, 257), transposes, batch=2)
        base = TILED.default(p, device)
        config = {**base, "ASYNC": stages, "DB": 0, "PAD": 0, "SPLITK": 4, "KWG": 8, "KWI": 2}
        space = TILED._space(p, device, True)
        config = next((c for c in _with_loaders(config) if space.is_valid(c)), None)
        assert config is not None, f"no ASYNC {stages} split-K config near the default for {p.key}"
        check_tiled_run(device, Emulated(), p, config, ALIGNED if transposes[1] else UNALIGNED, rng)


def _with_loaders(config: dict[str, int]) -> list[dict[str, int]]:
    """``config`` with each tile-loader layout (the kernel reads a staged A as K x M, B as K x N)."""
    return [{**config, "MDIMA": ma, "NDIMB": nb, "VWA": wa, "VWB": wb}
            for wa in (4, 2, 1) for wb in (4, 2, 1) for ma in gemm_tiled._LOADERS for nb in gemm_tiled._LOADERS]


def test_nn_problem_transposes_a_and_reads_b_in_place(device):
    p = problem((64, 96, 32), (False, False), batch=3)
    config = {**TILED.default(p, device), "ASYNC": 2, "DB": 0, "PAD": 0}
    config = next(c for c in _with_loaders(config) if TILED._space(p, device, True).is_valid(c))
    plan = Emulated().build(p, device, config)
    assert isinstance(plan, gemm_pretrans.PretransposedPlan)
    assert plan.inner.problem == problem((64, 96, 32), (True, False), batch=3)
    assert plan.workspace_bytes == 4 * 3 * 64 * 32  # A's copy only
    assert gemm_tiled.kernel_layout(p, config) == (True, False)
    assert gemm_tiled.kernel_layout(p, {**config, "ASYNC": 0}) == (False, False)
    assert gemm_tiled.kernel_layout(p, {**config, "SA": 0}) == (False, False)


def test_async_is_searched_only_where_cp_async_was_granted(device):
    p = problem((4096, 4096, 4096), (False, False))
    assert TILED.space(p, device).params["ASYNC"] == ((0, 2, 3, 4) if CP_ASYNC in core.capabilities(device) else (0,))
    granted = gpu_double(capabilities=frozenset({CP_ASYNC}))
    assert TILED.space(p, granted).params["ASYNC"] == (0, 2, 3, 4)
    plain = gpu_double()
    with pytest.raises(ValueError, match="ASYNC"):
        TILED.build(p, plain, {**TILED.default(p, plain), "ASYNC": 2, "DB": 0})


def test_async_rules_are_named():
    h200 = gpu_double(capabilities=frozenset({CP_ASYNC}))
    p = problem((4096, 4096, 4096), (True, False))
    space = TILED.space(p, h200)
    config = {**TILED.default(p, h200), "ASYNC": 3}
    assert "ASYNC_replaces_DB" in space.violations({**config, "DB": 1})
    assert "ASYNC_needs_a_staged_tile" in space.violations(
        {**config, "DB": 0, "SA": 0, "SB": 0, "PAD": 0, "MDIMA": config["MDIMC"], "NDIMB": config["NDIMC"],
         "VWA": 1, "VWB": 1})
    big = {**config, "DB": 0, "MWG": 256, "NWG": 256, "KWG": 32, "ASYNC": 4}
    assert "local_memory_within_device" in space.violations(big)


def test_stored_configs_without_async_stay_valid(device):
    p = problem((257, 127, 33), (False, True))
    config = TILED.default(p, device)
    old = {k: v for k, v in config.items() if k != "ASYNC"}
    assert TILED.space(p, device).is_valid(old)
    assert TILED.build(p, device, old).config["ASYNC"] == 0
