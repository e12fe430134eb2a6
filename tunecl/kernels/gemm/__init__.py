"""The GEMM wing: the tunable GEMM families (``gemm_tiled`` in ``gemm_tiled.py``, ``gemm_direct``,
``gemm_simt``, ``gemm_mma``, ``gemm_wgmma``), each one module and one ``.cl`` file, over the GEMM core
that they and the convolution wing's GEMM-backed families share: the host helpers and ``GemmPlan``
(``core.py``), operand layouts (``gemm_operands.py``), pre-transposed operands (``gemm_pretrans.py``
with ``transpose.py``), and the ``.cl`` files every GEMM kernel includes (arguments, tile order, vector
loads, C pairs, cp.async, the mma core, warp tiles and fragments).
"""
