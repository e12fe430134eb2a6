"""The ops transformers need beyond a CNN's (``transformer.cl``): the triangle masks (tril/triu)."""

from __future__ import annotations

from tunecl.kernels.strided import (
    INT32_MAX,
    KernelCache,
    Operand,
    Unsupported,
    meta_dtype,
    pack_meta,
    round_up,
    work_group,
)
from tunecl.runtime import Device

# an element's size in bytes -> the unsigned OpenCL type that moves its bits
_BITS = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}
_ITEMSIZE = {"float32": 4, "float16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


class Transformer:
    def __init__(self, device: Device):
        self.device = device
        self.cache = KernelCache(device, __package__, "transformer.cl")
        self.local = work_group(device, 256)

    def tri(self, lower: bool, batch: int, rows: int, cols: int, diagonal: int, out: Operand, src: Operand) -> None:
        """``out = tril(src, diagonal)`` (``lower``) or ``triu``, over ``batch`` matrices of ``rows`` x ``cols``;
        each operand's strides are (batch, row, column)."""
        if out.dtype != src.dtype or out.dtype not in _ITEMSIZE:
            raise Unsupported(f"tril/triu of {src.dtype} into {out.dtype}")
        count = batch * rows * cols
        if count == 0:
            return
        k = max(-rows - 1, min(cols + 1, diagonal))   # past either edge, every element is kept or cleared
        reach = max(abs(o.offset) + sum((n - 1) * abs(s) for n, s in zip((batch, rows, cols), o.strides))
                    for o in (out, src))
        idx = "long" if max(count, reach) > INT32_MAX else "int"
        bits = _BITS[_ITEMSIZE[out.dtype]]
        key = ("tri", lower, bits, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DT={bits}", f"-DIDX={idx}"] + ["-DLOWER"] * lower
            kernel = self.cache.build(key, options, "tri_kernel", [None, None, meta_dtype(12, idx)])
        meta = [count, rows, cols, k, src.offset, *src.strides, out.offset, *out.strides]
        kernel(self.device.queue, (round_up(count, self.local),), (self.local,), out.buffer, src.buffer,
               pack_meta(meta, idx))

