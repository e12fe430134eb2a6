"""``conv_1x1_mma_tf32``, ``conv_im2col_mma_tf32``, ``conv_winograd_mma_tf32`` and
``conv_winograd_f4_mma_tf32``: the 1×1, explicit-im2col and Winograd convolutions with their products on
``gemm_mma_tf32`` (tensor cores through inline PTX, TF32 inputs, fp32 accumulation) instead of
``gemm_tiled``.

Same kernels, workspace layouts, own parameters and plans as ``conv_1x1``, ``conv_im2col``,
``conv_winograd`` and ``conv_winograd_f4`` (:func:`~tunecl.kernels.conv.conv_common.with_gemm`); the ``g_``
parameters are ``gemm_mma_tf32``'s. In a TF32 training step on the H200 the first two families' fp32 GEMMs
won 12 of resnet50's 71 batch-64 problems over the TF32 implicit GEMM (1×1 convolutions, strided
backward-data), 43 ``gemm_tiled`` launches and 8.2 ms of the step; with those two added, fp32 Winograd
F(4×4) still held its 3×3 stride-1 convolutions (26 ``gemm_tiled`` launches, 3.7 ms of the step).

Precision: the 1×1 and im2col GEMMs are plain products of the convolution's values, so TF32's error model
(the conv harness's TF32 tolerance) is the implicit GEMM's. Winograd's products are of transformed
values (``U = G·f·Gᵀ``, ``V = Bᵀ·d·B``), so the harness bounds their TF32 rounding by the 2-norm of those
terms through the output transform (:func:`~tunecl.search.harness_conv.winograd_spread`): for uniform
data ~1.7x (F(2×2)) and ~4.4x (F(4×4)) the direct convolution's, i.e. a TF32 Winograd convolution is that
much less accurate than a TF32 implicit GEMM, and it is only chosen where a request accepts TF32.

Like every TF32 family: registered after every fp32 family (never the untuned default), ``precision``
``"tf32"`` (verified at the TF32 tolerance, served only to requests that accept TF32), and applicable only
where ``gemm_mma_tf32`` applies to the sub-problem, i.e. on devices whose probe granted ``"mma_tf32"``.
"""

from __future__ import annotations

from tunecl.kernels.conv import conv_1x1, conv_im2col, conv_winograd
from tunecl.kernels.gemm import gemm_mma
from tunecl.kernels.conv.conv_common import with_gemm

ALGORITHMS = [with_gemm(family, gemm_mma.NAME, f"{family.name}_mma_tf32")
              for family in (*conv_1x1.ALGORITHMS, *conv_im2col.ALGORITHMS, *conv_winograd.ALGORITHMS)]
