"""The index family: gather / scatter along one dim (``index.cl``), for gather, scatter and
index_select."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyopencl as cl

from tunecl.errors import Unsupported
from tunecl.kernels.strided import (CTYPES, INT32_MAX, Operand, StridedFamily, merge_dims,
                                    meta_dtype, pack_meta, pad_front, rank_bucket)
from tunecl.kernels.sizes import round_up
from tunecl.runtime import Device

_NUMPY = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "int16": np.int16, "int8": np.int8,
          "uint8": np.uint8, "bool": np.uint8, "float16": np.uint16}
# the kernel's element type: the storage type, except float16, whose bits move unchanged as ushort
_KERNEL_TYPES = {**CTYPES, "float16": "ushort"}


class Index(StridedFamily):
    """Gathers and scatters. An index out of range is skipped and noted in :attr:`fault` (4 bytes, 0 or 1);
    :meth:`take_fault` reads and clears the note (a wait for the device) when a launch may have set it."""

    source_file = "index.cl"

    def __init__(self, device: Device):
        super().__init__(device)
        self.fault = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                               hostbuf=np.zeros(1, np.int32))
        self.armed = False   # a launch since the last take_fault

    def take_fault(self) -> bool:
        """Whether a launch since the last call met an index out of range (the note is cleared)."""
        if not self.armed:
            return False
        self.armed = False
        note = np.zeros(1, np.int32)
        cl.enqueue_copy(self.device.queue, note, self.fault, is_blocking=True)
        if note[0]:
            cl.enqueue_copy(self.device.queue, self.fault, np.zeros(1, np.int32), is_blocking=True)
        return bool(note[0])

    def __call__(self, scatter: bool, shape: Sequence[int], out: Operand, index: Operand, src: Operand | float,
                 dim_size: int, target_stride: int) -> cl.Event | None:
        """Gather into ``out`` or scatter ``src`` (an operand or a scalar) over ``shape``.

        Strides of all operands are given over ``shape``; the indexed operand's stride along the
        indexed dim must be 0 there, its real stride is ``target_stride``.
        """
        dtype = out.dtype
        if dtype not in _NUMPY or index.dtype not in ("int64", "int32") or \
                (isinstance(src, Operand) and src.dtype != dtype):
            raise Unsupported(f"gather/scatter of {dtype} with {index.dtype} indices")
        count = math.prod(shape)
        if count == 0:
            return None
        scalar = not isinstance(src, Operand)
        src_op = Operand(None, 0, (0,) * len(shape), dtype) if scalar else src
        mshape, strides = merge_dims(shape, [out.strides, index.strides, src_op.strides])
        rank = rank_bucket(len(mshape))
        reach = max(o.offset for o in (out, index, src_op)) + sum(
            (n - 1) * max(abs(s) for s in col) for n, col in zip(mshape, zip(*strides))) + dim_size * abs(target_stride)
        idx = "long" if count > INT32_MAX or reach > INT32_MAX else "int"
        key = (scatter, scalar, dtype, index.dtype, rank, idx)
        kernel = self.cache.get(key)
        meta_len = 1 + 4 * rank + 5
        if kernel is None:
            options = [f"-DNDIM={rank}", f"-DIDX={idx}", f"-DT={_KERNEL_TYPES[dtype]}",
                       f"-DTIDX={CTYPES[index.dtype]}"]
            options += ["-DSCATTER"] * scatter + ["-DSRC_SCALAR"] * scalar
            kernel = self.cache.build(key, options, "index_kernel",
                                      [None, None, None, _NUMPY[dtype], meta_dtype(meta_len, idx), None])
        meta = [count] + pad_front(mshape, rank, 1)
        for st in strides:
            meta += pad_front(st, rank, 0)
        meta += [out.offset, index.offset, src_op.offset, dim_size, target_stride]
        value = np.float16(src).view(np.uint16) if scalar and dtype == "float16" else _NUMPY[dtype](src if scalar else 0)
        self.armed = True
        return kernel(self.device.queue, (round_up(count, self.local),), (self.local,), out.buffer, index.buffer,
                      src_op.buffer, value, pack_meta(meta, idx), self.fault)
