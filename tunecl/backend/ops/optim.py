"""Optimizer steps: torch's fused Adam/AdamW/SGD entry points as multi-tensor kernels.

``torch.optim.Adam(..., fused=True)`` (likewise AdamW, SGD) calls these once per step with every
parameter of a group; each launch updates up to ``Optim.slots`` tensors (8 unless ``TUNECL_OPTIM_SLOTS``
says otherwise). A learning rate given as a device tensor, and GradScaler's ``grad_scale`` and
``found_inf``, are read by the kernels on the device (so they may change between replays of a graph).
The default (foreach) optimizers run on the device through the multi-tensor ``_foreach_*`` ops of
:mod:`.foreach`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import graphs, half, memory, state
from tunecl.backend.operands import operand
from tunecl.backend.ops import optim_calls
from tunecl.backend.ops.pointwise import run
from tunecl.backend.ops.reduction import reduce
from tunecl.errors import Unsupported
from tunecl.kernels.strided import Operand


def _dense(tensors: Sequence[torch.Tensor]) -> None:
    for t in tensors:
        if t.device.type != "opencl" or t.dtype != torch.float32 or not t.is_contiguous():
            raise Unsupported("fused optimizer steps need contiguous float32 opencl tensors")


def _amp(tensor: torch.Tensor | None, name: str) -> Operand | None:
    """``grad_scale`` or ``found_inf`` of a fused step (torch.amp.GradScaler) as the kernel reads it."""
    if tensor is None:
        return None
    _scalar_float32(tensor, name)
    return operand(tensor)


def _lr(lr: float | torch.Tensor) -> float | Operand:
    """The learning rate a kernel takes: a number, or a device tensor's element (read by the kernel, so a
    scheduler's update between steps, or between replays of a graph, takes effect). A CPU tensor, as torch
    passes one, is read on the host (not inside a graph capture, where the value would be frozen)."""
    if not isinstance(lr, torch.Tensor):
        return lr
    if lr.numel() != 1:
        raise Unsupported("a learning-rate tensor must have one element")
    if lr.device.type == "cpu":
        graphs.check_not_capturing("reading a CPU learning-rate tensor (keep it on the opencl device)")
        return float(lr.item())
    if lr.device.type != "opencl" or lr.dtype != torch.float32:
        raise Unsupported("a learning-rate tensor must be float32 on the opencl device or the CPU")
    return operand(lr)


def fused_adam(adamw: bool) -> Callable[..., None]:
    def kernel(self: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
               exp_avg_sqs: list[torch.Tensor], max_exp_avg_sqs: list[torch.Tensor], state_steps: list[torch.Tensor],
               *, lr: float | torch.Tensor, beta1: float, beta2: float, weight_decay: float, eps: float,
               amsgrad: bool, maximize: bool, grad_scale: torch.Tensor | None = None,
               found_inf: torch.Tensor | None = None) -> None:
        if optim_calls.fused_adam(adamw, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1,
                                  beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf):
            return
        lr = _lr(lr)
        _dense([*self, *grads, *exp_avgs, *exp_avg_sqs, *(max_exp_avg_sqs if amsgrad else ()), *state_steps])
        rows = [(operand(p), operand(g), operand(m), operand(v), operand(max_exp_avg_sqs[i]) if amsgrad else None,
                 operand(s)) for i, (p, g, m, v, s) in enumerate(zip(self, grads, exp_avgs, exp_avg_sqs, state_steps))]
        state.get().optim.adam(rows, [p.numel() for p in self], lr=lr, beta1=beta1, beta2=beta2,
                               weight_decay=weight_decay, eps=eps, amsgrad=amsgrad, maximize=maximize, adamw=adamw,
                               grad_scale=_amp(grad_scale, "grad_scale"), found_inf=_amp(found_inf, "found_inf"))
    return kernel


def fused_sgd(self: list[torch.Tensor], grads: list[torch.Tensor], momentum_buffer_list: list[torch.Tensor], *,
              weight_decay: float, momentum: float, lr: float | torch.Tensor, dampening: float, nesterov: bool,
              maximize: bool, is_first_step: bool, grad_scale: torch.Tensor | None = None,
              found_inf: torch.Tensor | None = None) -> None:
    if optim_calls.fused_sgd(self, grads, momentum_buffer_list, weight_decay, momentum, lr, dampening, nesterov,
                             maximize, is_first_step, grad_scale, found_inf):
        return
    lr = _lr(lr)
    buffers = momentum_buffer_list if momentum != 0 else []
    _dense([*self, *grads, *buffers])
    rows = [(operand(p), operand(g), operand(buffers[i]) if buffers else None) for i, (p, g) in enumerate(zip(self, grads))]
    state.get().optim.sgd(rows, [p.numel() for p in self], lr=lr, weight_decay=weight_decay, momentum=momentum,
                          dampening=dampening, nesterov=nesterov, maximize=maximize, first_step=is_first_step,
                          grad_scale=_amp(grad_scale, "grad_scale"), found_inf=_amp(found_inf, "found_inf"))


# -- mixed precision (torch.amp.GradScaler) ---------------------------------------------------------------
def _scalar_float32(t: torch.Tensor, name: str) -> None:
    if t.device.type != "opencl" or t.dtype != torch.float32 or t.numel() != 1:
        raise Unsupported(f"{name} must be a one-element float32 opencl tensor")


def amp_non_finite_check_and_unscale(self: list[torch.Tensor], found_inf: torch.Tensor,
                                     inv_scale: torch.Tensor) -> None:
    """``_amp_foreach_non_finite_check_and_unscale_``: ``found_inf = 1`` if any gradient holds an inf
    or NaN; every gradient is multiplied by ``inv_scale`` (float32 compute, also for float16 grads).

    max |g| (a NaN-propagating reduction, no arithmetic that could overflow) is finite exactly when
    every element is, so each gradient costs one reduction, one scalar update and one multiply.
    """
    _scalar_float32(found_inf, "found_inf")
    _scalar_float32(inv_scale, "inv_scale")
    half.check(*self)
    for g in self:
        if g.numel() == 0:
            continue
        largest = memory.empty_contiguous([], torch.float32)
        reduce("norm_inf", g, None, False, largest)
        run("amp_found_inf", found_inf, (found_inf, largest))
        run("mul", g, (g, inv_scale))


def amp_update_scale(self: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor,
                     scale_growth_factor: float, scale_backoff_factor: float, growth_interval: int) -> torch.Tensor:
    """``_amp_update_scale_``: back off after an inf/NaN, grow after ``growth_interval`` clean steps."""
    _scalar_float32(self, "scale")
    _scalar_float32(found_inf, "found_inf")
    if growth_tracker.device.type != "opencl" or growth_tracker.dtype != torch.int32 or growth_tracker.numel() != 1:
        raise Unsupported("growth_tracker must be a one-element int32 opencl tensor")
    # the scale reads the tracker's old value, so it is updated first (in-order queue)
    run("amp_scale", self, (self, growth_tracker, found_inf),
        (scale_growth_factor, scale_backoff_factor, float(growth_interval)))
    run("amp_growth_tracker", growth_tracker, (growth_tracker, found_inf), (float(growth_interval),))
    return self


KERNELS: dict[str, Callable[..., Any]] = {
    "_amp_foreach_non_finite_check_and_unscale_": amp_non_finite_check_and_unscale,
    "_amp_update_scale_": amp_update_scale,
    "_fused_adam_": fused_adam(adamw=False),
    "_fused_adamw_": fused_adam(adamw=True),
    "_fused_sgd_": fused_sgd,
    # the same with a learning-rate tensor (a scheduler updates it in place)
    "_fused_adam_.tensor_lr": fused_adam(adamw=False),
    "_fused_adamw_.tensor_lr": fused_adam(adamw=True),
    "_fused_sgd_.tensor_lr": fused_sgd,
}
