"""gemm_simt: an fp32 GEMM decomposed like CUTLASS's SIMT SGEMM (thread block -> warps -> lanes ->
VW x VW sub-blocks), with K-major local tiles, float4 fragment reads, double-buffered local memory and
register double-buffered fragments.

Same semantics and the same :class:`~tunecl.kernels.gemm.core.GemmPlan` (``run`` signature, scalar
fallback variants for unaligned layouts) as ``gemm_tiled``; the OpenCL C is ``gemm_simt.cl`` (its
banner explains the decomposition). Tunables, with the values searched:

=======  =================  ===================================================================
MWG/NWG  16 32 64 128 256   C tile per work-group along M / N
KWG      8 16 32            depth of one K tile in local memory
WM/WN    8 .. 128           warp tile along M / N (WARPS_M = MWG/WM, WARPS_N = NWG/WN)
LM/LN    1 .. 32            lanes of a warp along M / N; TM = WM/LM, TN = WN/LN outputs per thread
LIL      1 2                lane interleave: 2 = CUTLASS's RowMajorInterleaved<2> lane layout
VW       1 2 4              sub-block width: fragment reads from local memory, C accesses
VWA/VWB  1 2 4              global vector width of A / B along their contiguous dimension
DB       0 1                double-buffered local memory (one barrier per K tile)
PAD      0 1                local rows padded by 4 floats (transposed stores without bank conflicts)
GM       1 4 8 16           work-group order: bands of GM tile rows (L2 reuse)
RWGS     0 1                declare reqd_work_group_size
MAXRREG  0 (128 168)        -cl-nv-maxrregcount (NVIDIA only; 0: not passed)
=======  =================  ===================================================================

Threads per work-group = WARPS_M * WARPS_N * LM * LN. Constraints (named, checked before compiling)
cover divisibility of the tiles by warps, lanes and sub-blocks, the register tile (at most 16 x 16
and 128 accumulators), the tile loads (whole vectors per thread), device limits (work-group size,
local memory) and MAXRREG with RWGS. Pruning rules (see :func:`_pruning`) keep the searched space to
configs that can pay off: on a GPU 32-lane warps, 64-256 threads and at least 16 outputs per thread
(fewer only where the tile already spans the problem), balanced thread tiles, the widest VW and
global vectors the packed layout allows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from tunecl.kernels.base import Config, Space, read_source
from tunecl.kernels.gemm.core import (Fp32Gemm, GemmPlan, Rule, check_config, check_dtype, compute_units,
                                      device_type, enumerate_space, is_nvidia, layout_options, make_space,
                                      row_grid, variant_options, widest)
from tunecl.kernels.sizes import next_pow2
from tunecl.problems import GemmProblem
from tunecl.runtime import Device

NAME = "gemm_simt"
VERSION = 1

_TILES = (16, 32, 64, 128, 256)


def _params(device: Any) -> dict[str, tuple[int, ...]]:
    # The order matters for enumeration speed: rules are checked as soon as their parameters are set.
    return {
        "MWG": _TILES, "NWG": _TILES, "KWG": (8, 16, 32), "WM": (8, 16, 32, 64, 128),
        "WN": (8, 16, 32, 64, 128), "LM": (1, 2, 4, 8, 16, 32), "LN": (1, 2, 4, 8, 16, 32),
        "VW": (1, 2, 4), "LIL": (1, 2), "VWA": (1, 2, 4), "VWB": (1, 2, 4), "DB": (0, 1), "PAD": (0, 1),
        "GM": (1, 4, 8, 16), "RWGS": (0, 1), "MAXRREG": (0, 128, 168) if is_nvidia(device) else (0,),
    }


def threads(c: Mapping[str, int]) -> int:
    """Work-items per work-group of config ``c``."""
    return (c["MWG"] // c["WM"]) * (c["NWG"] // c["WN"]) * c["LM"] * c["LN"]


def thread_tile(c: Mapping[str, int]) -> tuple[int, int]:
    """(TM, TN): the outputs one thread accumulates along M and N."""
    return c["WM"] // c["LM"], c["WN"] // c["LN"]


def local_memory_bytes(config: Mapping[str, int]) -> int:
    """Bytes of local memory ``gemm_simt.cl`` declares for ``config`` (mirrors ALD / BLD there)."""
    c = config
    return 4 * (c["DB"] + 1) * c["KWG"] * (c["MWG"] + c["NWG"] + 8 * c["PAD"])


def _loads_fit(tile: int, kwg: int, width: int, contiguous: int, c: Mapping[str, int]) -> bool:
    """Whether a tile x kwg operand tile splits into whole ``width``-vectors along its ``contiguous``
    extent, the same number for every thread."""
    count = threads(c)  # 0 when a warp tile exceeds its tile (a violation named elsewhere)
    return count > 0 and contiguous % width == 0 and (tile * kwg) % (width * count) == 0


def _constraints(problem: GemmProblem, device: Any) -> list[Rule]:
    ta, tb = problem.trans_a, problem.trans_b
    return [
        ("MWG_multiple_of_WM", ("MWG", "WM"), lambda c: c["MWG"] % c["WM"] == 0),
        ("NWG_multiple_of_WN", ("NWG", "WN"), lambda c: c["NWG"] % c["WN"] == 0),
        ("WM_multiple_of_LM", ("WM", "LM"), lambda c: c["WM"] % c["LM"] == 0),
        ("WN_multiple_of_LN", ("WN", "LN"), lambda c: c["WN"] % c["LN"] == 0),
        ("register_tile_at_most_16x16_and_128",
         ("WM", "WN", "LM", "LN"),
         lambda c: (thread_tile(c)[0] <= 16 and thread_tile(c)[1] <= 16
                    and thread_tile(c)[0] * thread_tile(c)[1] <= 128)),
        ("work_group_size_within_device", ("MWG", "NWG", "WM", "WN", "LM", "LN"),
         lambda c: threads(c) <= device.max_work_group_size),
        ("thread_tile_multiple_of_VW", ("WM", "WN", "LM", "LN", "VW"),
         lambda c: thread_tile(c)[0] % c["VW"] == 0 and thread_tile(c)[1] % c["VW"] == 0),
        ("LIL_divides_LM", ("LM", "LIL"), lambda c: c["LM"] % c["LIL"] == 0),
        ("A_tile_load_layout",  # every thread loads the same number of whole VWA-vectors of A
         ("MWG", "NWG", "KWG", "WM", "WN", "LM", "LN", "VWA"),
         lambda c: _loads_fit(c["MWG"], c["KWG"], c["VWA"], c["MWG"] if ta else c["KWG"], c)),
        ("B_tile_load_layout",
         ("MWG", "NWG", "KWG", "WM", "WN", "LM", "LN", "VWB"),
         lambda c: _loads_fit(c["NWG"], c["KWG"], c["VWB"], c["KWG"] if tb else c["NWG"], c)),
        ("local_memory_within_device", ("MWG", "NWG", "KWG", "DB", "PAD"),
         lambda c: local_memory_bytes(c) <= device.local_mem_size),
        ("MAXRREG_ignored_with_RWGS", ("RWGS", "MAXRREG"), lambda c: not (c["RWGS"] and c["MAXRREG"])),
    ]


def _pruning(problem: GemmProblem, device: Any) -> list[Rule]:
    """Rules that drop valid configs which cannot pay off (search-space size only; a pruned config
    still builds and computes correctly)."""
    ta, tb = problem.trans_a, problem.trans_b
    m_cap, n_cap, k_cap = (max(16, next_pow2(problem.m)), max(16, next_pow2(problem.n)),
                           max(8, next_pow2(problem.k)))
    gpu = device_type(device) == "gpu"
    units = compute_units(device)
    # The widest vectors the packed layout can use (the tuned layout; others run the scalar variant).
    wide_a = widest(problem.m if ta else problem.k)
    wide_b = widest(problem.k if tb else problem.n)
    contiguous_a = (lambda c: c["MWG"]) if ta else (lambda c: c["KWG"])
    contiguous_b = (lambda c: c["KWG"]) if tb else (lambda c: c["NWG"])

    def widest_load(tile: int, width_cap: int, contiguous: int, c: Mapping[str, int]) -> int:
        return next((w for w in (4, 2, 1) if w <= width_cap and _loads_fit(tile, c["KWG"], w, contiguous, c)), 1)

    def groups(c: Mapping[str, int]) -> int:
        return -(-problem.m // c["MWG"]) * -(-problem.n // c["NWG"]) * problem.batch

    def spans(c: Mapping[str, int]) -> bool:  # the tile covers the (padded) problem along M or N
        return c["MWG"] >= m_cap or c["NWG"] >= n_cap

    def balanced(c: Mapping[str, int]) -> bool:
        tm, tn = thread_tile(c)
        return tm * tn >= (16 if gpu and not spans(c) else 4) and max(tm, tn) <= 2 * min(tm, tn)

    def sized(c: Mapping[str, int]) -> bool:  # small tiles of small problems may have fewer threads
        return threads(c) <= 256 and (threads(c) >= 64 or spans(c) or groups(c) == 1)

    return [
        ("tile_within_problem", ("MWG", "NWG", "KWG"),
         lambda c: c["MWG"] <= m_cap and c["NWG"] <= n_cap and c["KWG"] <= k_cap),
        ("tile_aspect_at_most_2", ("MWG", "NWG"),
         lambda c: max(c["MWG"], c["NWG"]) <= 2 * min(c["MWG"], c["NWG"])),
        # NVIDIA runs 32-lane warps: the lane layout only means something at that size. CPUs: 16 or 32.
        ("warps_of_32_lanes", ("LM", "LN"), lambda c: c["LM"] * c["LN"] in ((32,) if gpu else (16, 32))),
        ("lanes_at_most_8_by_8", ("LM", "LN"), lambda c: max(c["LM"], c["LN"]) <= 8),
        ("work_group_size_64_to_256", ("MWG", "NWG", "WM", "WN", "LM", "LN"), sized),
        ("thread_tile_balanced", ("MWG", "NWG", "WM", "WN", "LM", "LN"), balanced),
        ("VW_widest", ("WM", "WN", "LM", "LN", "VW"), lambda c: c["VW"] == min(4, *thread_tile(c))),
        ("LIL_2_only_for_thread_tiles_above_4",  # CUTLASS's rule for RowMajorInterleaved<2>
         ("WM", "WN", "LM", "LN", "LIL"),
         lambda c: c["LIL"] == 1 or min(thread_tile(c)) > 4),
        ("VWA_widest_for_tile_and_packed_A", ("MWG", "NWG", "KWG", "WM", "WN", "LM", "LN", "VWA"),
         lambda c: c["VWA"] == widest_load(c["MWG"], wide_a, contiguous_a(c), c) or (
             not gpu and c["VWA"] == 1)),
        ("VWB_widest_for_tile_and_packed_B", ("MWG", "NWG", "KWG", "WM", "WN", "LM", "LN", "VWB"),
         lambda c: c["VWB"] == widest_load(c["NWG"], wide_b, contiguous_b(c), c) or (
             not gpu and c["VWB"] == 1)),
        ("PAD_only_with_transposed_stores", ("PAD",), lambda c: c["PAD"] == 0 or not ta or tb),
        ("GM_only_with_several_bands", ("MWG", "NWG", "GM"),
         lambda c: c["GM"] == 1 or (-(-problem.m // c["MWG"]) > c["GM"] and problem.n > c["NWG"])),
        ("MAXRREG_only_for_big_register_tiles", ("WM", "WN", "LM", "LN", "MAXRREG"),
         lambda c: c["MAXRREG"] == 0 or thread_tile(c)[0] * thread_tile(c)[1] >= 64),
        # NVIDIA SMs have 64K registers: a cap pays only if it lets more work-groups reside.
        ("MAXRREG_raises_occupancy", ("MWG", "NWG", "WM", "WN", "LM", "LN", "MAXRREG"),
         lambda c: c["MAXRREG"] == 0 or 65536 // (threads(c) * c["MAXRREG"]) > 65536 // (threads(c) * 256)),
        ("tile_not_tiny_for_big_problems", ("MWG", "NWG"),
         lambda c: (c["MWG"] * c["NWG"] >= 64 * 64 or groups(c) <= 32 * units
                    or c["MWG"] >= m_cap or c["NWG"] >= n_cap)),
    ]


# Default shapes, best first: (MWG, NWG, KWG, WM, WN, LM, LN). The GPU list starts with CUTLASS's
# classic SIMT SGEMM (128x128x8, 8 warps of 32x64, lanes 4x8, 8x8 outputs per thread, 256 threads);
# smaller tiles follow for problems with fewer tiles than compute units.
_GPU_PRESETS = [
    (128, 128, 8, 32, 64, 4, 8),
    (64, 64, 8, 32, 32, 4, 8),
    (32, 32, 8, 16, 32, 4, 8),
]
# CPUs (PoCL): conservative, small work-groups of 16-lane "warps" with 8x8 (then 4x4) outputs each,
# KWG 16 and double-buffered (PoCL at 512^3 on a 2-core EPYC: 31 GFLOP/s; KWG 8 or one buffer: 2-17).
_CPU_PRESETS = [
    (64, 64, 16, 32, 32, 4, 4),
    (32, 32, 16, 16, 16, 4, 4),
]


class GemmSimt(Fp32Gemm):
    """The ``gemm_simt`` algorithm (see the module docstring for its tunables)."""

    name = NAME
    version = VERSION

    def space(self, problem: GemmProblem, device: Device) -> Space:
        check_dtype(NAME, problem, "float32")
        return make_space(_params(device), _constraints(problem, device), _pruning(problem, device))

    def default(self, problem: GemmProblem, device: Device) -> Config:
        """The first preset that gives every compute unit a work-group (GPU) and passes the searched
        space's rules for this problem, with the widest vectors the packed layout allows; else the
        first searched config; else (pruning emptied the space) the first valid one."""
        check_dtype(NAME, problem, "float32")
        gpu = device_type(device) == "gpu"
        presets = _GPU_PRESETS if gpu else _CPU_PRESETS
        constraints = _constraints(problem, device)
        rules = constraints + _pruning(problem, device)
        params = _params(device)
        # NVIDIA: cap registers at 128 where the rules allow it (the 256-thread 8x8 preset), so that two
        # work-groups share an SM: on the H200 129 registers instead of 128 cost gemm_tiled 20%. With
        # clang's PTX, ptxas needs 129-141 registers uncapped and spills at most 4 bytes at 128.
        caps = (128, 0) if is_nvidia(device) else (0,)
        for index, (mwg, nwg, kwg, wm, wn, lm, ln) in enumerate(presets):
            groups = -(-problem.m // mwg) * -(-problem.n // nwg) * problem.batch
            if gpu and index + 1 < len(presets) and groups < compute_units(device):
                continue
            base = {"MWG": mwg, "NWG": nwg, "KWG": kwg, "WM": wm, "WN": wn, "LM": lm, "LN": ln, "VW": 4,
                    "LIL": 2 if min(wm // lm, wn // ln) > 4 else 1, "DB": 1,
                    "PAD": int(not problem.trans_a or problem.trans_b), "RWGS": 0}
            for maxrreg, gm, vwa, vwb in itertools.product(caps, (8, 1) if gpu else (1,), (4, 2, 1), (4, 2, 1)):
                candidate = {**base, "MAXRREG": maxrreg, "GM": gm, "VWA": vwa, "VWB": vwb}
                candidate = {name: candidate[name] for name in params}
                if all(check(candidate) for _, _, check in rules):
                    return candidate
        searched = self.space(problem, device).configs()
        if searched:  # the searched config nearest to the last preset
            wanted = dict(zip(("MWG", "NWG", "KWG", "WM", "WN", "LM", "LN"), presets[-1], strict=True))
            return min(searched, key=lambda c: (sum(abs(math.log2(c[k] / v)) for k, v in wanted.items()),
                                                -c["VWA"] - c["VWB"]))
        return next(iter(enumerate_space(params, constraints)))

    def build(self, problem: GemmProblem, device: Device, config: Config) -> GemmPlan:
        """Compile ``config`` for ``problem``; ValueError (before compiling) if the config is invalid."""
        check_config(self.space(problem, device), config, NAME)
        source = read_source(__package__, "gemm_simt.cl")
        layout = layout_options(problem)
        if config["MAXRREG"]:
            layout.append(f"-cl-nv-maxrregcount={config['MAXRREG']}")
        glob, local = row_grid(problem, config, threads(config))
        return GemmPlan(algorithm=NAME, problem=problem, device=device, config=config, source=source,
                        options=variant_options(config, layout, config["VWA"], config["VWB"], ("MAXRREG",)),
                        widths=(config["VWA"], config["VWB"], config["VW"]), global_size=glob, local_size=local)


ALGORITHMS = [GemmSimt()]
