"""Elementwise losses and their backward: mean squared error, smooth L1, Huber and binary cross-entropy
(``F.mse_loss``, ``F.smooth_l1_loss``, ``F.huber_loss``, ``F.binary_cross_entropy``; detection heads, GANs,
multi-label classifiers).

Each loss is one pointwise expression (:data:`tunecl.kernels.ops.pointwise.EXPRESSIONS`, as torch's CPU
kernels compute it) into the output (``reduction="none"``) or into a temporary reduced to the mean or sum.
The backward scales by 1/N for the mean. Binary cross-entropy checks, as torch's CPU kernel does, that every
input lies in [0, 1] (a read of one flag from the device; not inside a graph capture, where the values are
not known yet).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import graphs, memory
from tunecl.backend.ops.pointwise import new_like, run
from tunecl.backend.ops.reduction import reduce

_REDUCTIONS = ("none", "mean", "sum")


def _reduced(expr: str, self: torch.Tensor, target: torch.Tensor, params: tuple, reduction: int,
             out: torch.Tensor) -> torch.Tensor:
    """``expr`` of (self, target) into ``out``, or reduced into it by ``reduction``."""
    mode = _REDUCTIONS[reduction]
    shape = torch.broadcast_shapes(self.shape, target.shape)
    if mode == "none":
        if out.shape != shape:
            out.resize_(shape)
        return run(expr, out, (self, target), params)
    each = memory.empty_contiguous(shape, out.dtype)
    run(expr, each, (self, target), params)
    return reduce(mode, each, None, False, out)


def _backward(expr: str, grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor, params: tuple,
              reduction: int, grad_input: torch.Tensor) -> torch.Tensor:
    norm = 1.0 / max(self.numel(), 1) if _REDUCTIONS[reduction] == "mean" else 1.0
    if grad_input.shape != self.shape:
        grad_input.resize_(self.shape)
    return run(expr, grad_input, (self, target, grad_output), (*params, norm))


def mse_loss_out(self: torch.Tensor, target: torch.Tensor, reduction: int = 1, *, out: torch.Tensor) -> torch.Tensor:
    return _reduced("squared_difference", self, target, (), reduction, out)


def mse_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor, reduction: int, *,
                      grad_input: torch.Tensor) -> torch.Tensor:
    scale = 2.0 / max(self.numel(), 1) if _REDUCTIONS[reduction] == "mean" else 2.0
    return run("mse_backward", grad_input, (self, target, grad_output), (scale,))


def smooth_l1_loss_out(self: torch.Tensor, target: torch.Tensor, reduction: int = 1, beta: float = 1.0, *,
                       out: torch.Tensor) -> torch.Tensor:
    return _reduced("smooth_l1", self, target, (beta,), reduction, out)


def smooth_l1_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor, reduction: int,
                            beta: float, *, grad_input: torch.Tensor) -> torch.Tensor:
    return _backward("smooth_l1_backward", grad_output, self, target, (beta,), reduction, grad_input)


def huber_loss_out(self: torch.Tensor, target: torch.Tensor, reduction: int = 1, delta: float = 1.0, *,
                   out: torch.Tensor) -> torch.Tensor:
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    return _reduced("huber", self, target, (delta,), reduction, out)


def huber_loss_backward_out(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor, reduction: int,
                            delta: float, *, grad_input: torch.Tensor) -> torch.Tensor:
    return _backward("huber_backward", grad_output, self, target, (delta,), reduction, grad_input)


def _check_bce(self: torch.Tensor) -> None:
    if self.numel() and not graphs.capturing() and bool(((self < 0) | (self > 1)).any()):
        raise RuntimeError("all elements of input should be between 0 and 1")


def binary_cross_entropy_out(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                             reduction: int = 1, *, out: torch.Tensor) -> torch.Tensor:
    _check_bce(self)
    if weight is None:
        return _reduced("binary_cross_entropy", self, target, (), reduction, out)
    each = memory.empty_contiguous(self.shape, self.dtype)
    run("binary_cross_entropy", each, (self, target))
    run("mul", each, (each, weight))
    if _REDUCTIONS[reduction] == "none":
        if out.shape != self.shape:
            out.resize_(self.shape)
        return run("copy", out, (each,))
    return reduce(_REDUCTIONS[reduction], each, None, False, out)


def binary_cross_entropy(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                         reduction: int = 1) -> torch.Tensor:
    return binary_cross_entropy_out(self, target, weight, reduction,
                                    out=memory.empty_contiguous((), self.dtype))


def binary_cross_entropy_backward_out(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                                      weight: torch.Tensor | None = None, reduction: int = 1, *,
                                      grad_input: torch.Tensor) -> torch.Tensor:
    _backward("binary_cross_entropy_backward", grad_output, self, target, (), reduction, grad_input)
    if weight is not None:
        run("mul", grad_input, (grad_input, weight))
    return grad_input


def binary_cross_entropy_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                                  weight: torch.Tensor | None = None, reduction: int = 1) -> torch.Tensor:
    return binary_cross_entropy_backward_out(grad_output, self, target, weight, reduction,
                                             grad_input=memory.empty_contiguous(self.shape, self.dtype))


def _functional(out_kernel: Callable[..., torch.Tensor], out_name: str = "out") -> Callable[..., torch.Tensor]:
    """The functional overload of an ``.out`` kernel: the result allocated here (its shape set by the kernel)."""
    def kernel(self: torch.Tensor, *args: Any) -> torch.Tensor:
        return out_kernel(self, *args, **{out_name: memory.empty_contiguous((), self.dtype)})
    return kernel


KERNELS: dict[str, Callable[..., Any]] = {
    "mse_loss.out": mse_loss_out,
    "mse_loss_backward.grad_input": mse_loss_backward,
    "mse_loss_backward": lambda grad_output, self, target, reduction: mse_loss_backward(
        grad_output, self, target, reduction, grad_input=new_like(self)),
    "smooth_l1_loss.out": smooth_l1_loss_out,
    "smooth_l1_loss_backward.grad_input": smooth_l1_loss_backward,
    "huber_loss.out": huber_loss_out,
    "huber_loss": _functional(huber_loss_out),
    "huber_loss_backward.out": huber_loss_backward_out,
    "binary_cross_entropy.out": binary_cross_entropy_out,
    "binary_cross_entropy": binary_cross_entropy,
    "binary_cross_entropy_backward.grad_input": binary_cross_entropy_backward_out,
    "binary_cross_entropy_backward": binary_cross_entropy_backward,
}
