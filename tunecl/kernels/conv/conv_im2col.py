"""``conv_im2col``: convolution through an explicit column matrix in the plan's workspace and the GEMM
family's ``gemm_tiled`` plan (data movement in ``conv_im2col.cl``).

    fwd         im2col(x) → col (C·R·S × P·Q per image);   y[n, g] = w_g · col[n, g]
    bwd_data    col[n, g] = w_gᵀ · dy[n, g];                 dx = col2im(col)  (a gather: no atomics)
    bwd_weight  im2col(x);  partial[n]_g = dy[n, g] · col[n, g]ᵀ;  dw = Σ_n partial[n] (fixed order)

Images go through in chunks (the largest divisor of N whose workspace fits ``WORKSPACE_CAP``), so
every chunk runs the same GEMM; the GEMM's batch runs over the chunk's images (or over the groups when
there are more groups than images). bwd_weight's batch of per-image GEMMs gives the device parallel
work that one GEMM over the long N·P·Q reduction would not; ``split_reduce`` adds the partial
gradients in a fixed order, and later chunks accumulate with β = 1. The forward bias is a small extra
kernel (the GEMM does not fuse it).

Applies to every fp32 problem while ``gemm_tiled`` is registered and one image's columns fit the cap.
Parameters: IWG (work-items per work-group) and IPT (pixels per work-item) of the im2col / col2im
kernels, and ``gemm_tiled``'s own parameters prefixed ``g_`` (``g_MWG``, ``g_NWG``, ...), searched
in that GEMM's space for the sub-problem this convolution hands it. The layout and the plan are those
of :mod:`tunecl.kernels.conv.conv_columns` with C/G·R·S column rows per group.
"""

from __future__ import annotations

import functools

from tunecl.kernels.conv.conv_columns import ColumnsAlgorithm, Layout, columns_layout
from tunecl.kernels.conv.conv_common import supported
from tunecl.problems import ConvProblem
from tunecl.runtime import Device

WORKSPACE_CAP = 256 * 2**20   # bytes of column matrices a plan may hold


@functools.lru_cache(maxsize=256)
def layout(problem: ConvProblem) -> Layout | None:
    """The workspace layout and GEMM of ``problem``; None if one image's columns exceed the cap."""
    return columns_layout(problem, problem.r * problem.s, True, WORKSPACE_CAP)


class ConvIm2col(ColumnsAlgorithm):
    """Explicit im2col / col2im + ``gemm_tiled``; see the module docstring."""

    version = 1

    def layout(self, problem: ConvProblem) -> Layout | None:
        return layout(problem)

    def applies(self, problem: ConvProblem, device: Device) -> bool:
        return (problem.kind == "conv" and supported(problem) and self.gemm_applies(problem, device)
                and self.workspace_fits(problem, device))


ALGORITHMS = [ConvIm2col("conv_im2col", "conv_im2col.cl", ("im2col", "col2im"), "COL_LD")]
