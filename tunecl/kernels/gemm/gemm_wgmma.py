"""gemm_wgmma_tf32 and gemm_wgmma_f16: GEMM on Hopper's warpgroup tensor-core instruction.

Same problems, semantics and :class:`~tunecl.kernels.gemm.core.GemmPlan` as ``gemm_mma_tf32`` /
``gemm_mma_f16`` (module ``gemm_mma``), computed with ``wgmma.mma_async`` (PTX, sm_90a): a warpgroup
of 128 threads multiplies a 64 x NWG x 8 (TF32) or 64 x NWG x 16 (f16) tile whose operands it reads
straight from local memory through 64-bit matrix descriptors, while cp.async fills the next STAGES - 1
local buffers. ``gemm_wgmma.cl`` (its banner gives the local-memory layouts, the descriptor encoding and
the accumulator fragment) is one kernel; ``WGMMA_F16`` selects the variant.

Precision as gemm_mma: ``gemm_wgmma_tf32`` stores results as ``"tf32"`` (the tensor cores use the TF32
part of the fp32 bits that cp.async copied; the emulation truncates them, the worse case);
``gemm_wgmma_f16`` computes float16 problems with fp32 accumulation and is stored as ``"fp32"``.

It applies only where the runtime probe ``"wgmma"`` passed: one warpgroup computed wgmma products
exactly on known data through every layout the family builds (TF32 K-major and f16 K-/MN-major
operands, no swizzle and 32/64/128-byte swizzles), so a wrong descriptor encoding never gives a family
that applies. Tunables, with the values searched:

==========  ================  ======================================================================
MWG         64 128 256        tile rows per work-group (a multiple of 64 x WARPGROUPS)
NWG         32 64 128 256     tile columns = the wgmma N
KWG         8 .. 64           depth of one K step in elements (f16: 16 .. 128)
WARPGROUPS  1 2               warpgroups per work-group (along M)
STAGES      2 3 4             local-memory buffers (cp.async pipeline depth)
SWIZZLE     0 32 64 128       local layout: no swizzle (core-matrix interleave) or the B-byte swizzle
VW          1 2 4 (8)         elements per cp.async along an operand's contiguous dimension
GM          1 8               work-group order: bands of GM tile rows (L2 locality)
INFLIGHT    0 1               wgmma groups left running across a K step: 1 = the barrier and the next
                              step's issue overlap the previous step's wgmma (copies run one step less
                              ahead; needs STAGES >= 3)
PRETRANS    0 1               TF32 only, for a problem with an MN-contiguous operand: 1 = transpose it
                              first (``transpose.cl``, into a packed workspace), then run the K-major kernel
==========  ================  ======================================================================

Layouts: K-contiguous operands (A in NN/NT, B in NT/TT) are copied as vectors into K-major tiles. An
MN-contiguous operand goes into an MN-major tile with wgmma's transpose flag (f16), or, for TF32
(whose wgmma has no transpose), either element by element (4-byte cp.async, scattered local stores)
into a K-major tile (PRETRANS = 0), or through a transposed copy of the operand made before the GEMM
(PRETRANS = 1: one more kernel and batch x rows x cols floats of workspace, then the vector copies of
the K-contiguous layout). All four transposes apply.

Tests on devices without Hopper tensor cores build with ``emulate=True`` (``WGMMA_STUB``): cp.async
becomes a plain copy and the wgmma a plain-C product that decodes the kernel's own descriptors by the
PTX ISA's canonical layouts, so layout, descriptor encoding, swizzle and fragment mapping are checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tunecl.kernels.base import Config, Space
from tunecl.kernels.gemm.core import (Rule, check_config, check_dtype, compute_units, enumerate_space,
                                      layout_options, make_space, max_alloc_bytes, widest)
from tunecl.kernels.sizes import next_pow2
from tunecl.kernels.gemm.gemm_mma import MmaPlan, TensorCoreGemm, mma_plan
from tunecl.kernels.gemm.gemm_pretrans import PretransposedPlan, with_layout, workspace_fits
from tunecl.precision import FP32, TF32
from tunecl.problems import GemmProblem
from tunecl.runtime import ARCH_PTX_OPTION, WGMMA, Device

NAME = "gemm_wgmma_tf32"
F16_NAME = "gemm_wgmma_f16"
VERSION = 1
WARPGROUP = 128  # threads


@dataclasses.dataclass(frozen=True)
class WgmmaVariant:
    """What tells the two families apart (``WGMMA_F16`` in ``gemm_wgmma.cl``)."""

    name: str
    precision: str
    dtype: str          # GemmProblem.dtype it computes
    f16: bool
    element_bytes: int
    mma_k: int          # depth of one wgmma
    kwg: tuple[int, ...]
    widths: tuple[int, ...]
    # default shapes, best first: (MWG, NWG, KWG, WARPGROUPS, STAGES, SWIZZLE)
    presets: tuple[tuple[int, int, int, int, int, int], ...]


# Defaults. 128 x 128 tiles with two warpgroups (64 x 128 each: 64 accumulators per thread) and three
# stages fill the 48 KiB of local memory an H200 work-group gets (TF32 16 deep: 64-byte rows, so the
# 64-byte swizzle; f16 32 deep: the same bytes). Smaller tiles when the big one leaves SMs idle.
TF32_VARIANT = WgmmaVariant(
    name=NAME, precision=TF32, dtype="float32", f16=False, element_bytes=4, mma_k=8,
    kwg=(8, 16, 32, 64), widths=(1, 2, 4),
    presets=((128, 128, 16, 2, 3, 64), (64, 128, 16, 1, 4, 64), (64, 64, 32, 1, 2, 128),
             (64, 32, 16, 1, 2, 64)),
)
F16_VARIANT = WgmmaVariant(
    name=F16_NAME, precision=FP32, dtype="float16", f16=True, element_bytes=2, mma_k=16,
    kwg=(16, 32, 64, 128), widths=(1, 2, 4, 8),
    presets=((128, 128, 32, 2, 3, 64), (64, 128, 32, 1, 4, 64), (64, 64, 64, 1, 2, 128),
             (64, 32, 32, 1, 2, 64)),
)


def variant_of(problem: GemmProblem) -> WgmmaVariant:
    return F16_VARIANT if problem.dtype == F16_VARIANT.dtype else TF32_VARIANT


def _params(variant: WgmmaVariant) -> dict[str, tuple[int, ...]]:
    params = {
        "MWG": (64, 128, 256),
        "NWG": (32, 64, 128, 256),
        "KWG": variant.kwg,
        "WARPGROUPS": (1, 2),
        "STAGES": (2, 3, 4),
        "SWIZZLE": (0, 32, 64, 128),
        "VW": variant.widths,
        "GM": (1, 8),
        "INFLIGHT": (0, 1),
    }
    if not variant.f16:
        params["PRETRANS"] = (0, 1)
    return params


# Stored configs from before PRETRANS (TF32) and INFLIGHT existed built what 0 builds now.
IMPLIED = {"PRETRANS": 0, "INFLIGHT": 0}
IMPLIED_F16 = {"INFLIGHT": 0}


def has_mn_operand(problem: GemmProblem) -> bool:
    """Whether a TF32 problem has an operand that is MN-contiguous in memory (A with TRANS_A, B
    without TRANS_B), which the K-major-only TF32 wgmma cannot take as it is."""
    return not variant_of(problem).f16 and (problem.trans_a or not problem.trans_b)


def kernel_problem(problem: GemmProblem, config: Mapping[str, int]) -> GemmProblem:
    """The layout the kernel itself computes: with PRETRANS, both operands K-contiguous (A as M x K, B
    as N x K), the MN-contiguous ones having been transposed into the workspace."""
    if config.get("PRETRANS"):
        return with_layout(problem, trans_a=False, trans_b=True)
    return problem


def pretrans_fits(problem: GemmProblem, device: Any) -> bool:
    """Whether each transposed copy PRETRANS = 1 needs fits one of the device's buffers (the cap)."""
    return workspace_fits(problem, with_layout(problem, trans_a=False, trans_b=True), max_alloc_bytes(device))


