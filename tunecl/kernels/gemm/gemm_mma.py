"""gemm_mma_tf32 and gemm_mma_f16: GEMM on NVIDIA tensor cores through inline PTX, fp32 accumulation.

``gemm_mma_tf32`` computes fp32 GEMMs with TF32 inputs; ``gemm_mma_f16`` computes float16 GEMMs
(``GemmProblem(dtype="float16")``: half A, B and C) with ``mma.sync ... m16n8k16 ... f16``, fp32
accumulation and one rounding of ``alpha * sum + beta * C`` to half (to nearest even). Both are the
same kernel, ``gemm_mma.cl`` (``MMA_F16`` selects the variant), with the same tunables; the notes
below say where the f16 family differs.

Same semantics, problem coverage and :class:`~tunecl.kernels.gemm.core.GemmPlan` (``run`` signature) as
``gemm_tiled``, so it can replace it anywhere a TF32 result is acceptable: its ``precision`` is
``"tf32"`` (the fp32 families have none and are strict ``"fp32"``). It applies only on devices whose
runtime probe showed that ``mma.sync ... m16n8k8 ... tf32`` computes correctly (``"mma_tf32"`` in
``device.capabilities``), never by vendor name; its cp.async variant only where the ``"cp_async"``
probe passed too. The OpenCL C is ``gemm_mma.cl`` (its banner explains
the decomposition and the fragment layout). Tunables, with the values searched:

=======  ================  ========================================================================
MWG/NWG  16 .. 256         C tile per work-group along M / N
KWG      8 16 32           depth of one K step (the local-memory tiles); f16: 16 32 64
WARPS_M  1 2 4             warps along M (WARPS_N: along N); a warp computes (MWG/WARPS_M) x
                           (NWG/WARPS_N) as a grid of 16 x 8 mma tiles
VW       1 2 4             vector width of global loads of A and B along their contiguous dimension;
                           f16: 1 2 4 8 (8 halves: 128-bit loads)
KPAIR    0 1               1: a lane holds k = 2t, 2t+1 (64-bit local reads of K-contiguous tiles)
PAD      0 1               pad local rows so that fragment reads are free of bank conflicts
ASYNC    0 (1)             1: cp.async copies into local memory (devices with ``"cp_async"``);
                           0: copies through registers, rounded to TF32 on the way
STAGES   1 2 (3 4)         local-memory buffers per tile: 1, 2 (double buffering with register
                           prefetch) through registers; 2, 3, 4 with cp.async
GM       1 8               work-group order: bands of GM tile rows (L2 locality)
MAXRREG  0 (128)           -cl-nv-maxrregcount (NVIDIA only; 0: not passed): more work-groups per SM
=======  ================  ========================================================================

Constraints (named) cover the warp-tile shape (multiples of 16 x 8), at most 128 accumulators per
lane, even tile loads, device limits (work-group size, local memory) — all checked before compiling.
Pruning rules keep the searched space to a few thousand configs; pruned configs remain valid.

``gemm_mma_f16`` applies only to float16 problems on devices whose probe granted ``"mma_f16"``
(``mma.sync ... m16n8k16 ... f16`` computes correctly); its results are stored at precision ``"fp32"``:
its inputs are not rounded (they are halves already) and it sums in fp32 like the converted-operand
route of the backend, so a strict request may be served by it. The verification tolerance of float16
problems adds the rounding of the output to half (``tunecl.search.harness``).

Tests on devices without tensor cores build with ``emulate=True``: the kernel then computes the same
fragments with plain OpenCL C instead of PTX (``MMA_STUB`` in the ``.cl``), which checks every index
of the kernel except the two PTX instructions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from tunecl.kernels.base import Config, Space, read_source
from tunecl.kernels.gemm.core import (GemmPlan, Rule, capabilities, check_config, check_dtype, compute_units,
                                      enumerate_space, is_nvidia, layout_options, make_space, row_grid,
                                      variant_options, widest)
from tunecl.kernels.sizes import next_pow2
from tunecl.precision import FP32, TF32
from tunecl.problems import GemmProblem
from tunecl.runtime import CP_ASYNC, MMA_F16, MMA_TF32, Device

NAME = "gemm_mma_tf32"
VERSION = 1
PRECISION = TF32
CAPABILITY = MMA_TF32

F16_NAME = "gemm_mma_f16"
F16_VERSION = 1


@dataclasses.dataclass(frozen=True)
class MmaFamily:
    """What tells the TF32 and the f16 family of an ``mma.sync`` kernel apart (``MMA_F16`` in its
    ``.cl``): this module's GEMMs and the implicit-GEMM convolutions."""

    name: str
    version: int
    precision: str    # what results are stored under (tunecl.precision)
    capability: str   # the probe that must have granted the instruction
    dtype: str        # the problem dtype it computes
    f16: bool         # MMA_F16
    element_bytes: int  # of the tensors and of the local tiles
    kwg: tuple[int, ...]  # KWG values: multiples of the mma depth
    # default tile shapes, best first: (MWG, NWG, KWG, WARPS_M, WARPS_N)
    presets: tuple[tuple[int, int, int, int, int], ...]

    @property
    def mma_k(self) -> int:
        """Depth of one mma: 8 (TF32), 16 (f16)."""
        return self.kwg[0]


