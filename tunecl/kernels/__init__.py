"""Kernel families: parameterized OpenCL sources with their spaces, defaults and plans.

:func:`algorithms` returns every registered :class:`~tunecl.kernels.base.Algorithm` for a problem
kind; families register themselves in ``_REGISTRY`` below.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Collection
from types import ModuleType

from tunecl import precision
from tunecl.kernels.base import Algorithm

# problem kind -> modules whose ALGORITHMS lists are the families of that kind. The order matters:
# the first algorithm that applies to a problem gives the untuned default (what the backend runs on a
# DB miss and the baseline the tuner must beat), so specialised families come before general ones:
# depthwise, 1x1 as a plain GEMM, Winograd F(2x2,3x3) for 3x3 stride 1, then implicit GEMM. On the
# H200 the old order (conv_direct first) made the untuned resnet50 forward 4.4x slower than tuned.
# The TF32 families (tensor cores: gemm_mma_tf32; conv_1x1_mma_tf32 and conv_im2col_mma_tf32, the GEMM-backed
# families on gemm_mma_tf32; conv_implicit_gemm_mma_tf32) come last: they apply only where the device's
# probe granted "mma_tf32", and a strict fp32 default must never be TF32.
# conv_implicit_gemm_mma_f16 follows its TF32 sibling (same module): it computes float16 convolutions
# only ("mma_f16"), which no other family does, so it is their default wherever it applies.
# gemm_wgmma (Hopper's warpgroup MMA, where the probe granted "wgmma") comes before gemm_mma, so it gives
# the untuned float16 default where it applies: on the H200 its default ran 4096^3 at 364 TFLOP/s against
# gemm_mma_f16's 58 and 1024^3 at 107 against 36. (TF32 defaults are unaffected: fp32 families come first.)
# conv_gemm_wgmma (the same GEMM-backed families on gemm_wgmma_tf32, "wgmma") are TF32 too, never a default.
# gemm_simt (CUTLASS-style warp tiling, fp32) comes after gemm_tiled and gemm_direct so that untuned fp32
# defaults do not change; the tuner picks it where it is faster.
_REGISTRY: dict[str, tuple[str, ...]] = {
    "gemm": ("tunecl.kernels.gemm.gemm_tiled", "tunecl.kernels.gemm.gemm_direct", "tunecl.kernels.gemm.gemm_simt",
             "tunecl.kernels.gemm.gemm_wgmma", "tunecl.kernels.gemm.gemm_mma"),
    "conv": ("tunecl.kernels.conv.conv_depthwise", "tunecl.kernels.conv.conv_1x1",
             "tunecl.kernels.conv.conv_winograd", "tunecl.kernels.conv.conv_implicit_gemm",
             "tunecl.kernels.conv.conv_im2col", "tunecl.kernels.conv.conv_direct",
             "tunecl.kernels.conv.conv_gemm_mma", "tunecl.kernels.conv.conv_gemm_wgmma",
             "tunecl.kernels.conv.conv_implicit_gemm_mma"),
    "attention": ("tunecl.kernels.attention",),
}


@functools.cache
def _family_modules(kind: str) -> tuple[ModuleType, ...]:
    return tuple(importlib.import_module(name) for name in _REGISTRY.get(kind, ()))


def algorithms(kind: str) -> list[Algorithm]:
    """All algorithms that compute problems of ``kind`` (``"gemm"``, ``"conv"`` or ``"attention"``). The
    families are imported on first use (they import the registry); each call reads their ``ALGORITHMS``."""
    found: list[Algorithm] = []
    for module in _family_modules(kind):
        found.extend(module.ALGORITHMS)
    return found


def algorithms_at(kind: str, accepted: Collection[str]) -> list[Algorithm]:
    """The algorithms of ``kind`` that compute at one of the ``accepted`` precisions, in registry order:
    those a request accepting them may be served with. The backend's plans ask the tuning DB for these
    (each at its current version), and so does ``tunecl db coverage``."""
    return [a for a in algorithms(kind) if precision.algorithm_precision(a) in accepted]


def algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; KeyError lists the known names."""
    known = {a.name: a for kind in _REGISTRY for a in algorithms(kind)}
    try:
        return known[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(sorted(known))}") from None