def accumulators(config: Mapping[str, int]) -> int:
    """fp32 accumulators per thread: NWG / 2 per 64-row wgmma tile of its warpgroup."""
    return config["MWG"] // config["WARPGROUPS"] // 64 * config["NWG"] // 2


def mn_major(problem: GemmProblem) -> tuple[bool, bool]:
    """Whether A and B are stored MN-major in local memory (f16 operands that are MN-contiguous)."""
    f16 = variant_of(problem).f16
    return (f16 and problem.trans_a, f16 and not problem.trans_b)


def local_memory_bytes(config: Mapping[str, int], problem: GemmProblem) -> int:
    """Bytes of local memory ``gemm_wgmma.cl`` declares (SMEM_BYTES there)."""
    c = config
    return c["STAGES"] * (c["MWG"] + c["NWG"]) * c["KWG"] * variant_of(problem).element_bytes


def _constraints(problem: GemmProblem, device: Any) -> list[Rule]:
    variant = variant_of(problem)
    size = variant.element_bytes
    a_mn, b_mn = mn_major(problem)

    def threads(c: Mapping[str, int]) -> int:
        return WARPGROUP * c["WARPGROUPS"]

    def swizzle_fits(c: Mapping[str, int]) -> bool:
        # K-major tiles: rows of KWG elements hold whole swizzle patterns (or, unswizzled, whole
        # 32-byte wgmma steps); MN-major tiles: rows of MWG / NWG elements do.
        width = c["SWIZZLE"] or 16
        k_major_ok = (c["KWG"] * size) % max(width, 32) == 0
        a_ok = (c["MWG"] * size) % width == 0 if a_mn else k_major_ok
        b_ok = (c["NWG"] * size) % width == 0 if b_mn else k_major_ok
        return a_ok and b_ok

    def loads_split_evenly(rows: int, c: Mapping[str, int]) -> bool:
        return (rows * c["KWG"]) % (c["VW"] * threads(c)) == 0

    return [
        ("warpgroup_rows_multiple_of_64", ("MWG", "WARPGROUPS"), lambda c: c["MWG"] % (64 * c["WARPGROUPS"]) == 0),
        ("at_most_128_accumulators", ("MWG", "NWG", "WARPGROUPS"), lambda c: accumulators(c) <= 128),
        ("work_group_size_within_device", ("WARPGROUPS",), lambda c: threads(c) <= device.max_work_group_size),
        ("swizzle_fits_the_tiles", ("MWG", "NWG", "KWG", "SWIZZLE"), swizzle_fits),
        ("A_tile_loads_split_evenly", ("MWG", "KWG", "WARPGROUPS", "VW"), lambda c: loads_split_evenly(c["MWG"], c)),
        ("B_tile_loads_split_evenly", ("NWG", "KWG", "WARPGROUPS", "VW"), lambda c: loads_split_evenly(c["NWG"], c)),
        ("INFLIGHT_needs_three_stages", ("INFLIGHT", "STAGES"), lambda c: not c["INFLIGHT"] or c["STAGES"] >= 3),
        (
            "local_memory_within_device",
            ("MWG", "NWG", "KWG", "STAGES"),
            lambda c: local_memory_bytes(c, problem) <= device.local_mem_size,
        ),
    ] + ([] if variant.f16 else [
        ("PRETRANS_only_with_an_MN_contiguous_operand", ("PRETRANS",),
         lambda c: not c["PRETRANS"] or has_mn_operand(problem)),
        ("PRETRANS_workspace_within_cap", ("PRETRANS",),
         lambda c: not c["PRETRANS"] or pretrans_fits(problem, device)),
    ])