@dataclasses.dataclass(frozen=True)
class MmaVariant(MmaFamily):
    """A GEMM family on ``mma.sync`` (``gemm_mma.cl``)."""

    widths: tuple[int, ...]  # VW values


# Default tile shapes, best first: (MWG, NWG, KWG, WARPS_M, WARPS_N). 128 x 128 x 16 with 2 x 4 warps
# gives 64 x 32 warp tiles (4 x 4 mma tiles, 64 accumulators per lane): with 2 x 2 warps (64 x 64, as
# CUTLASS does with cp.async) the register-staged double buffering needs ~255 registers and spills
# (ptxas for sm_90, TN/TT layouts). Smaller tiles when the big one would leave compute units idle.
# The default copies through registers (ASYNC 0): it needs only the mma capability.
# f16: the same warp tiles, 32 halves deep (two m16n8k16 steps per tile, the same bytes per tile as
# TF32's 16; two stages of 128 x 128 x 32 take at most the 48 KiB an H200 work-group gets).
TF32_VARIANT = MmaVariant(
    name=NAME, version=VERSION, precision=TF32, capability=MMA_TF32, dtype="float32", f16=False,
    element_bytes=4, kwg=(8, 16, 32), widths=(1, 2, 4),
    presets=((128, 128, 16, 2, 4), (64, 64, 16, 2, 2), (32, 32, 16, 1, 1), (16, 16, 8, 1, 1)),
)
F16_VARIANT = MmaVariant(
    name=F16_NAME, version=F16_VERSION, precision=FP32, capability=MMA_F16, dtype="float16", f16=True,
    element_bytes=2, kwg=(16, 32, 64), widths=(1, 2, 4, 8),
    presets=((128, 128, 32, 2, 4), (64, 64, 32, 2, 2), (32, 32, 32, 1, 1), (16, 16, 16, 1, 1)),
)


def variant_of(problem: GemmProblem) -> MmaVariant:
    """The family that computes ``problem``'s dtype (float16: gemm_mma_f16, else gemm_mma_tf32)."""
    return F16_VARIANT if problem.dtype == F16_VARIANT.dtype else TF32_VARIANT


_TILES = (16, 32, 64, 128, 256)


def _params(async_copies: bool, nvidia: bool, variant: MmaVariant = TF32_VARIANT) -> dict[str, tuple[int, ...]]:
    return {
        "MWG": _TILES,
        "NWG": _TILES,
        "KWG": variant.kwg,
        "WARPS_M": (1, 2, 4),
        "WARPS_N": (1, 2, 4),
        "VW": variant.widths,
        "KPAIR": (0, 1),
        "PAD": (0, 1),
        "ASYNC": (0, 1) if async_copies else (0,),
        "STAGES": (1, 2, 3, 4),
        "GM": (1, 8),
        "MAXRREG": (0, 128) if nvidia else (0,),
    }


MMA_STUB_WORDS = 192  # local words per warp of the emulated mma (MMA_WORDS in the .cl)


def warps(config: Mapping[str, int]) -> int:
    """Warps per work-group (WARPS_M x WARPS_N; the convolution family on mma.sync shares these
    helpers)."""
    return config["WARPS_M"] * config["WARPS_N"]


