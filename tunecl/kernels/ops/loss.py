"""The loss family: negative log-likelihood forward and backward (``loss.cl``)."""

from __future__ import annotations

import pyopencl as cl

from tunecl.errors import Unsupported
from tunecl.kernels.strided import INT32_MAX, KernelCache, Operand, meta_dtype, pack_meta, work_group
from tunecl.runtime import Device

REDUCTIONS = ("none", "mean", "sum")


class NllLoss:
    def __init__(self, device: Device):
        self.device = device
        self.cache = KernelCache(device, __package__, "loss.cl")
        self.group = work_group(device, 256)

    def _kernel(self, name: str, weighted: bool, reduction: str, per_sample: bool, idx: str) -> cl.Kernel:
        key = (name, weighted, reduction, per_sample, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DGROUP={self.group}", f"-DIDX={idx}"]
            options += ["-DHAS_WEIGHT"] * weighted + ["-DMEAN"] * (reduction == "mean")
            options += ["-DPER_SAMPLE_GRAD"] * per_sample
            kernel = self.cache.build(key, options, name, [None] * 5 + [meta_dtype(9, idx)])
        return kernel

    @staticmethod
    def _check(x: Operand, target: Operand, weight: Operand | None) -> None:
        if x.dtype != "float32" or target.dtype != "int64" or (weight is not None and weight.dtype != "float32"):
            raise Unsupported("nll_loss needs float32 input/weight and int64 target")

    def forward(self, x: Operand, target: Operand, weight: Operand | None, n: int, c: int, reduction: str,
                ignore_index: int, out: Operand, total_weight: Operand) -> cl.Event:
        """``out`` = the loss (per sample for "none"); ``total_weight`` = sum of counted weights.
        ``x`` and ``target`` are contiguous ((n, c) and (n,))."""
        self._check(x, target, weight)
        idx = "long" if x.offset + n * c > INT32_MAX else "int"
        meta = pack_meta([n, c, ignore_index, out.offset, total_weight.offset, x.offset, target.offset,
                          weight.offset if weight is not None else 0, 0], idx)
        args = (out.buffer, total_weight.buffer, x.buffer, target.buffer,
                weight.buffer if weight is not None else None, meta)
        queue = self.device.queue
        if reduction == "none":
            kernel = self._kernel("nll_none", weight is not None, reduction, False, idx)
            local = work_group(self.device, 64)
            return kernel(queue, (max(-(-n // local), 1) * local,), (local,), *args)
        kernel = self._kernel("nll_reduce", weight is not None, reduction, False, idx)
        return kernel(queue, (self.group,), (self.group,), *args)

    def backward(self, grad_output: Operand, x_grad: Operand, target: Operand, weight: Operand | None, n: int,
                 c: int, reduction: str, ignore_index: int, total_weight: Operand) -> cl.Event | None:
        """``x_grad`` (contiguous (n, c)) = d loss / d x given ``grad_output``."""
        self._check(x_grad, target, weight)
        if n * c == 0:
            return None
        idx = "long" if x_grad.offset + n * c > INT32_MAX else "int"
        kernel = self._kernel("nll_backward", weight is not None, reduction, reduction == "none", idx)
        meta = pack_meta([n, c, ignore_index, 0, total_weight.offset, x_grad.offset, target.offset,
                          weight.offset if weight is not None else 0, grad_output.offset], idx)
        local = work_group(self.device, 256)
        return kernel(self.device.queue, (-(-(n * c) // local) * local,), (local,), x_grad.buffer,
                      total_weight.buffer, grad_output.buffer, target.buffer,
                      weight.buffer if weight is not None else None, meta)
