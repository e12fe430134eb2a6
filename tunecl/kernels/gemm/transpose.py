"""Batched out-of-place transposes of fp32 matrices (``transpose.cl``): an operand turned around for a
kernel that reads it only in the other orientation (gemm_wgmma_tf32's K-major tiles)."""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from tunecl.kernels.base import read_source
from tunecl.runtime import Device

TILE, TROWS, PAIR_TILE = 32, 8, 64  # as in transpose.cl
SCALAR_DTYPES = [None, np.int64, np.int32, np.int64, None, np.int32, np.int32]


class Transpose:
    """The transpose kernel of one device, compiled once per process (the device's build cache)."""

    def __init__(self, device: Device):
        self.device = device
        program = device.build(read_source(__package__, "transpose.cl"))
        self._kernel = device.kernel(program, "transpose", SCALAR_DTYPES)
        self._pairs = device.kernel(program, "transpose_pairs", SCALAR_DTYPES)

    def run(self, src: cl.Buffer, offset: int, ld: int, stride: int, rows: int, cols: int, batch: int,
            out: cl.Buffer, wait_for: list | None = None) -> cl.Event:
        """Enqueue ``out[b] = M_b^T`` for b < ``batch``, M_b the ``rows`` x ``cols`` matrix at ``offset +
        b * stride`` of ``src`` (row stride ``ld``), each result packed (``cols`` x ``rows``) at element
        ``b * rows * cols`` of ``out``."""
        if not (offset % 2 or ld % 2 or (stride % 2 and batch > 1) or rows % 2 or cols % 2):
            # every float2 pair whole and 8-byte aligned: the paired kernel (transpose.cl)
            glob = (-(-cols // PAIR_TILE) * TILE, -(-rows // PAIR_TILE) * TROWS, batch)
            return self._pairs(self.device.queue, glob, (TILE, TROWS, 1), src, offset, ld, stride, out, rows, cols,
                               wait_for=wait_for)
        glob = (-(-cols // TILE) * TILE, -(-rows // TILE) * TROWS, batch)
        return self._kernel(self.device.queue, glob, (TILE, TROWS, 1), src, offset, ld, stride, out, rows, cols,
                            wait_for=wait_for)