def accumulators(config: Mapping[str, int]) -> int:
    """fp32 accumulators per lane: 4 per 16 x 8 mma tile of the warp tile."""
    return (config["MWG"] // config["WARPS_M"] // 16) * (config["NWG"] // config["WARPS_N"] // 8) * 4


def padding(config: Mapping[str, int], k_contiguous: bool, f16: bool = False) -> int:
    """Elements of padding per local row (mirrors PADDING in ``gemm_mma.cl`` and
    ``conv_implicit_gemm_mma.cl``): words, halves with f16."""
    if not config["PAD"]:
        return 0
    if f16:
        if k_contiguous:
            return (0 if (config["KWG"] // 16) % 2 else 16) if config["KPAIR"] else 8
        return 8
    if k_contiguous:
        return (0 if (config["KWG"] // 8) % 2 else 8) if config["KPAIR"] else 4
    return 4 if config["KPAIR"] else 8


def local_memory_bytes(config: Mapping[str, int], problem: GemmProblem, emulate: bool = False) -> int:
    """Bytes of local memory ``gemm_mma.cl`` declares for ``config`` (mirrors A_TILE / B_TILE there;
    the family is the one of ``problem``'s dtype)."""
    c = config
    variant = variant_of(problem)
    f16 = variant.f16
    if problem.trans_a:  # A tile: KWG rows of MWG (M contiguous)
        a_elements = c["KWG"] * (c["MWG"] + padding(c, False, f16))
    else:
        a_elements = c["MWG"] * (c["KWG"] + padding(c, True, f16))
    if problem.trans_b:  # B tile: NWG rows of KWG (K contiguous)
        b_elements = c["NWG"] * (c["KWG"] + padding(c, True, f16))
    else:
        b_elements = c["KWG"] * (c["NWG"] + padding(c, False, f16))
    stub = warps(c) * MMA_STUB_WORDS * 4 if emulate else 0
    return variant.element_bytes * c["STAGES"] * (a_elements + b_elements) + stub


def _constraints(problem: GemmProblem, device: Any) -> list[Rule]:
    def loads_split_evenly(tile: int, c: Mapping[str, int]) -> bool:  # tile x KWG over the threads
        return (tile * c["KWG"]) % (c["VW"] * 32 * warps(c)) == 0

    return [
        ("warp_tile_rows_multiple_of_16", ("MWG", "WARPS_M"), lambda c: c["MWG"] % (16 * c["WARPS_M"]) == 0),
        ("warp_tile_cols_multiple_of_8", ("NWG", "WARPS_N"), lambda c: c["NWG"] % (8 * c["WARPS_N"]) == 0),
        ("at_most_128_accumulators", ("MWG", "NWG", "WARPS_M", "WARPS_N"), lambda c: accumulators(c) <= 128),
        (
            "work_group_size_within_device",
            ("WARPS_M", "WARPS_N"),
            lambda c: 32 * warps(c) <= device.max_work_group_size,
        ),
        (
            "A_tile_loads_split_evenly",
            ("MWG", "KWG", "WARPS_M", "WARPS_N", "VW"),
            lambda c: loads_split_evenly(c["MWG"], c),
        ),
        (
            "B_tile_loads_split_evenly",
            ("NWG", "KWG", "WARPS_M", "WARPS_N", "VW"),
            lambda c: loads_split_evenly(c["NWG"], c),
        ),
        ("STAGES_1_or_2_through_registers", ("ASYNC", "STAGES"), lambda c: c["ASYNC"] or c["STAGES"] <= 2),
        ("STAGES_2_to_4_with_cp_async", ("ASYNC", "STAGES"), lambda c: not c["ASYNC"] or c["STAGES"] >= 2),
        (
            "local_memory_within_device",
            ("MWG", "NWG", "KWG", "WARPS_M", "WARPS_N", "KPAIR", "PAD", "ASYNC", "STAGES"),
            lambda c: local_memory_bytes(c, problem) <= device.local_mem_size,
        ),
    ]


def _pruning(problem: GemmProblem, device: Any) -> list[Rule]:
    """Rules that drop valid configs which cannot pay off, to keep the space to a few thousand.

    A pruned config is still valid: it builds and computes correctly, it is just not searched.
    """
    variant = variant_of(problem)
    m_cap, n_cap, k_cap = (
        max(16, next_pow2(problem.m)),
        max(16, next_pow2(problem.n)),
        max(variant.mma_k, next_pow2(problem.k)),
    )
    widths = sorted(variant.widths, reverse=True)
    # The widest vector the packed layout keeps aligned for A or B (the plan runs a scalar variant for
    # an operand that is not): narrower vectors would only re-measure slower loads.
    wide = max(
        widest(problem.m if problem.trans_a else problem.k, widths),
        widest(problem.k if problem.trans_b else problem.n, widths),
    )
    units = compute_units(device)

    def groups(c: Mapping[str, int]) -> int:
        return -(-problem.m // c["MWG"]) * -(-problem.n // c["NWG"]) * problem.batch

    def widest_loads(c: Mapping[str, int]) -> int:
        threads = 32 * warps(c)
        return next(
            (
                w
                for w in widths
                if w <= wide
                and (c["MWG"] * c["KWG"]) % (w * threads) == 0
                and (c["NWG"] * c["KWG"]) % (w * threads) == 0
            ),
            1,
        )

    spans = lambda c: c["MWG"] >= m_cap or c["NWG"] >= n_cap  # a tile spanning M or N
    return [
        (
            "tile_within_problem",
            ("MWG", "NWG", "KWG"),
            lambda c: c["MWG"] <= m_cap and c["NWG"] <= n_cap and c["KWG"] <= k_cap,
        ),
        (
            "tile_aspect_at_most_2",
            ("MWG", "NWG"),
            lambda c: max(c["MWG"], c["NWG"]) <= 2 * min(c["MWG"], c["NWG"]) or spans(c),
        ),
        # warp tiles of 32 x 16 .. 64 x 64, square-ish (rows / columns between 1/2 and 2)
        (
            "warp_tile_balanced",
            ("MWG", "NWG", "WARPS_M", "WARPS_N"),
            lambda c: (
                (accumulators(c) >= 16 or groups(c) <= 4 * units or spans(c))
                and 2 * (c["NWG"] // c["WARPS_N"]) >= c["MWG"] // c["WARPS_M"]
                and 2 * (c["MWG"] // c["WARPS_M"]) >= c["NWG"] // c["WARPS_N"]
            ),
        ),
        ("at_most_8_warps", ("WARPS_M", "WARPS_N"), lambda c: warps(c) <= 8),
        (
            "VW_widest_for_tile_and_packed_layout",
            ("MWG", "NWG", "KWG", "WARPS_M", "WARPS_N", "VW"),
            lambda c: c["VW"] == widest_loads(c),
        ),
        (
            "GM_only_with_several_bands",
            ("MWG", "NWG", "GM"),
            lambda c: c["GM"] == 1 or (-(-problem.m // c["MWG"]) > c["GM"] and problem.n > c["NWG"]),
        ),
        # > 32 work-groups per compute unit: a bigger tile would do; a tile spanning the (padded) matrix
        # along M or N cannot grow there
        (
            "tile_not_tiny_for_big_problems",
            ("MWG", "NWG"),
            lambda c: c["MWG"] * c["NWG"] >= 64 * 64 or groups(c) <= 32 * units or spans(c),
        ),
        # a register cap pays only where the kernel needs many (64+ accumulators per lane)
        (
            "MAXRREG_only_for_big_warp_tiles",
            ("MWG", "NWG", "WARPS_M", "WARPS_N", "MAXRREG"),
            lambda c: c["MAXRREG"] == 0 or accumulators(c) >= 64,
        ),
    ]


class TensorCoreGemm:
    """What the tensor-core GEMM families share: each computes the GEMMs of its variant's dtype (fp32
    for TF32, float16 for f16), where the device's probe granted its instruction (:attr:`capability`)."""

    variant: Any
    name: str
    kind = "gemm"

    @property
    def capability(self) -> str:
        return self.variant.capability

    def applies(self, problem: GemmProblem, device: Device) -> bool:
        return (
            isinstance(problem, GemmProblem)
            and problem.dtype == self.variant.dtype
            and self.capability in capabilities(device)
        )


class GemmMmaTF32(TensorCoreGemm):
    """The ``gemm_mma_tf32`` algorithm (see the module docstring for its tunables)."""

    variant = TF32_VARIANT
    name = NAME
    version = VERSION
    precision = PRECISION

    def space(self, problem: GemmProblem, device: Device) -> Space:
        return self._space(problem, device, CP_ASYNC in capabilities(device), is_nvidia(device))

    def _space(self, problem: GemmProblem, device: Device, async_copies: bool, nvidia: bool) -> Space:
        check_dtype(self.name, problem, self.variant.dtype)
        return make_space(
            _params(async_copies, nvidia, self.variant),
            _constraints(problem, device),
            _pruning(problem, device),
        )

    def default(self, problem: GemmProblem, device: Device) -> Config:
        """The largest preset tile that still gives every compute unit a work-group, double buffered
        through registers, KPAIR and padding on, the widest vector loads; always valid and (where
        pruning allows) searched."""
        space = self.space(problem, device)
        rules = _constraints(problem, device) + _pruning(problem, device)
        units = compute_units(device)
        presets = self.variant.presets
        for index, (mwg, nwg, kwg, warps_m, warps_n) in enumerate(presets):
            groups = -(-problem.m // mwg) * -(-problem.n // nwg) * problem.batch
            if index + 1 < len(presets) and groups < units:
                continue
            for config in self._refinements(
                {
                    "MWG": mwg,
                    "NWG": nwg,
                    "KWG": kwg,
                    "WARPS_M": warps_m,
                    "WARPS_N": warps_n,
                    "KPAIR": 1,
                    "PAD": 1,
                    "ASYNC": 0,
                    "STAGES": 2,
                    "GM": 8,
                    "MAXRREG": 0,
                }
            ):
                if space.is_valid(config) and all(check(config) for _, _, check in rules):
                    return config
        searched = space.configs()
        if searched:
            return searched[0]
        # Pruning emptied the searched space: any valid config still computes correctly.
        return next(
            iter(enumerate_space(_params(False, False, self.variant), _constraints(problem, device)))
        )

    def _refinements(self, base: dict[str, int]) -> Iterator[dict[str, int]]:
        """``base`` with the widest vectors first, then giving up its refinements one by one."""
        shallow = self.variant.kwg[0]
        for relax in ({}, {"GM": 1}, {"GM": 1, "KWG": shallow}, {"GM": 1, "STAGES": 1}):
            for width in sorted(self.variant.widths, reverse=True):
                yield {**base, **relax, "VW": width}

    def build(
        self, problem: GemmProblem, device: Device, config: Config, *, emulate: bool = False
    ) -> GemmPlan:
        """Compile ``config`` for ``problem``; ValueError (before compiling) if the config is invalid.

        Args:
            emulate: compile the plain-C stand-in of the PTX (``MMA_STUB``), for tests on devices
                without tensor cores (cp.async and register-capped configs included; the cap is not
                passed). Such a plan is slow and says nothing about speed.
        """
        name = self.name
        space = self._space(problem, device, True, True) if emulate else self.space(problem, device)
        check_config(space, config, name)
        if emulate and local_memory_bytes(config, problem, emulate=True) > device.local_mem_size:
            raise ValueError(
                f"invalid {name} config {dict(config)}: the emulated mma needs more local memory"
            )
        layout = layout_options(problem)
        if self.variant.f16:
            layout.append("-DMMA_F16=1")
        if emulate:
            layout.append("-DMMA_STUB=1")
        elif config["MAXRREG"]:
            layout.append(f"-cl-nv-maxrregcount={config['MAXRREG']}")
        return mma_plan(self, problem, device, config, "gemm_mma.cl", layout, 32 * warps(config), ("VW", "MAXRREG"))


class MmaPlan(GemmPlan):
    """A :class:`GemmPlan` that carries its family's precision: ``"tf32"`` (verification uses the TF32
    tolerance) or ``"fp32"`` (gemm_mma_f16)."""

    def __init__(self, *, precision: str = PRECISION, **kwargs: Any):
        self.precision = precision
        super().__init__(**kwargs)


def mma_plan(algorithm: Any, problem: GemmProblem, device: Device, config: Config, source_file: str,
             layout: list[str], threads: int, dropped: tuple[str, ...]) -> MmaPlan:
    """The plan of a tensor-core family (``algorithm``: its name and precision): ``source_file`` built
    with ``layout`` and ``config`` less ``dropped``, one-dimensional work-groups of ``threads``, one per
    C tile, A and B loaded as VW-wide vectors where aligned, C (half) in pairs."""
    width = config["VW"]
    glob, local = row_grid(problem, config, threads)
    return MmaPlan(
        precision=algorithm.precision,
        algorithm=algorithm.name,
        problem=problem,
        device=device,
        config=config,
        source=read_source(__package__, source_file),
        options=variant_options(config, layout, width, width, dropped),
        widths=(width, width, 2),
        global_size=glob,
        local_size=local,
    )


class GemmMmaF16(GemmMmaTF32):
    """The ``gemm_mma_f16`` algorithm: float16 GEMMs (half A, B, C) with ``mma.sync ... m16n8k16 ...
    f16``, fp32 accumulation, one rounding to half; the tunables of ``gemm_mma_tf32`` (module
    docstring), KWG and VW counted in halves."""

    variant = F16_VARIANT
    name = F16_NAME
    version = F16_VERSION
    precision = F16_VARIANT.precision


ALGORITHMS = [GemmMmaTF32(), GemmMmaF16()]
