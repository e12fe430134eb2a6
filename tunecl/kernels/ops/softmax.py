"""The softmax family: softmax / log_softmax over one dim and their backward (``softmax.cl``)."""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from tunecl.errors import Unsupported
from tunecl.kernels.strided import INT32_MAX, KernelCache, Operand, work_group
from tunecl.runtime import Device

MODES = {"softmax": 0, "log_softmax": 1, "softmax_backward": 2, "log_softmax_backward": 3}


class Softmax:
    def __init__(self, device: Device):
        self.device = device
        self.cache = KernelCache(device, __package__, "softmax.cl")
        self.group = work_group(device, 128)

    def __call__(self, op: str, outer: int, size: int, inner: int, out: Operand, a: Operand,
                 b: Operand | None = None) -> cl.Event | None:
        """Enqueue ``op`` on contiguous fp32 tensors viewed as (outer, size, inner).

        ``a`` is the input (forward) or the output gradient (backward); ``b`` the forward output.
        """
        if any(t.dtype != "float32" for t in (out, a, *(() if b is None else (b,)))):
            raise Unsupported("softmax needs float32")
        rows = outer * inner
        if rows == 0 or size == 0:
            return None
        last = max(out.offset, a.offset, b.offset if b is not None else 0) + rows * size
        idx = "long" if last > INT32_MAX else "int"
        group = self.group if inner == 1 and size >= 64 else 0
        key = (MODES[op], group, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            np_idx = np.int64 if idx == "long" else np.int32
            kernel = self.cache.build(key, [f"-DMODE={MODES[op]}", f"-DGROUP={group}", f"-DIDX={idx}"],
                                      "softmax", [None, None, None] + [np_idx] * 6)
        args = (out.buffer, a.buffer, (b or a).buffer, outer, size, inner, out.offset, a.offset,
                b.offset if b is not None else 0)
        if group:
            return kernel(self.device.queue, (rows * group,), (group,), *args)
        local = work_group(self.device, 64)
        return kernel(self.device.queue, (-(-rows // local) * local,), (local,), *args)