def _pruning(problem: GemmProblem, device: Any) -> list[Rule]:
    """Valid configs that cannot pay off, dropped from the search (they still build and compute)."""
    variant = variant_of(problem)
    m_cap, n_cap = max(64, next_pow2(problem.m)), max(32, next_pow2(problem.n))
    k_cap = max(variant.kwg[0], next_pow2(problem.k))
    widths = sorted(variant.widths, reverse=True)
    wide = max(
        widest(problem.m if problem.trans_a else problem.k, widths),
        widest(problem.k if problem.trans_b else problem.n, widths),
    )
    wide_pretransposed = widest(problem.k, widths)  # both operands K-contiguous, packed
    units = compute_units(device)

    def groups(c: Mapping[str, int]) -> int:
        return -(-problem.m // c["MWG"]) * -(-problem.n // c["NWG"]) * problem.batch

    def widest_loads(c: Mapping[str, int]) -> int:
        threads = WARPGROUP * c["WARPGROUPS"]
        cap = wide_pretransposed if c.get("PRETRANS") else wide
        return next(
            (
                w
                for w in widths
                if w <= cap and (c["MWG"] * c["KWG"]) % (w * threads) == 0 and (c["NWG"] * c["KWG"]) % (w * threads) == 0
            ),
            1,
        )

    return [
        ("tile_within_problem", ("MWG", "NWG", "KWG"), lambda c: c["MWG"] <= m_cap and c["NWG"] <= n_cap and c["KWG"] <= k_cap),
        ("VW_widest_for_tile_and_packed_layout", ("MWG", "NWG", "KWG", "WARPGROUPS", "VW")
         + (() if variant.f16 else ("PRETRANS",)), lambda c: c["VW"] == widest_loads(c)),
        (
            "GM_only_with_several_bands",
            ("MWG", "NWG", "GM"),
            lambda c: c["GM"] == 1 or (-(-problem.m // c["MWG"]) > c["GM"] and problem.n > c["NWG"]),
        ),
        # a tile as small as 64 x 32 only where a bigger one leaves compute units idle
        ("tile_not_tiny_for_big_problems", ("MWG", "NWG"), lambda c: c["MWG"] * c["NWG"] >= 64 * 64 or groups(c) <= 4 * units),
    ]


class GemmWgmmaTF32(TensorCoreGemm):
    """The ``gemm_wgmma_tf32`` algorithm (module docstring)."""

    variant = TF32_VARIANT
    name = NAME
    version = VERSION
    precision = TF32
    capability = WGMMA

    def space(self, problem: GemmProblem, device: Device) -> Space:
        check_dtype(self.name, problem, self.variant.dtype)
        return make_space(_params(self.variant), _constraints(problem, device), _pruning(problem, device),
                          implied=IMPLIED_F16 if self.variant.f16 else IMPLIED)

    def default(self, problem: GemmProblem, device: Device) -> Config:
        """The largest preset that gives every compute unit a work-group, with the widest copies and
        GM 8 where it is allowed; always valid and (where pruning allows) searched."""
        space = self.space(problem, device)
        rules = _constraints(problem, device) + _pruning(problem, device)
        units = compute_units(device)
        presets = self.variant.presets
        for index, (mwg, nwg, kwg, warpgroups, stages, swizzle) in enumerate(presets):
            groups = -(-problem.m // mwg) * -(-problem.n // nwg) * problem.batch
            if index + 1 < len(presets) and groups < units:
                continue
            base = {"MWG": mwg, "NWG": nwg, "KWG": kwg, "WARPGROUPS": warpgroups, "STAGES": stages,
                    "SWIZZLE": swizzle, "INFLIGHT": 0}
            if not self.variant.f16:  # an MN-contiguous TF32 operand: transposed first (see PRETRANS)
                base["PRETRANS"] = int(has_mn_operand(problem) and pretrans_fits(problem, device))
            for gm in (8, 1):
                for width in sorted(self.variant.widths, reverse=True):
                    config = {**base, "VW": width, "GM": gm}
                    if space.is_valid(config) and all(check(config) for _, _, check in rules):
                        return config
        searched = space.configs()
        if searched:
            return searched[0]
        return next(iter(enumerate_space(_params(self.variant), _constraints(problem, device))))

    def build(
        self, problem: GemmProblem, device: Device, config: Config, *, emulate: bool = False
    ) -> MmaPlan | PretransposedPlan:
        """Compile ``config`` for ``problem``; ValueError (before compiling) if the config is invalid.

        Args:
            emulate: compile the plain-C stand-in of the PTX (``WGMMA_STUB``), for tests on devices
                without Hopper tensor cores. Slow; says nothing about speed.
        """
        space = self.space(problem, device)
        check_config(space, config, self.name)
        config = space.complete(config)
        if config.get("PRETRANS"):  # the K-major kernel, behind the transposes of the MN-contiguous operands
            inner = self.build(kernel_problem(problem, config), device, {**config, "PRETRANS": 0}, emulate=emulate)
            return PretransposedPlan(problem, inner, config, device)
        layout = layout_options(problem)
        if self.variant.f16:
            layout.append("-DWGMMA_F16=1")
        # the real kernel's wgmma exists only on sm_90a: built by way of retargeted PTX (runtime/build.py)
        layout.append("-DWGMMA_STUB=1" if emulate else ARCH_PTX_OPTION)
        return mma_plan(self, problem, device, config, "gemm_wgmma.cl", layout, WARPGROUP * config["WARPGROUPS"],
                        ("VW", "PRETRANS"))


class GemmWgmmaF16(GemmWgmmaTF32):
    """The ``gemm_wgmma_f16`` algorithm: float16 GEMMs (half A, B, C), fp32 accumulation."""

    variant = F16_VARIANT
    name = F16_NAME
    precision = F16_VARIANT.precision


ALGORITHMS = [GemmWgmmaTF32(), GemmWgmmaF16()]
