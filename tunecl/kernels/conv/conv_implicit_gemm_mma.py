"""``conv_implicit_gemm_mma_tf32`` and ``conv_implicit_gemm_mma_f16``: the implicit-GEMM convolution on
NVIDIA tensor cores through inline PTX (``conv_implicit_gemm_mma.cl``), fp32 accumulation: fp32 tensors
with TF32 inputs, or (``_f16``) float16 tensors with ``mma.sync ... m16n8k16 ... f16``.

The same per-group GEMM, im2col gathers, directions (fwd with bias and beta, bwd_data, bwd_weight),
SPLIT with its fixed-order reduction and plan (``run`` contract) as ``conv_implicit_gemm``; the
multiply is ``gemm_mma_tf32``'s warp-level ``mma.sync.m16n8k8`` core. Its ``precision`` is ``"tf32"``:
the tuner verifies it with the TF32 tolerance, the backend serves it only to requests that accept
TF32 (``torch.backends.cudnn.allow_tf32``, PyTorch's default) and only from stored or freshly tuned
results — it is registered after every fp32 family, so it is never the untuned default. It applies
to every fp32 problem any stride, padding, dilation and groups, on devices whose runtime probe granted
``"mma_tf32"`` (never by vendor name).

=======  ================  ========================================================================
MWG/NWG  16 .. 256         C tile per work-group along GM / GN
KWG      8 16 32           depth of one reduction step (the local-memory tiles)
WARPS_M  1 2 4             warps along GM (WARPS_N: along GN); a warp computes (MWG/WARPS_M) x
                           (NWG/WARPS_N) as a grid of 16 x 8 mma tiles
KPAIR    0 1               1: a lane holds k = 2t, 2t+1 (64-bit local reads of GK-contiguous tiles)
PAD      0 1               pad local rows so that fragment reads are free of bank conflicts
STAGES   1 2               local-memory buffers per tile; 2 = gather the next step into registers
                           while this one is multiplied
SPLIT    1 .. 64           work-groups sharing one reduction (partial sums in the workspace)
=======  ================  ========================================================================

``conv_implicit_gemm_mma_f16`` is the same kernel with ``MMA_F16`` (as ``gemm_mma_f16`` is of
``gemm_mma.cl``) for ``ConvProblem(dtype="float16")``: x, w, dy and the output are half, the bias (fwd)
stays fp32; the half inputs go to the mma unconverted, the sums are fp32 and the result (+ bias, + beta *
out) is rounded once to half, to nearest even (a SPLIT's fp32 partial sums are rounded once by
``split_reduce``). Its tunables are the TF32 family's with KWG counted in halves (16 32 64: one to four
m16n8k16 steps), its presets the same tiles twice as deep. It applies only to float16 problems on
devices whose probe granted ``"mma_f16"``, and its ``precision`` is ``"fp32"`` (exact inputs, fp32
sums: what the backend's converted route computes, so any request may be served by it); the harness
adds the one rounding of the output to half to the fp32 tolerance. No other family computes float16
problems, so its default is the untuned plan of a float16 convolution where it applies.

Not (yet) searched, unlike ``gemm_mma_tf32``: cp.async copies (the gathers need a bounds check and
index arithmetic per element, so they go through registers), vector global loads, GM raster order and
a register cap.

Tests on devices without tensor cores build with ``emulate=True``: plain OpenCL C then computes the
same fragments as the PTX (``MMA_STUB``), which checks every index of the kernel except the PTX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from tunecl.kernels.base import Config, Constraint, Space
from tunecl.kernels.conv.conv_common import (FLOAT_BYTES, ConvAlgorithm, fit_default, local_mem_limit,
                                             max_group_size, out_elements, staged_space, supported)
from tunecl.kernels.sizes import ceil_div, next_pow2
from tunecl.kernels.conv.conv_implicit_gemm import WORKSPACE_CAP, ImplicitGemmPlan, gemm_shape, k_chunk
from tunecl.kernels.gemm.core import compute_units
from tunecl.kernels.gemm.gemm_mma import MMA_STUB_WORDS, MmaFamily, accumulators, capabilities, padding, warps
from tunecl.precision import FP32, TF32
from tunecl.problems import ConvProblem
from tunecl.runtime import MMA_F16, MMA_TF32, Device

NAME = "conv_implicit_gemm_mma_tf32"
VERSION = 1
PRECISION = TF32

F16_NAME = "conv_implicit_gemm_mma_f16"
F16_VERSION = 1

PARAMS: dict[str, tuple[int, ...]] = {
    "MWG": (16, 32, 64, 128, 256),
    "NWG": (16, 32, 64, 128, 256),
    "KWG": (8, 16, 32),
    "WARPS_M": (1, 2, 4),
    "WARPS_N": (1, 2, 4),
    "KPAIR": (0, 1),
    "PAD": (0, 1),
    "STAGES": (1, 2),
    "SPLIT": (1, 2, 4, 8, 16, 32, 64),
}

# Default tile shapes, best first (as gemm_mma_tf32's): (MWG, NWG, KWG, WARPS_M, WARPS_N).
PRESETS = [
    (128, 128, 16, 2, 4),
    (64, 128, 16, 2, 2),
    (64, 64, 16, 2, 2),
    (32, 32, 16, 1, 1),
    (16, 16, 8, 1, 1),
]


@dataclasses.dataclass(frozen=True)
class MmaConvVariant(MmaFamily):
    """A convolution family on ``mma.sync`` (``conv_implicit_gemm_mma.cl``; the bias and the workspace
    stay fp32 whatever ``element_bytes``)."""

    @property
    def params(self) -> dict[str, tuple[int, ...]]:
        return {**PARAMS, "KWG": self.kwg}


# f16: the same tiles, twice as deep in halves (the same bytes per local tile as TF32's).
TF32_VARIANT = MmaConvVariant(NAME, VERSION, PRECISION, MMA_TF32, "float32", False, 4, PARAMS["KWG"],
                              tuple(PRESETS))
F16_VARIANT = MmaConvVariant(F16_NAME, F16_VERSION, FP32, MMA_F16, "float16", True, 2, (16, 32, 64),
                             tuple((m, n, 2 * k, wm, wn) for m, n, k, wm, wn in PRESETS))


def variant_of(problem: ConvProblem) -> MmaConvVariant:
    """The family that computes ``problem``'s dtype (float16: the f16 one, else the TF32 one)."""
    return F16_VARIANT if problem.dtype == F16_VARIANT.dtype else TF32_VARIANT


