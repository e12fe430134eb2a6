"""Group norm's backward (``group_norm.cl``): per-channel sums, per-group coefficients, then the input
gradient element by element and the parameters' gradients channel by channel. GN_GROUP sets the
work-items that sum one (sample, channel) row."""

from __future__ import annotations

from tunecl.kernels.strided import (INT32_MAX, Operand, StridedFamily, meta_dtype, pack_meta,
                                    pow2_work_group)
from tunecl.kernels.sizes import round_up
from tunecl.runtime import Device

GN_GROUP = 256


class GroupNorm(StridedFamily):
    source_file = "group_norm.cl"

    def __init__(self, device: Device):
        super().__init__(device)
        self.row_group = pow2_work_group(device, GN_GROUP)

    def backward(self, n: int, c: int, hw: int, groups: int, x: Operand, dy: Operand, mean: Operand,
                 rstd: Operand, weight: Operand | None, dx: Operand | None, grad_weight: Operand | None,
                 grad_bias: Operand | None, ds: Operand, db: Operand, c2: Operand, c3: Operand) -> None:
        """Group norm's gradients (those given as None are not computed). Every operand is contiguous
        float32 (only its buffer and offset are read): x, dy, dx (N, C, HxW); mean, rstd, and the scratch
        c2, c3 (N, G); weight and the parameter gradients (C,); the scratch ds, db (N, C)."""
        operands = (x, dy, mean, rstd, weight, dx, grad_weight, grad_bias, ds, db, c2, c3)
        span = max(o.offset for o in operands if o is not None) + n * c * hw + n * c + c
        idx = "long" if span > INT32_MAX else "int"
        meta = pack_meta([n, c, hw, groups] + [0 if o is None else o.offset for o in operands], idx)
        queue = self.device.queue
        wants_params = grad_weight is not None or grad_bias is not None
        if n * c and (dx is not None and hw or wants_params):
            sums = self._kernel("gn_channel_sums", (), idx, 4)
            sums(queue, (n * c * self.row_group,), (self.row_group,), ds.buffer, db.buffer, x.buffer, dy.buffer,
                 meta)
        has_weight = ("HAS_WEIGHT",) if weight is not None else ()
        w = None if weight is None else weight.buffer
        if dx is not None and n * c * hw:
            coeffs = self._kernel("gn_group_coeffs", has_weight, idx, 7)
            coeffs(queue, (round_up(n * groups, self.local),), (self.local,), c2.buffer, c3.buffer, ds.buffer,
                   db.buffer, mean.buffer, rstd.buffer, w, meta)
            count = n * c * hw
            inputs = self._kernel("gn_backward_input", has_weight, idx, 7)
            inputs(queue, (round_up(count, self.local),), (self.local,), dx.buffer, x.buffer, dy.buffer,
                   rstd.buffer, w, c2.buffer, c3.buffer, meta)
        if wants_params and c:
            flags = ("HAS_GW",) * (grad_weight is not None) + ("HAS_GB",) * (grad_bias is not None)
            params = self._kernel("gn_backward_params", flags, idx, 6)
            params(queue, (round_up(c, self.local),), (self.local,),
                   None if grad_weight is None else grad_weight.buffer,
                   None if grad_bias is None else grad_bias.buffer, ds.buffer, db.buffer, mean.buffer, rstd.buffer,
                   meta)

    def _kernel(self, name: str, flags: tuple[str, ...], idx: str, buffers: int):
        key = (name, flags, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DIDX={idx}", f"-DGROUP={self.row_group}"] + [f"-D{f}" for f in flags]
            kernel = self.cache.build(key, options, name, [None] * buffers + [meta_dtype(16, idx)])
        return kernel
