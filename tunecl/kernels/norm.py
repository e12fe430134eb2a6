"""The norm family: batch normalisation forward (train/eval) and backward (``norm.cl``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyopencl as cl

from tunecl.kernels.strided import (
    INT32_MAX,
    KernelCache,
    Operand,
    Unsupported,
    meta_dtype,
    pack_meta,
    work_group,
)
from tunecl.runtime import Device

# the buffers every batch-norm kernel takes, in argument order
BUFFERS = ("x", "y", "weight", "bias", "running_mean", "running_var", "save_mean", "save_invstd", "dy",
           "grad_weight", "grad_bias", "scratch")
_OFFSETS = ("x", "y", "weight", "bias", "running_mean", "running_var", "save_mean", "save_invstd", "dy",
            "grad_weight", "grad_bias")


class BatchNorm:
    def __init__(self, device: Device):
        self.device = device
        self.cache = KernelCache(device, __package__, "norm.cl")
        self.group = work_group(device, 256)

    def _launch(self, name: str, per_channel: bool, shape: tuple[int, int, int], ops: Mapping[str, Operand | None],
                flags: tuple[str, ...], eps: float, momentum: float) -> cl.Event:
        if any(o is not None and o.dtype != "float32" for o in ops.values()):
            raise Unsupported("batch norm needs float32")
        n, c, length = shape
        wide = max((o.offset for o in ops.values() if o is not None), default=0) + n * c * length > INT32_MAX
        idx = "long" if wide else "int"
        key = (name, flags, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DGROUP={self.group}", f"-DIDX={idx}"] + [f"-D{flag}" for flag in flags]
            kernel = self.cache.build(key, options, name, [None] * 12 + [np.float32, np.float32, meta_dtype(14, idx)])
        meta = pack_meta([n, c, length] + [ops[k].offset if ops.get(k) is not None else 0 for k in _OFFSETS], idx)
        args = [ops[k].buffer if ops.get(k) is not None else None for k in BUFFERS] + [float(eps), float(momentum), meta]
        if per_channel:
            return kernel(self.device.queue, (c * self.group,), (self.group,), *args)
        local = work_group(self.device, 256)
        return kernel(self.device.queue, (-(-(n * c * length) // local) * local,), (local,), *args)

    def forward(self, shape: tuple[int, int, int], ops: Mapping[str, Operand | None], training: bool,
                eps: float, momentum: float) -> None:
        """``ops`` names x, y, weight, bias, running_mean, running_var, save_mean, save_invstd."""
        flags = tuple(f for f, on in (("HAS_WEIGHT", ops.get("weight")), ("HAS_BIAS", ops.get("bias")),
                                      ("HAS_RUNNING", ops.get("running_mean")), ("EVAL", not training)) if on)
        if training:
            self._launch("bn_stats", True, shape, ops, tuple(f for f in flags if f == "HAS_RUNNING"), eps, momentum)
        self._launch("bn_apply", False, shape, ops, tuple(f for f in flags if f != "HAS_RUNNING"), eps, momentum)

    def backward(self, shape: tuple[int, int, int], ops: Mapping[str, Operand | None], training: bool,
                 eps: float, need_input_grad: bool) -> None:
        """``ops`` names dy, x, weight, mean/invstd (saved or running), y (grad_input),
        grad_weight, grad_bias and a scratch of 2*C floats."""
        base = (("HAS_WEIGHT",) if ops.get("weight") is not None else ()) + (("EVAL",) if not training else ())
        reduce_flags = base + (("HAS_GW",) if ops.get("grad_weight") is not None else ()) + \
            (("HAS_GB",) if ops.get("grad_bias") is not None else ())
        if training or ops.get("grad_weight") is not None or ops.get("grad_bias") is not None:
            self._launch("bn_backward_reduce", True, shape, ops, reduce_flags, eps, 0.0)
        if need_input_grad:
            self._launch("bn_backward_apply", False, shape, ops, base, eps, 0.0)
