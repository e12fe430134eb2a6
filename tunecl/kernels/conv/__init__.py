"""The convolution wing: the tunable convolution families, each one module and one ``.cl`` file
named like its algorithm, with what they share: the plan contract and the GEMM-backed families' base
(``conv_common.py``), the column layout of ``conv_1x1`` and ``conv_im2col`` (``conv_columns.py``) and the
included ``.cl`` files (geometry, the GEMM view of a direction, direct tiles, pixel passes). The
GEMM-backed families compute their products with the GEMM wing's plans.
"""