def local_memory_bytes(c: Mapping[str, int], direction: str, emulate: bool = False, f16: bool = False) -> int:
    """Bytes of local memory the kernel declares (mirrors A_TILE / B_TILE in the .cl; f16: tiles of
    halves)."""
    a_elements = c["MWG"] * (c["KWG"] + padding(c, True, f16))
    if direction == "bwd_weight":   # B kept GK-contiguous: NWG rows of KWG
        b_elements = c["NWG"] * (c["KWG"] + padding(c, True, f16))
    else:                           # B kept GN-contiguous: KWG rows of NWG
        b_elements = c["KWG"] * (c["NWG"] + padding(c, False, f16))
    stub = warps(c) * MMA_STUB_WORDS * FLOAT_BYTES if emulate else 0
    return (2 if f16 else FLOAT_BYTES) * c["STAGES"] * (a_elements + b_elements) + stub


def tiles(problem: ConvProblem, c: Mapping[str, int]) -> int:
    """Output tiles (work-groups without SPLIT) of a config."""
    gm, gn, _ = gemm_shape(problem)
    return ceil_div(gm, c["MWG"]) * ceil_div(gn, c["NWG"]) * problem.groups


def constraints(problem: ConvProblem, device: Any, emulate: bool = False) -> list[Constraint]:
    """What a config must satisfy to build and compute correctly (device limits included; the family
    is the one of ``problem``'s dtype)."""
    limit_wg, limit_lm = max_group_size(device), local_mem_limit(device)
    _, _, gk = gemm_shape(problem)
    out_bytes = out_elements(problem) * FLOAT_BYTES   # the split's partial sums are fp32
    f16 = variant_of(problem).f16

    def loads_split_evenly(tile: int, c: Mapping[str, int]) -> bool:  # tile x KWG over the threads
        return (tile * c["KWG"]) % (32 * warps(c)) == 0

    return [
        Constraint("warp_tile_rows_multiple_of_16", lambda c: c["MWG"] % (16 * c["WARPS_M"]) == 0),
        Constraint("warp_tile_cols_multiple_of_8", lambda c: c["NWG"] % (8 * c["WARPS_N"]) == 0),
        Constraint("work_group_size_within_device", lambda c: 32 * warps(c) <= limit_wg),
        Constraint("at_most_128_accumulators", lambda c: accumulators(c) <= 128),
        Constraint("A_tile_loads_split_evenly", lambda c: loads_split_evenly(c["MWG"], c)),
        Constraint("B_tile_loads_split_evenly", lambda c: loads_split_evenly(c["NWG"], c)),
        Constraint("local_memory_within_device",
                   lambda c: local_memory_bytes(c, problem.direction, emulate, f16) <= limit_lm),
        Constraint("split_has_work",
                   lambda c: c["SPLIT"] == 1 or (c["SPLIT"] - 1) * k_chunk(gk, c["SPLIT"], c["KWG"]) < gk),
        Constraint("workspace", lambda c: c["SPLIT"] == 1 or c["SPLIT"] * out_bytes <= WORKSPACE_CAP),
    ]


