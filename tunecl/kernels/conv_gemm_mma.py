"""``conv_1x1_mma_tf32`` and ``conv_im2col_mma_tf32``: the 1×1 and explicit-im2col convolutions with their
products on ``gemm_mma_tf32`` (tensor cores through inline PTX, TF32 inputs, fp32 accumulation) instead of
``gemm_tiled``.

Same kernels, workspace layouts, own parameters and plans as ``conv_1x1`` and ``conv_im2col``
(:func:`~tunecl.kernels.conv_common.with_gemm`); the ``g_`` parameters are ``gemm_mma_tf32``'s. In a TF32
training step on the H200 these two families' fp32 GEMMs still won 12 of resnet50's 71 batch-64 problems
over the TF32 implicit GEMM (1×1 convolutions, strided backward-data), 43 ``gemm_tiled`` launches and
8.2 ms of the step: their GEMMs are plain products of the convolution's values, so TF32's error model (the
conv harness's TF32 tolerance) is the implicit GEMM's. Winograd is left out: its products are of
transformed values, whose TF32 rounding that tolerance does not describe.

Like every TF32 family: registered after every fp32 family (never the untuned default), ``precision``
``"tf32"`` (verified at the TF32 tolerance, served only to requests that accept TF32), and applicable only
where ``gemm_mma_tf32`` applies to the sub-problem, i.e. on devices whose probe granted ``"mma_tf32"``.
"""

from __future__ import annotations

from tunecl.kernels import conv_1x1, conv_im2col, gemm_mma
from tunecl.kernels.conv_common import with_gemm

ALGORITHMS = [with_gemm(family, gemm_mma.NAME, f"{family.name}_mma_tf32")
              for family in (*conv_1x1.ALGORITHMS, *conv_im2col.ALGORITHMS)]
