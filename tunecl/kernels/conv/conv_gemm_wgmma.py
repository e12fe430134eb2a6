"""``conv_1x1_wgmma_tf32``, ``conv_im2col_wgmma_tf32``, ``conv_winograd_wgmma_tf32`` and
``conv_winograd_f4_wgmma_tf32``: the GEMM-backed convolutions of :mod:`tunecl.kernels.conv.conv_gemm_mma` with
their products on ``gemm_wgmma_tf32`` (Hopper's warpgroup MMA, TF32 inputs, fp32 accumulation) instead of
``gemm_mma_tf32``.

Same kernels, workspace layouts, own parameters and plans as their fp32 twins
(:func:`~tunecl.kernels.conv.conv_common.with_gemm`); the ``g_`` parameters are ``gemm_wgmma_tf32``'s,
``PRETRANS`` included: an operand that is MN-contiguous in memory (the pixels of a 1×1 convolution's input
in ``fwd``, say) is either copied element by element into the K-major local tile or transposed first into a
workspace the plan holds; the tuner chooses. Where 4096³ runs ``gemm_wgmma_tf32`` at twice
``gemm_mma_tf32``'s speed on the H200, resnet50's 1×1 and Winograd products are smaller and often
memory-bound; these families let the tuner measure which core serves each one.

Precision and registration as :mod:`~tunecl.kernels.conv.conv_gemm_mma`: ``"tf32"``, verified at the same
tolerances (Winograd's bounded by ``winograd_spread``), registered after every fp32 family, and applicable
only where ``gemm_wgmma_tf32`` applies to the sub-problem, i.e. on devices whose probe granted ``"wgmma"``.
"""

from __future__ import annotations

from tunecl.kernels.conv import conv_1x1, conv_im2col, conv_winograd
from tunecl.kernels.gemm import gemm_wgmma
from tunecl.kernels.conv.conv_common import with_gemm

ALGORITHMS = [with_gemm(family, gemm_wgmma.NAME, f"{family.name}_wgmma_tf32")
              for family in (*conv_1x1.ALGORITHMS, *conv_im2col.ALGORITHMS, *conv_winograd.ALGORITHMS)]