def pruning(problem: ConvProblem, device: Any) -> list[Constraint]:
    """Rules that drop configs which cannot pay off, so the space stays at a few hundred to a few
    thousand configs per problem (they would build and compute correctly)."""
    gm, gn, gk = gemm_shape(problem)
    m_cap, n_cap = max(16, next_pow2(gm)), max(16, next_pow2(gn))
    k_cap = max(variant_of(problem).mma_k, next_pow2(gk))
    units = compute_units(device)
    spans = lambda c: c["MWG"] >= m_cap or c["NWG"] >= n_cap  # a tile spanning GM or GN cannot grow
    return [
        Constraint("m_tile_within_problem", lambda c: c["MWG"] <= m_cap),
        Constraint("n_tile_within_problem", lambda c: c["NWG"] <= n_cap),
        Constraint("k_step_within_problem", lambda c: c["KWG"] <= k_cap),
        Constraint("tile_aspect_at_most_2",
                   lambda c: max(c["MWG"], c["NWG"]) <= 2 * min(c["MWG"], c["NWG"]) or spans(c)),
        Constraint("at_most_8_warps", lambda c: warps(c) <= 8),
        # warp tiles square-ish (rows / columns between 1/2 and 2), and not tiny unless the device
        # would otherwise idle
        Constraint("warp_tile_balanced",
                   lambda c: 2 * (c["NWG"] // c["WARPS_N"]) >= c["MWG"] // c["WARPS_M"]
                   and 2 * (c["MWG"] // c["WARPS_M"]) >= c["NWG"] // c["WARPS_N"]
                   and (accumulators(c) >= 16 or tiles(problem, c) <= 4 * units or spans(c))),
        Constraint("tile_not_tiny_for_big_problems",
                   lambda c: c["MWG"] * c["NWG"] >= 64 * 64 or tiles(problem, c) <= 32 * units or spans(c)),
        # split only while the work-groups of half the split did not fill every compute unit
        Constraint("split_only_to_fill_the_device",
                   lambda c: c["SPLIT"] == 1 or tiles(problem, c) * (c["SPLIT"] // 2) < units),
    ]


class ConvImplicitGemmMmaTF32(ConvAlgorithm):
    """The ``conv_implicit_gemm_mma_tf32`` algorithm (see the module docstring for its tunables)."""

    variant = TF32_VARIANT
    name = NAME
    version = VERSION
    precision = PRECISION
    source_file = "conv_implicit_gemm_mma.cl"

    def applies(self, problem: ConvProblem, device: Device) -> bool:
        """Convolutions of the variant's dtype (any geometry: fp32 for TF32, float16 for f16) on devices
        whose probe granted the variant's instruction (``mma_tf32``, ``mma_f16``)."""
        return self._computes(problem) and self.variant.capability in capabilities(device)

    def _computes(self, problem: ConvProblem) -> bool:
        """A convolution of this family's dtype whose indices fit (whatever the device)."""
        return problem.kind == "conv" and supported(problem, self.variant.dtype)

    def space(self, problem: ConvProblem, device: Device) -> Space:
        return self._space(problem, device)

    def _space(self, problem: ConvProblem, device: Device, emulate: bool = False) -> Space:
        return staged_space(self.variant.params,
                            constraints(problem, device, emulate) + pruning(problem, device))

    def default(self, problem: ConvProblem, device: Device) -> Config:
        """The largest preset tile that still gives every compute unit a work-group (clipped to the
        problem; a split counts where the reduction is long enough), double buffered, KPAIR and padding
        on; SPLIT doubled while the work-groups cannot fill every compute unit."""
        space = self.space(problem, device)
        gm, gn, gk = gemm_shape(problem)
        units = compute_units(device)
        preferred: Config = {}

        def fills(c: Config) -> bool:  # enough tiles, or a reduction long enough to split until there are
            needed = next_pow2(ceil_div(units, tiles(problem, c)))
            return needed <= 1 or (needed <= PARAMS["SPLIT"][-1] and gk >= needed * 8 * c["KWG"])

        presets, mma_k = self.variant.presets, self.variant.mma_k
        for index, (mwg, nwg, kwg, warps_m, warps_n) in enumerate(presets):
            mwg, nwg = min(mwg, max(16, next_pow2(gm))), min(nwg, max(16, next_pow2(gn)))
            warps_m, warps_n = min(warps_m, mwg // 16), min(warps_n, nwg // 8)
            preferred = {"MWG": mwg, "NWG": nwg, "KWG": min(kwg, max(mma_k, next_pow2(gk))),
                         "WARPS_M": warps_m, "WARPS_N": warps_n, "KPAIR": 1, "PAD": 1, "STAGES": 2,
                         "SPLIT": 1}
            if index + 1 == len(presets) or fills(preferred):
                break
        split = 1
        while (tiles(problem, preferred) * split < units and split < PARAMS["SPLIT"][-1]
               and gk >= 2 * split * 8 * preferred["KWG"]):
            split *= 2
        preferred["SPLIT"] = split
        if space.is_valid(preferred):
            return preferred
        if space.configs():
            return fit_default(space, preferred)
        # pruning emptied the searched space: any config that satisfies the constraints still works
        return fit_default(staged_space(self.variant.params, constraints(problem, device)), preferred)

    def check_config(self, problem: ConvProblem, device: Device, config: Config, emulate: bool) -> None:
        """ValueError naming what is wrong (before compiling). Pruned configs are accepted: they
        compute correctly, they are only not searched."""
        if not self._computes(problem):
            raise ValueError(f"{self.name} does not apply to {problem.key}")
        if not emulate and not self.applies(problem, device):
            raise ValueError(f"{self.name} needs the {self.variant.capability} capability, which the device "
                             f"lacks")
        rules = Space(self.variant.params, constraints(problem, device, emulate))
        broken = rules.violations(config)
        if broken:
            raise ValueError(f"invalid {self.name} config {dict(config)}: {', '.join(broken)}")

    def check(self, problem: ConvProblem, device: Device, config: Config) -> None:
        self.check_config(problem, device, config, emulate=False)

    def build(self, problem: ConvProblem, device: Device, config: Config, *,
              emulate: bool = False) -> MmaConvPlan:
        """Compile ``config`` for ``problem``; ValueError (before compiling) if it cannot run.

        Args:
            emulate: compile the plain-C stand-in of the PTX (``MMA_STUB``), for tests on devices
                without tensor cores; such a plan is slow and says nothing about speed.
        """
        self.check_config(problem, device, config, emulate)
        extra = (["-DMMA_F16=1"] if self.variant.f16 else []) + (["-DMMA_STUB=1"] if emulate else [])
        program = self.program(device, problem, config, extra)
        i32, f32 = np.int32, np.float32
        kernel = device.kernel(program, self.name, [None, i32, None, i32, None, i32, None, None, i32, i32, f32])
        plan_class = F16ConvPlan if self.variant.f16 else MmaConvPlan
        return plan_class.launching(self.name, problem, device, config, kernel, 32 * warps(config))


@dataclasses.dataclass
class MmaConvPlan(ImplicitGemmPlan):
    """An :class:`ImplicitGemmPlan` whose results are TF32-accurate (verified with the TF32 tolerance)."""

    precision = PRECISION


@dataclasses.dataclass
class F16ConvPlan(ImplicitGemmPlan):
    """A ``conv_implicit_gemm_mma_f16`` plan: half tensors, fp32 bias; results at precision ``"fp32"``
    (verified with the fp32 tolerance plus one rounding to half)."""

    precision = FP32


class ConvImplicitGemmMmaF16(ConvImplicitGemmMmaTF32):
    """The ``conv_implicit_gemm_mma_f16`` algorithm: float16 convolutions with ``mma.sync ... m16n8k16
    ... f16``, fp32 accumulation, one rounding to half; the TF32 family's tunables with KWG in halves."""

    variant = F16_VARIANT
    name = F16_NAME
    version = F16_VERSION
    precision = F16_VARIANT.precision


ALGORITHMS = [ConvImplicitGemmMmaTF32(), ConvImplicitGemmMmaF16()]
