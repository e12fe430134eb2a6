"""Prefix sums and products along one dim (``scan.cl``): one work-group per line, a blocked scan inside it."""

from __future__ import annotations

from tunecl.errors import Unsupported
from tunecl.kernels.strided import (CTYPES, INT32_MAX, KernelCache, Operand, meta_dtype, pack_meta,
                                    pow2_work_group)
from tunecl.runtime import Device

# kernel dtype -> accumulate type: float32 in float, integers in long (torch's CPU and CUDA kernels both)
_ACCUMULATE = {"float32": "float", "int64": "long", "int32": "long", "int16": "long", "int8": "long",
               "uint8": "long"}


class Scan:
    def __init__(self, device: Device):
        self.device = device
        self.cache = KernelCache(device, __package__, "scan.cl")
        self.max_group = pow2_work_group(device, 256)

    def scan(self, op: str, length: int, lines: tuple[int, int], dst: Operand, src: Operand) -> None:
        """``dst = cumsum(src)`` (``op`` "sum") or ``cumprod(src)`` ("product") along lines of ``length``
        elements; ``lines`` = (A, B) and each operand's strides are (scan, a, b). ``src`` and ``dst`` have the
        same dtype (float32 or an integer type)."""
        if dst.dtype != src.dtype or dst.dtype not in _ACCUMULATE or op not in ("sum", "product"):
            raise Unsupported(f"cumulative {op} of {src.dtype} into {dst.dtype}")
        count = lines[0] * lines[1]
        if count == 0 or length == 0:
            return
        reach = max(abs(o.offset) + sum((n - 1) * abs(s) for n, s in zip((length, *lines), o.strides))
                    for o in (src, dst))
        idx = "long" if max(reach, count * length) > INT32_MAX else "int"
        group = min(self.max_group, 1 << max(0, (length - 1) // 4).bit_length())   # >= 4 elements an item
        ctype = CTYPES[dst.dtype]
        key = (op, ctype, idx, group)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DTI={ctype}", f"-DTO={ctype}", f"-DTA={_ACCUMULATE[dst.dtype]}", f"-DIDX={idx}",
                       f"-DGROUP={group}", *(["-DPRODUCT"] if op == "product" else [])]
            kernel = self.cache.build(key, options, "cumsum_lines", [None, None, meta_dtype(10, idx)])
        meta = [length, lines[1], src.offset, *src.strides, dst.offset, *dst.strides]
        kernel(self.device.queue, (count * group,), (group,), dst.buffer, src.buffer, pack_meta(meta, idx))
