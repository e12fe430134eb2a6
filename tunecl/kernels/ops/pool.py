"""The pool family: max / average / adaptive-average 2-D pooling and their backward (``pool.cl``)."""

from __future__ import annotations

from dataclasses import dataclass

import pyopencl as cl

from tunecl.errors import Unsupported
from tunecl.kernels.strided import INT32_MAX, KernelCache, Operand, meta_dtype, pack_meta, work_group
from tunecl.runtime import Device


@dataclass(frozen=True)
class Window:
    """Geometry of one pooling: planes (N*C), input and output sizes, kernel, stride, padding,
    dilation, and the average-pool divisor rules."""

    planes: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int = 1
    kw: int = 1
    sh: int = 1
    sw: int = 1
    ph: int = 0
    pw: int = 0
    dh: int = 1
    dw: int = 1
    count_include_pad: bool = True
    divisor: int = 0  # 0: none (divisor_override)

    def values(self) -> list[int]:
        return [self.planes, self.h, self.w, self.oh, self.ow, self.kh, self.kw, self.sh, self.sw, self.ph,
                self.pw, self.dh, self.dw, int(self.count_include_pad), self.divisor]


KERNELS = ("max_forward", "max_backward", "avg_forward", "avg_backward", "adaptive_forward", "adaptive_backward")


class Pool:
    def __init__(self, device: Device):
        self.device = device
        self.cache = KernelCache(device, __package__, "pool.cl")

    def __call__(self, name: str, window: Window, out: Operand, inp: Operand, aux: Operand | None = None
                 ) -> cl.Event | None:
        """Enqueue kernel ``name``: one work-item per output element (forward) or per input
        element (``*_backward``, where ``out`` is the input gradient and ``inp`` the output gradient).
        All tensors are contiguous; ``aux`` holds the int64 max-pool indices."""
        if name not in KERNELS:
            raise ValueError(f"unknown pool kernel {name}")
        if out.dtype != "float32" or inp.dtype != "float32":
            raise Unsupported("pooling needs float32")
        backward = name.endswith("backward")
        count = window.planes * (window.h * window.w if backward else window.oh * window.ow)
        if count == 0:
            return None
        size = window.planes * max(window.h * window.w, window.oh * window.ow)
        idx = "long" if size + max(out.offset, inp.offset, aux.offset if aux else 0) > INT32_MAX else "int"
        key = (name, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self.cache.build(key, [f"-DIDX={idx}"], name, [None, None, None, meta_dtype(18, idx)])
        meta = pack_meta(window.values() + [out.offset, inp.offset, aux.offset if aux else 0], idx)
        local = work_group(self.device, 128)
        return kernel(self.device.queue, (-(-count // local) * local,), (local,), out.buffer, inp.buffer,
                      aux.buffer if aux else None, meta)
