"""gemm_tiled: the tiled, local-memory GEMM family (CLBlast's Xgemm for row-major data), built on the
GEMM core (:mod:`tunecl.kernels.gemm.core`: its plan is :class:`~tunecl.kernels.gemm.core.GemmPlan`).

``C = alpha * op(A) @ op(B) + beta * C`` in fp32 for any ``GemmProblem``; the OpenCL C is ``gemm_tiled.cl``
(its banner explains the decomposition and the variants). Tunables, with the values searched:

=========  ==================  =================================================================
MWG/NWG    16 32 64 128 256    C tile per work-group along M / N
KWG        8 16 32             depth of one K step (the local-memory tiles)
SPLITK     1 2 4 .. 32         work-groups along K per C tile (> 1: partial sums, then a reduction)
STREAMK    0 1 2               stream-K tail: work-groups per compute unit sharing the last wave's
                               tiles (0: off; GPUs, where the tiles leave the last wave part-empty)
MDIMC      8 16 32             threads along M (NDIMC: along N); MWI = MWG/MDIMC outputs per thread
MDIMA      8 .. 256            threads along M when loading the A tile (NDIMB: along N for B)
KWI        2 8                 unroll of the k loop inside a tile
VWM/VWN    1 2 4               vector width of local reads along M / N (VWN also for C accesses)
VWA/VWB    1 2 4               vector width of global loads of A / B along their contiguous dim
STRM/STRN  0 1                 0: a thread's outputs are contiguous; 1: strided by MDIMC*VWM
SA/SB      0 1                 stage A / B tiles in local memory (0: read global memory directly)
DB         0 1                 double-buffered local memory with register prefetch
ASYNC      0 (2 3 4)           cp.async into ASYNC local buffers instead of registers (devices with
                               ``"cp_async"``; 0 elsewhere); operands transposed first where needed
PAD        0 1                 pad local rows by one vector (bank conflicts of transposed stores)
GM         1 8                 work-group order: bands of GM tile rows (L2 locality)
RWGS       0 1                 declare reqd_work_group_size
MAXRREG    0 (128 168)         -cl-nv-maxrregcount (NVIDIA only; 0: not passed)
=========  ==================  =================================================================

Constraints (named; ``Space.violations`` reports them, ``build`` refuses before compiling) cover
divisibility, tile-load layouts, device limits and duplicate configs. Pruning rules then keep the
searched space to 10^4-10^5 configs (see :func:`_pruning`); pruned configs remain valid.

Split K: with SPLITK = S > 1 the plan owns a workspace of S x batch x M x N' floats (N' = N rounded
up to 4) and an int counter per C tile, allocated when it is built and freed with it. The tiled kernel
runs S work-groups per C tile, each over its own K slice (whole KWG steps), and writes raw partial sums
into the workspace; the last of a tile's work-groups to finish (``split_finish.cl``) adds the S partial
sums of each of the tile's outputs in a fixed order and applies alpha and beta (C read once, written
once): one launch, bit-identical results run to run. With :data:`FINISH_SPLITS` False a second launch,
``gemm_splitk_reduce``, does that reduction instead (the same sums). The
searched space offers S > 1 only where the output has few tiles for the device and every slice has
K work; the default picks it on GPUs for such shapes (see :meth:`GemmTiled.default`). SPLITK = 1 is
the plain kernel: results stored before SPLITK existed mean SPLITK = 1 (``Space.implied``) and stay
valid, so the family's version did not change.

Stream-K (STREAMK = S > 0, ``gemm_streamk`` in gemm_tiled.cl): with T tiles and G = S x compute units
work-groups resident at once, T mod G tiles would run in a last, part-empty wave (4096^3 in 128 x 128
tiles on the H200: 1024 = 3 x 264 + 232; a full last wave ran 3.4% faster per flop). The plan runs
T - T mod G tiles whole, as gemm_tiled does, and spreads the k steps of the rest evenly over G more
work-groups; the parts of tiles split between them go to a workspace of 2 x G tiles and
``gemm_streamk_fixup`` adds them in a fixed order (bit-identical run to run). Results stored before
STREAMK existed mean STREAMK = 0. Measured on the H200 with the 4096^3 winner's other parameters
(TN, tiles and fixup): 4096^3 2.85 -> 2.81 ms, 4224^2 x 4096 3.22 -> 2.97 ms with STREAMK 1; the tuner
decides per shape (the 4096^3 result shipped in tuning_db/ is this one: 0.95x cuBLAS with the
transpose of A).

ASYNC (NVIDIA, sm_80+): the staged tiles go from global to local memory with ``cp.async`` through
ASYNC buffers, the copies of the next ASYNC - 1 tiles in flight while one is multiplied; no registers
hold them, and one barrier per tile. cp.async copies a tile only as it lies, so a staged A must be
stored K x M and a staged B K x N (MN-contiguous); for a problem stored otherwise (``A @ B`` of
row-major tensors: A is M x K) the plan first transposes that operand into a packed workspace
(:class:`~tunecl.kernels.gemm.gemm_pretrans.PretransposedPlan`; the transposes are part of every timing).
Where the layout needs no copy the kernel reads the operands in place. On the H200, 4096^3 NN: the
register-prefetch kernel's own inner loop, fed stale tiles, ran as fast as cuBLAS (2.79 vs 2.70 ms)
while the whole kernel took 2.98: the global-to-local path cost the difference.

Alignment: the plan runs a variant compiled with scalar accesses for an operand that is not aligned
(see :mod:`tunecl.kernels.gemm.core`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tunecl.kernels import split_finish
from tunecl.kernels.base import Config, Space, read_source
from tunecl.kernels.gemm.core import (Fp32Gemm, GemmPlan, Rule, capabilities, check_config, check_dtype,
                                      compute_units, device_type, enumerate_space, is_nvidia, layout_options,
                                      make_space, max_alloc_bytes, splitk_workspace_bytes, streamk_parts_bytes,
                                      tile_count, variant_options, widest)
from tunecl.kernels.gemm.gemm_operands import INT32_MAX
from tunecl.kernels.gemm.gemm_pretrans import PretransposedPlan, with_layout, workspace_fits
from tunecl.kernels.sizes import next_pow2
from tunecl.problems import GemmProblem
from tunecl.runtime import CP_ASYNC, Device

# SPLITK > 1: the last work-group of each C tile adds the SPLITK partial sums itself, in the fixed order
# (one launch; ``split_finish.cl``). False: ``gemm_splitk_reduce``'s launch adds them (the same sums).
FINISH_SPLITS = True
NAME = "gemm_tiled"
VERSION = 1  # SPLITK was added without a bump: a stored config without it is SPLITK = 1, the same kernel
SPLITS = (1, 2, 4, 8, 16, 32)
STREAMK_VALUES = (0, 1, 2)  # work-groups per compute unit of the stream-K tail (0: off)


def streamk_split(tiles: int, groups: int) -> tuple[int, int]:
    """(tiles computed whole, stream-K work-groups) for ``tiles`` tiles on ``groups`` resident
    work-groups: the whole waves stay whole; the part-filled last wave, or everything when the tiles do
    not fill one wave, is shared by ``groups`` stream-K work-groups (none if the waves are all full)."""
    if tiles % groups == 0:
        return tiles, 0
    return tiles - tiles % groups, groups


def streamk_groups(config: Mapping[str, int], device: Any) -> int:
    """G: the work-groups the stream-K tail is spread over (STREAMK per compute unit)."""
    return config.get("STREAMK", 0) * compute_units(device)


def streamk_workspace_bytes(problem: GemmProblem, config: Mapping[str, int], device: Any) -> int:
    """Bytes of the stream-K parts ``config`` needs for ``problem`` on ``device`` (0 without)."""
    groups = streamk_groups(config, device)
    if not groups:
        return 0
    return streamk_parts_bytes(streamk_split(tile_count(problem, config["MWG"], config["NWG"]), groups)[1], config)


def k_chunk(k: int, splitk: int, kwg: int) -> int:
    """K per split-K slice, in whole KWG steps (mirrors kchunk in gemm_tiled.cl)."""
    per_slice = -(-k // splitk)
    return -(-per_slice // kwg) * kwg


def useful_splits(groups: int, units: int) -> tuple[int, ...]:
    """The splits (> 1) searched for a tile with ``groups`` work-groups on ``units`` compute units: none
    if the tiles alone occupy every unit, else the two largest that keep under 4 work-groups per unit."""
    if groups >= units:
        return ()
    return tuple(s for s in SPLITS[1:] if groups * s < 4 * units)[-2:]


_TILES = (16, 32, 64, 128, 256)
_THREADS = (8, 16, 32)
_LOADERS = (8, 16, 32, 64, 128, 256)
_LOADER_PARAMS = frozenset({"MDIMA", "NDIMB", "VWA", "VWB"})   # what GemmTiled._complete sets
# a preset's refinements given up one by one when it breaks a rule for the problem (GemmTiled.default)
_RELAXED = ({}, {"GM": 1}, {"GM": 1, "KWG": 8, "KWI": 2}, {"GM": 1, "STRM": 0, "STRN": 0})


def _params(device: Any, async_copies: bool) -> dict[str, tuple[int, ...]]:
    return {
        "MWG": _TILES, "NWG": _TILES, "KWG": (8, 16, 32), "SPLITK": SPLITS, "STREAMK": STREAMK_VALUES,
        "MDIMC": _THREADS, "NDIMC": _THREADS, "VWM": (1, 2, 4), "VWN": (1, 2, 4), "STRM": (0, 1), "STRN": (0, 1), "KWI": (2, 8),
        "SA": (0, 1), "SB": (0, 1),
        # before the loaders: the tile-load rules read the layout ASYNC gives the kernel (kernel_layout)
        "ASYNC": (0, 2, 3, 4) if async_copies else (0,),
        "MDIMA": _LOADERS, "NDIMB": _LOADERS, "VWA": (1, 2, 4),
        "VWB": (1, 2, 4), "DB": (0, 1), "PAD": (0, 1), "GM": (1, 8), "RWGS": (0, 1),
        "MAXRREG": (0, 128, 168) if is_nvidia(device) else (0,),
    }


def kernel_layout(problem: GemmProblem, config: Mapping[str, int]) -> tuple[bool, bool]:
    """(TRANS_A, TRANS_B) of the operands as the kernel reads them. With ASYNC a staged tile is copied
    as it lies, so a staged A is read stored K x M and a staged B stored K x N; the plan transposes an
    operand stored the other way first."""
    if not config.get("ASYNC"):
        return problem.trans_a, problem.trans_b
    return problem.trans_a or bool(config["SA"]), problem.trans_b and not config["SB"]


def _transposes_fit(problem: GemmProblem, config: Mapping[str, int], device: Any) -> bool:
    return workspace_fits(problem, with_layout(problem, *kernel_layout(problem, config)), max_alloc_bytes(device))


def local_memory_bytes(config: Mapping[str, int], problem: GemmProblem) -> int:
    """Bytes of local memory ``gemm_tiled.cl`` declares for ``config`` (mirrors ALD / BLD there)."""
    c = config
    ta, tb = kernel_layout(problem, c)
    pad_a = max(c["VWM"], c["VWA"] if ta else 1)
    pad_b = max(c["VWN"], 1 if tb else c["VWB"])
    a = c["SA"] * c["KWG"] * (c["MWG"] + c["PAD"] * pad_a)
    b = c["SB"] * c["KWG"] * (c["NWG"] + c["PAD"] * pad_b)
    return 4 * (c.get("ASYNC") or c["DB"] + 1) * (a + b)


def _tile_load_fits(along: int, across: int, threads_along: int, threads: int, width: int,
                    vectors_along: bool) -> bool:
    """Whether a tile of ``along`` x ``across`` elements splits evenly over ``threads`` threads laid
    out ``threads_along`` x (threads / threads_along), loading ``width``-wide vectors either along the
    first dimension (``vectors_along``) or across it."""
    if threads % threads_along:
        return False
    threads_across = threads // threads_along
    if vectors_along:
        return along % (threads_along * width) == 0 and across % threads_across == 0
    return along % threads_along == 0 and across % (threads_across * width) == 0


def _constraints(problem: GemmProblem, device: Any) -> list[Rule]:
    def ta(c: Mapping[str, int]) -> bool:
        return kernel_layout(problem, c)[0]

    def tb(c: Mapping[str, int]) -> bool:
        return kernel_layout(problem, c)[1]

    return [
        ("MWG_multiple_of_MDIMC", ("MWG", "MDIMC"), lambda c: c["MWG"] % c["MDIMC"] == 0),
        ("NWG_multiple_of_NDIMC", ("NWG", "NDIMC"), lambda c: c["NWG"] % c["NDIMC"] == 0),
        ("register_tile_at_most_16x8",  # MWI, NWI ≤ 16 and MWI*NWI ≤ 128 accumulators per thread
         ("MWG", "NWG", "MDIMC", "NDIMC"),
         lambda c: (c["MWG"] // c["MDIMC"] <= 16 and c["NWG"] // c["NDIMC"] <= 16
                    and (c["MWG"] // c["MDIMC"]) * (c["NWG"] // c["NDIMC"]) <= 128)),
        ("work_group_size_within_device", ("MDIMC", "NDIMC"),
         lambda c: c["MDIMC"] * c["NDIMC"] <= device.max_work_group_size),
        ("MWI_multiple_of_VWM", ("MWG", "MDIMC", "VWM"), lambda c: (c["MWG"] // c["MDIMC"]) % c["VWM"] == 0),
        ("NWI_multiple_of_VWN", ("NWG", "NDIMC", "VWN"), lambda c: (c["NWG"] // c["NDIMC"]) % c["VWN"] == 0),
        # Equivalent configs are kept once: the stride order only matters with several vectors.
        ("STRM_only_with_several_vectors", ("MWG", "MDIMC", "VWM", "STRM"),
         lambda c: c["STRM"] == 0 or c["MWG"] // c["MDIMC"] > c["VWM"]),
        ("STRN_only_with_several_vectors", ("NWG", "NDIMC", "VWN", "STRN"),
         lambda c: c["STRN"] == 0 or c["NWG"] // c["NDIMC"] > c["VWN"]),
        ("KWI_divides_KWG", ("KWG", "KWI"), lambda c: c["KWG"] % c["KWI"] == 0),
        ("A_tile_load_layout",  # MDIMA x KDIMA threads cover the A tile with VWA-wide vectors
         ("MWG", "KWG", "MDIMC", "NDIMC", "SA", "MDIMA", "VWA", "SB", "ASYNC"),
         lambda c: c["SA"] == 0 or _tile_load_fits(c["MWG"], c["KWG"], c["MDIMA"], c["MDIMC"] * c["NDIMC"],
                                                   c["VWA"], vectors_along=ta(c))),
        ("MDIMA_VWA_unused_without_SA", ("MDIMC", "SA", "MDIMA", "VWA"),
         lambda c: c["SA"] == 1 or (c["MDIMA"] == c["MDIMC"] and c["VWA"] == 1)),
        ("B_tile_load_layout",
         ("NWG", "KWG", "MDIMC", "NDIMC", "SB", "NDIMB", "VWB", "SA", "ASYNC"),
         lambda c: c["SB"] == 0 or _tile_load_fits(c["NWG"], c["KWG"], c["NDIMB"], c["MDIMC"] * c["NDIMC"],
                                                   c["VWB"], vectors_along=not tb(c))),
        ("NDIMB_VWB_unused_without_SB", ("NDIMC", "SB", "NDIMB", "VWB"),
         lambda c: c["SB"] == 1 or (c["NDIMB"] == c["NDIMC"] and c["VWB"] == 1)),
        ("DB_PAD_need_local_memory", ("SA", "SB", "DB", "PAD"),
         lambda c: (c["SA"] or c["SB"]) or (c["DB"] == 0 and c["PAD"] == 0)),
        ("ASYNC_replaces_DB", ("DB", "ASYNC"), lambda c: not (c["ASYNC"] and c["DB"])),
        ("ASYNC_needs_a_staged_tile", ("SA", "SB", "ASYNC"), lambda c: not c["ASYNC"] or c["SA"] or c["SB"]),
        ("ASYNC_transposed_copies_within_cap", ("SA", "SB", "ASYNC"),
         lambda c: not c["ASYNC"] or _transposes_fit(problem, c, device)),
        ("local_memory_within_device",
         ("MWG", "NWG", "KWG", "VWM", "VWN", "SA", "SB", "VWA", "VWB", "DB", "PAD", "ASYNC"),
         lambda c: local_memory_bytes(c, problem) <= device.local_mem_size),
        ("MAXRREG_ignored_with_RWGS", ("RWGS", "MAXRREG"), lambda c: not (c["RWGS"] and c["MAXRREG"])),
        ("workspace_within_device", ("SPLITK",),
         lambda c: splitk_workspace_bytes(problem, c["SPLITK"]) <= max_alloc_bytes(device)),
        ("STREAMK_without_SPLITK", ("SPLITK", "STREAMK"), lambda c: c["STREAMK"] == 0 or c["SPLITK"] == 1),
        ("STREAMK_steps_within_int32", ("MWG", "NWG", "KWG", "STREAMK"),
         lambda c: c["STREAMK"] == 0 or tile_count(problem, c["MWG"], c["NWG"]) * -(-problem.k // c["KWG"])
         < INT32_MAX),
        ("STREAMK_workspace_within_device", ("MWG", "NWG", "STREAMK"),
         lambda c: streamk_workspace_bytes(problem, c, device) <= max_alloc_bytes(device)),
    ]


def _coalesced(extent: int, threads: int, threads_along: int, width: int) -> bool:
    """Threads along a tile's contiguous dimension: as many as the tile and work-group allow (whole
    rows per sweep), or exactly one 128-byte line's worth."""
    return threads_along == min(extent // width, threads) or threads_along * width == 32


def _best_width(along: int, across: int, threads: int, cap: int, vectors_along: bool) -> int:
    """The widest vector (<= ``cap``) for which some coalesced thread layout covers the tile."""
    extent = along if vectors_along else across
    for width in (4, 2, 1):
        if width <= cap:
            for threads_along in _LOADERS:
                contiguous = threads_along if vectors_along else threads // max(1, threads_along)
                if (_tile_load_fits(along, across, threads_along, threads, width, vectors_along)
                        and _coalesced(extent, threads, contiguous, width)):
                    return width
    return 1


def _pruning(problem: GemmProblem, device: Any) -> list[Rule]:
    """Rules that drop valid configs which cannot pay off, to keep the space to 10^4-10^5 configs.

    A pruned config is still valid: it builds and computes correctly, it is just not searched.
    """
    m_cap, n_cap, k_cap = (max(16, next_pow2(problem.m)), max(16, next_pow2(problem.n)),
                           max(8, next_pow2(problem.k)))

    def ta(c: Mapping[str, int]) -> bool:  # the layout the kernel reads (ASYNC: after the transposes)
        return kernel_layout(problem, c)[0]

    def tb(c: Mapping[str, int]) -> bool:
        return kernel_layout(problem, c)[1]

    # Vector loads that the packed layout cannot use would only re-measure the scalar variant; on a
    # GPU scalar loads are not searched where vectors work (float4 loads gave +10-14% on the H200).
    def wide_a(c: Mapping[str, int]) -> int:
        return widest(problem.m if ta(c) else problem.k)

    def wide_b(c: Mapping[str, int]) -> int:
        return widest(problem.k if tb(c) else problem.n)
    gpu = device_type(device) == "gpu"
    units = compute_units(device)

    def threads(c: Mapping[str, int]) -> int:
        return c["MDIMC"] * c["NDIMC"]

    def groups(c: Mapping[str, int]) -> int:
        return -(-problem.m // c["MWG"]) * -(-problem.n // c["NWG"]) * problem.batch

    def widths_a(c: Mapping[str, int]) -> tuple[int, ...]:
        best = _best_width(c["MWG"], c["KWG"], threads(c), wide_a(c), ta(c))
        return (best,) if gpu else (1, best)

    def widths_b(c: Mapping[str, int]) -> tuple[int, ...]:
        best = _best_width(c["NWG"], c["KWG"], threads(c), wide_b(c), not tb(c))
        return (best,) if gpu else (1, best)

    return [
        ("tile_within_problem", ("MWG", "NWG", "KWG"),
         lambda c: c["MWG"] <= m_cap and c["NWG"] <= n_cap and c["KWG"] <= k_cap),
        # Split K only where the tiles alone leave compute units idle, and only the two largest splits
        # that keep the work-groups under 4 per compute unit; every slice gets K work.
        ("SPLITK_fills_the_device", ("MWG", "NWG", "SPLITK"),
         lambda c: c["SPLITK"] == 1 or c["SPLITK"] in useful_splits(groups(c), units)),
        # Stream-K only where whole waves are followed by a part-filled one (fewer tiles than work-groups
        # is split K's regime), and only for tiles of at least 128 x 128 with 64 outputs per thread or
        # more, whose work-groups run long enough for a part-empty last wave to cost much (the parts cost
        # two tile stores and a fixup pass; the H200 gains were with 128 x 128, 8 x 8 per thread).
        ("STREAMK_only_for_a_part_filled_last_wave", ("MWG", "NWG", "STREAMK"),
         lambda c: c["STREAMK"] == 0 or (gpu and groups(c) > c["STREAMK"] * units
                                         and groups(c) % (c["STREAMK"] * units) != 0)),
        ("STREAMK_only_for_big_tiles", ("MWG", "NWG", "MDIMC", "NDIMC", "STREAMK"),
         lambda c: c["STREAMK"] == 0 or (c["MWG"] * c["NWG"] >= 128 * 128
                                         and (c["MWG"] // c["MDIMC"]) * (c["NWG"] // c["NDIMC"]) >= 64)),
        ("SPLITK_slices_have_k_work", ("KWG", "SPLITK"),
         lambda c: (c["SPLITK"] - 1) * k_chunk(problem.k, c["SPLITK"], c["KWG"]) < problem.k),
        ("tile_aspect_at_most_2", ("MWG", "NWG"),
         lambda c: max(c["MWG"], c["NWG"]) <= 2 * min(c["MWG"], c["NWG"])),
        ("register_tile_balanced",  # MWI/NWI in {1/2, 1, 2}, at least 4 outputs per thread
         ("MWG", "NWG", "MDIMC", "NDIMC"),
         lambda c: _balanced(c["MWG"] // c["MDIMC"], c["NWG"] // c["NDIMC"])),
        ("stage_both_or_neither", ("SA", "SB"), lambda c: c["SA"] == c["SB"]),
        ("VWA_widest_for_tile_and_packed_A", ("MWG", "KWG", "MDIMC", "NDIMC", "SA", "VWA", "SB", "ASYNC"),
         lambda c: c["SA"] == 0 or c["VWA"] in widths_a(c)),
        ("VWB_widest_for_tile_and_packed_B", ("NWG", "KWG", "MDIMC", "NDIMC", "SB", "VWB", "SA", "ASYNC"),
         lambda c: c["SB"] == 0 or c["VWB"] in widths_b(c)),
        ("A_tile_load_coalesced", ("MWG", "KWG", "MDIMC", "NDIMC", "SA", "MDIMA", "VWA", "SB", "ASYNC"),
         lambda c: c["SA"] == 0 or (_coalesced(c["MWG"], threads(c), c["MDIMA"], c["VWA"]) if ta(c) else
                                    _coalesced(c["KWG"], threads(c), threads(c) // c["MDIMA"], c["VWA"]))),
        ("B_tile_load_coalesced", ("NWG", "KWG", "MDIMC", "NDIMC", "SB", "NDIMB", "VWB", "SA", "ASYNC"),
         lambda c: c["SB"] == 0 or (_coalesced(c["KWG"], threads(c), threads(c) // c["NDIMB"], c["VWB"]) if tb(c)
                                    else _coalesced(c["NWG"], threads(c), c["NDIMB"], c["VWB"]))),
        ("PAD_only_with_transposed_stores", ("SA", "SB", "PAD", "ASYNC"),
         lambda c: c["PAD"] == 0 or (c["SA"] and not ta(c)) or (c["SB"] and tb(c))),
        ("GM_only_with_several_bands", ("MWG", "NWG", "GM"),
         lambda c: c["GM"] == 1 or (-(-problem.m // c["MWG"]) > c["GM"] and problem.n > c["NWG"])),
        ("MAXRREG_only_for_big_register_tiles", ("MWG", "NWG", "MDIMC", "NDIMC", "MAXRREG"),
         lambda c: c["MAXRREG"] == 0 or (c["MWG"] // c["MDIMC"]) * (c["NWG"] // c["NDIMC"]) >= 64),
        # NVIDIA SMs have 64K registers: a cap pays only if it lets more work-groups reside.
        ("MAXRREG_raises_occupancy", ("MDIMC", "NDIMC", "MAXRREG"),
         lambda c: c["MAXRREG"] == 0 or 65536 // (threads(c) * c["MAXRREG"]) > 65536 // (threads(c) * 256)),
        ("local_reads_vectorized", ("MWG", "NWG", "MDIMC", "NDIMC", "VWM", "VWN"),
         lambda c: (c["VWM"] > 1 or c["MWG"] == c["MDIMC"]) and (c["VWN"] > 1 or c["NWG"] == c["NDIMC"])),
        # > 32 work-groups per compute unit; a tile that already spans the (padded) matrix along M or
        # N cannot grow there (with the aspect rule it cannot grow along the other either), so small
        # batched matrices (3x8x4 x 72) and skinny fc products (2x4096x25088) keep it
        ("tile_not_tiny_for_big_problems", ("MWG", "NWG"),
         lambda c: (c["MWG"] * c["NWG"] >= 64 * 64 or groups(c) <= 32 * units
                    or c["MWG"] >= m_cap or c["NWG"] >= n_cap)),
    ]


def _balanced(mwi: int, nwi: int) -> bool:
    return mwi * nwi >= 4 and max(mwi, nwi) <= 2 * min(mwi, nwi)


def _grid(config: Mapping[str, int], problem: GemmProblem,
          streamk: tuple[int, int] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    c = config
    local = (c["NDIMC"], c["MDIMC"], 1)
    if streamk is not None:  # gemm_streamk: a 1-D list of work-groups (whole tiles, then stream-K)
        return (sum(streamk) * c["NDIMC"], c["MDIMC"], 1), local
    glob = (-(-problem.n // c["NWG"]) * c["NDIMC"], -(-problem.m // c["MWG"]) * c["MDIMC"],
            problem.batch * c["SPLITK"])
    return glob, local


# Default tile shapes, best first: (MWG, NWG, KWG, MDIMC, NDIMC, VWM, VWN). The GPU ones follow the
# H200 notes (128x128 tiles, 8x8 outputs per thread, float4 everywhere, double buffering).
_GPU_PRESETS = [
    (128, 128, 16, 16, 16, 4, 4),
    (64, 64, 16, 16, 16, 4, 4),
    (32, 32, 16, 8, 8, 4, 4),
    (16, 16, 8, 8, 8, 2, 2),
]
# PoCL: large per-thread tiles, contiguous outputs (measured at 512^3 on a 2-core EPYC: 16x8 per
# thread in 128x128 tiles ran ~3x faster than 8x8 in 64x64 tiles).
_CPU_PRESETS = [
    (128, 128, 16, 8, 16, 4, 4),
    (64, 64, 16, 8, 8, 4, 4),
    (32, 32, 16, 8, 8, 4, 4),
    (16, 16, 8, 8, 8, 2, 2),
]


class GemmTiled(Fp32Gemm):
    """The ``gemm_tiled`` algorithm (see the module docstring for its tunables)."""

    name = NAME
    version = VERSION

    def space(self, problem: GemmProblem, device: Device) -> Space:
        return self._space(problem, device, CP_ASYNC in capabilities(device))

    def _space(self, problem: GemmProblem, device: Device, async_copies: bool) -> Space:
        check_dtype(NAME, problem, "float32")
        # configs stored before SPLITK / ASYNC / STREAMK existed built what 1 / 0 / 0 build now
        return make_space(_params(device, async_copies), _constraints(problem, device), _pruning(problem, device),
                          implied={"SPLITK": 1, "ASYNC": 0, "STREAMK": 0})

    def default(self, problem: GemmProblem, device: Device) -> Config:
        """A heuristic config: the largest preset tile that still gives every compute unit a
        work-group (GPU), with vector widths the packed layout can use; always valid and searched.

        On a GPU, when even that leaves fewer than two work-groups per compute unit and the reduction
        is long (split K's regime), K is split instead (:meth:`_split_default`); CPUs never split."""
        space = self.space(problem, device)
        gpu = device_type(device) == "gpu"
        presets = _GPU_PRESETS if gpu else _CPU_PRESETS
        rules = _constraints(problem, device) + _pruning(problem, device)
        plain = None
        for index, preset in enumerate(presets):
            groups = -(-problem.m // preset[0]) * -(-problem.n // preset[1]) * problem.batch
            if gpu and index + 1 < len(presets) and groups < compute_units(device):
                continue
            plain = self._from_preset(preset, 1, problem, space, rules, gpu)
            if plain is not None:
                break
        if plain is None:
            searched = space.configs()
            # Pruning emptied the searched space: any valid config still computes correctly.
            plain = searched[0] if searched else next(iter(enumerate_space(_params(device, False),
                                                                           _constraints(problem, device))))
        if gpu:
            return self._split_default(plain, problem, device, space, rules) or plain
        return plain

    def _from_preset(self, preset: tuple[int, ...], splitk: int, problem: GemmProblem, space: Space,
                     rules: Sequence[Rule], gpu: bool) -> Config | None:
        """The first valid, searched completion of a preset tile shape, or None."""
        mwg, nwg, kwg, mdimc, ndimc, vwm, vwn = preset
        base = {"MWG": mwg, "NWG": nwg, "KWG": kwg, "SPLITK": splitk, "MDIMC": mdimc, "NDIMC": ndimc,
                "VWM": vwm, "VWN": vwn, "STRM": int(gpu), "STRN": int(gpu), "KWI": 2 if gpu else 8, "SA": 1,
                "SB": 1, "DB": 1 if gpu else 0, "PAD": 0, "GM": 8 if gpu else 1, "RWGS": 0, "MAXRREG": 0,
                "ASYNC": 0, "STREAMK": 0}
        # The rules that read no loader setting give one answer per refinement whatever the loaders:
        # asked once each (hundreds of loader settings are tried when the widest ones break a rule).
        independent = [check for _, needs, check in rules if _LOADER_PARAMS.isdisjoint(needs)]
        dependent = [check for _, needs, check in rules if not _LOADER_PARAMS.isdisjoint(needs)]
        passes: dict[int, bool] = {}
        for config in self._complete(base, problem):
            # If the preset breaks a rule for this problem, give up its refinements one by one.
            for index, relax in enumerate(_RELAXED):
                candidate = {**config, **relax}
                candidate["STRM"] &= int(candidate["MWG"] // candidate["MDIMC"] > candidate["VWM"])
                candidate["STRN"] &= int(candidate["NWG"] // candidate["NDIMC"] > candidate["VWN"])
                ok = passes.get(index)
                if ok is None:
                    ok = passes[index] = all(check(candidate) for check in independent)
                # (the space's own constraints are among the rules: what is_valid adds is the value ranges)
                if ok and space.in_ranges(candidate) and all(check(candidate) for check in dependent):
                    return candidate
        return None

    def _split_default(self, plain: Config, problem: GemmProblem, device: Any, space: Space,
                       rules: Sequence[Rule]) -> Config | None:
        """A split-K config when the unsplit default ``plain`` has fewer than 2 work-groups per compute
        unit, K holds at least 8 of its K steps and K exceeds M and N (each output is a long dot
        product: fc layers such as 64x1000x2048); else None, and ``plain`` stays the default.

        Each preset tile (best first) whose tiles leave compute units idle is split S ways, S the power
        of two (at most 32) that brings the work-groups nearest to 2 per compute unit, with at least 4
        K steps per slice. The first that gives every compute unit a work-group wins, else the one
        with the most work-groups (tiny outputs cannot fill the device)."""
        units = compute_units(device)
        p = problem

        def groups(mwg: int, nwg: int) -> int:
            return -(-p.m // mwg) * -(-p.n // nwg) * p.batch

        if (groups(plain["MWG"], plain["NWG"]) >= 2 * units or p.k < 8 * plain["KWG"]
                or p.k <= max(p.m, p.n)):
            return None
        best: Config | None = None
        for preset in _GPU_PRESETS:
            tiles, kwg = groups(preset[0], preset[1]), preset[2]
            if tiles >= units:
                continue
            most = max(s for s in SPLITS if s == 1 or 4 * kwg * s <= p.k)
            splitk = min(most, SPLITS[-1], 1 << round(math.log2(2 * units / tiles)))
            config = self._from_preset(preset, splitk, problem, space, rules, gpu=True) if splitk > 1 else None
            if config is not None:
                if tiles * splitk >= units:
                    return config
                if best is None or tiles * splitk > groups(best["MWG"], best["NWG"]) * best["SPLITK"]:
                    best = config
        return best

    @staticmethod
    def _complete(base: dict[str, int], problem: GemmProblem) -> Iterator[dict[str, int]]:
        """Loader settings for ``base``, widest vectors first, then most threads along the contiguous
        dimension (coalescing)."""
        threads = base["MDIMC"] * base["NDIMC"]
        ta, tb = problem.trans_a, problem.trans_b
        along_a = sorted(_LOADERS, reverse=ta)  # A's rows run along M if transposed: many along M
        along_b = sorted(_LOADERS, reverse=not tb)  # B's rows run along N unless transposed
        for width in (4, 2, 1):
            mdima = next((t for t in along_a
                          if _tile_load_fits(base["MWG"], base["KWG"], t, threads, width, ta)), None)
            ndimb = next((t for t in along_b
                          if _tile_load_fits(base["NWG"], base["KWG"], t, threads, width, not tb)), None)
            if mdima and ndimb:
                yield {**base, "MDIMA": mdima, "NDIMB": ndimb, "VWA": width, "VWB": width}
        for wa in (4, 2, 1):
            for wb in (4, 2, 1):
                for mdima in _LOADERS:
                    for ndimb in _LOADERS:
                        yield {**base, "MDIMA": mdima, "NDIMB": ndimb, "VWA": wa, "VWB": wb}

    def build(self, problem: GemmProblem, device: Device, config: Config, *, emulate: bool = False,
              sum_batch: bool = False) -> Any:
        """Compile ``config`` for ``problem``; ValueError (before compiling) if the config is invalid.

        Returns a :class:`GemmPlan`, or with ASYNC for an operand stored the other way a
        :class:`~tunecl.kernels.gemm.gemm_pretrans.PretransposedPlan` around one (same ``run``).

        Args:
            emulate: allow ASYNC on any device, compiled with plain copies instead of cp.async
                (``ASYNC_STUB``): tests of the ASYNC layouts where the PTX does not run.
            sum_batch: where the device passes the split-finish probe and the config runs the plain
                kernel on the operands as stored (no stream-K tail, no transposed copy), a plan whose C is
                one matrix, the sum of the batch's products (:attr:`GemmPlan.sum_batch`; see
                ``SUM_BATCH`` in gemm_tiled.cl); elsewhere the ordinary plan.
        """
        space = self._space(problem, device, True) if emulate else self.space(problem, device)
        check_config(space, config, NAME)
        config = space.complete(config)  # results stored before SPLITK / ASYNC existed: 1 / 0
        trans_a, trans_b = kernel_layout(problem, config)
        if (trans_a, trans_b) != (problem.trans_a, problem.trans_b):
            inner = self.build(with_layout(problem, trans_a, trans_b), device, config, emulate=emulate)
            return PretransposedPlan(problem, inner, config, device)
        source = read_source(__package__, "gemm_tiled.cl")
        layout = layout_options(problem)
        if emulate and config["ASYNC"]:
            layout.append("-DASYNC_STUB=1")
        if config["MAXRREG"]:
            layout.append(f"-cl-nv-maxrregcount={config['MAXRREG']}")
        finish = config["SPLITK"] > 1 and FINISH_SPLITS and split_finish.finishes(device)
        if finish:
            layout.append("-DSPLITK_FINISH=1")
        groups = streamk_groups(config, device)
        sum_batch = sum_batch and problem.batch > 1 and not groups and split_finish.finishes(device)
        if sum_batch:
            layout.append("-DSUM_BATCH=1")
        options = variant_options(config, layout, config["VWA"], config["VWB"])
        streamk = streamk_split(tile_count(problem, config["MWG"], config["NWG"]), groups) if groups else None
        glob, local = _grid(config, problem, streamk)
        # With split K the kernel's "C" is the aligned workspace; the reduction accesses C by scalars.
        width_c = config["VWN"] if config["SPLITK"] == 1 else 1
        return GemmPlan(algorithm=NAME, problem=problem, device=device, config=config, source=source,
                        options=options, widths=(config["VWA"], config["VWB"], width_c),
                        global_size=glob, local_size=local, splitk=config["SPLITK"], streamk=streamk,
                        splitk_finish=finish, sum_batch=sum_batch)


ALGORITHMS = [GemmTiled()]
