"""``conv_1x1``: 1×1 convolutions (padding 0, any stride, dilation and groups) as GEMMs of the GEMM
family's ``gemm_tiled``, with the strided data movement in ``conv_1x1.cl``.

Per image n and group g, with X = x[n, g] as a C/G × H·W matrix and Y = y[n, g] as K/G × P·Q:

    fwd         Y = W_g · X                 stride 1: straight from x into y, no copy
    bwd_data    dX = W_gᵀ · dY              stride 1: straight into dx (β folded into the GEMM)
    bwd_weight  dW_g = Σ_n dY · Xᵀ          one batched GEMM per chunk of images writes a partial dW
                                            per image; ``split_reduce`` adds them in a fixed order

With stride > 1 the input pixels on the stride grid are first gathered into the workspace (fwd,
bwd_weight), and bwd_data scatters its GEMM result onto the grid of dx, with zeros between. Images
go in chunks whose workspace fits ``WORKSPACE_CAP``; the GEMM's batch runs over the chunk's images, or
over the groups when there are more groups than images. The forward bias is a small extra kernel. The
layout and the plan are those of :mod:`tunecl.kernels.conv.conv_columns` with one column row per channel.

Parameters: IWG, IPT (gather / scatter work-group size and pixels per work-item; only with stride
> 1) and ``gemm_tiled``'s own parameters prefixed ``g_``.
"""

from __future__ import annotations

import functools

from tunecl.kernels.conv.conv_columns import ColumnsAlgorithm, Layout, columns_layout
from tunecl.kernels.conv.conv_common import supported
from tunecl.problems import ConvProblem
from tunecl.runtime import Device

WORKSPACE_CAP = 256 * 2**20   # bytes of gathered images and partial weight gradients a plan may hold


@functools.lru_cache(maxsize=256)
def layout(problem: ConvProblem) -> Layout | None:
    """The workspace layout and GEMM of a 1×1 problem; None when it does not fit the cap."""
    return columns_layout(problem, 1, problem.stride != (1, 1), WORKSPACE_CAP)


class Conv1x1(ColumnsAlgorithm):
    """1×1 convolution as GEMM; see the module docstring."""

    version = 1

    def layout(self, problem: ConvProblem) -> Layout | None:
        return layout(problem)

    def gathers(self, problem: ConvProblem) -> bool:
        return problem.stride != (1, 1)

    def applies(self, problem: ConvProblem, device: Device) -> bool:
        return (problem.kind == "conv" and supported(problem) and (problem.r, problem.s) == (1, 1)
                and problem.padding == (0, 0) and self.gemm_applies(problem, device)
                and self.workspace_fits(problem, device))


ALGORITHMS = [Conv1x1("conv_1x1", "conv_1x1.cl", ("gather_strided", "scatter_strided"), "LD")]
