"""Activations beyond the pointwise tables' one-expression ops: ``log_sigmoid`` (and so
``F.binary_cross_entropy_with_logits``), ``mish``, ``glu``, ``prelu``, ``logit`` and ``rrelu``, forward and
backward.

``log_sigmoid_forward`` returns an empty buffer, as CUDA's kernel does; its backward recomputes from the
input. ``glu`` splits its dim into halves read as views; ``prelu``'s kernels get the weight already shaped to
broadcast (torch's composite ``prelu`` reshapes it) and return the weight's gradient per element, which
autograd sums to the weight's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import copies, memory
from tunecl.backend.dtypes import scalar_type_name
from tunecl.backend.ops.pointwise import new_like, run, run_out

_aten = torch.ops.aten


def log_sigmoid_forward_out(self: torch.Tensor, *, output: torch.Tensor, buffer: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    run_out("log_sigmoid", output, (self,))
    if buffer.numel():
        buffer.resize_((0,))
    return output, buffer


def log_sigmoid_forward(self: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return run("log_sigmoid", new_like(self), (self,)), memory.empty_contiguous((0,), self.dtype)


def log_sigmoid_backward_out(grad_output: torch.Tensor, self: torch.Tensor, buffer: torch.Tensor, *,
                             grad_input: torch.Tensor) -> torch.Tensor:
    return run_out("log_sigmoid_backward", grad_input, (grad_output, self))


def log_sigmoid_backward(grad_output: torch.Tensor, self: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    return run("log_sigmoid_backward", new_like(grad_output, torch.result_type(grad_output, self)),
               (grad_output, self))


def _halves(self: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The first half and the gate of ``glu`` along ``dim`` (torch's checks, from its meta kernel)."""
    _aten.glu.default(torch.empty(self.shape, dtype=self.dtype, device="meta"), dim)
    dim %= self.dim()
    half = self.shape[dim] // 2
    return self.narrow(dim, 0, half), self.narrow(dim, half, half), dim


def glu_out(self: torch.Tensor, dim: int = -1, *, out: torch.Tensor) -> torch.Tensor:
    first, gate, dim = _halves(self, dim)
    if out.shape != first.shape:
        out.resize_(first.shape)
    return run("glu", out, (first, gate))


def glu_backward_out(grad_output: torch.Tensor, self: torch.Tensor, dim: int, *,
                     grad_input: torch.Tensor) -> torch.Tensor:
    first, gate, dim = _halves(self, dim)
    if grad_input.shape != self.shape:
        grad_input.resize_(self.shape)
    half = first.shape[dim]
    run("glu", grad_input.narrow(dim, 0, half), (grad_output, gate))   # d/d first = grad * sigmoid(gate)
    run("glu_backward_gate", grad_input.narrow(dim, half, half), (grad_output, first, gate))
    return grad_input


def glu_backward(grad_output: torch.Tensor, self: torch.Tensor, dim: int) -> torch.Tensor:
    return glu_backward_out(grad_output, self, dim, grad_input=memory.empty_contiguous(self.shape, self.dtype))


def prelu_kernel(self: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    shape = torch.broadcast_shapes(self.shape, weight.shape)
    out = new_like(self) if shape == self.shape else memory.empty_contiguous(shape, self.dtype)
    return run("prelu", out, (self, weight))


def prelu_kernel_backward(grad_output: torch.Tensor, self: torch.Tensor, weight: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    shape = torch.broadcast_shapes(grad_output.shape, self.shape, weight.shape)
    grad_input = memory.empty_contiguous(shape, self.dtype)
    grad_weight = memory.empty_contiguous(shape, weight.dtype)
    run("prelu_backward_input", grad_input, (grad_output, self, weight))
    run("prelu_backward_weight", grad_weight, (grad_output, self))
    return grad_input, grad_weight


def _logit(eps: float | None) -> tuple[str, tuple[float, ...]]:
    return ("logit", ()) if eps is None else ("logit_eps", (eps, 1.0 - eps))


def logit_out(self: torch.Tensor, eps: float | None = None, *, out: torch.Tensor) -> torch.Tensor:
    """``logit`` (binary cross-entropy's gradient with respect to its target calls it), with torch's clamp to
    [eps, 1 - eps] when eps is given."""
    expr, params = _logit(eps)
    return run_out(expr, out, (self,), params)


def logit_backward_out(grad_output: torch.Tensor, self: torch.Tensor, eps: float | None = None, *,
                       grad_input: torch.Tensor) -> torch.Tensor:
    if eps is None:
        return run_out("logit_backward", grad_input, (grad_output, self))
    return run_out("logit_backward_eps", grad_input, (grad_output, self), (eps, 1.0 - eps))


def rrelu_with_noise_out(self: torch.Tensor, noise: torch.Tensor, lower: Any = 0.125, upper: Any = 1 / 3,
                         training: bool = False, generator: torch.Generator | None = None, *,
                         out: torch.Tensor) -> torch.Tensor:
    """``F.rrelu`` / ``nn.RReLU``: in training, each element at or below 0 is scaled by a slope drawn from
    U(lower, upper), which ``noise`` receives (1 elsewhere; torch's backward multiplies the gradient by it);
    in evaluation, ``leaky_relu`` with the mean slope and ``noise`` untouched.

    The slopes are CPU torch's: its kernel draws one double per non-positive element, in order, from the
    generator (``generator`` or the CPU default); here as many as there are elements are drawn on the host by
    the same distribution (a float64 ``uniform_`` between the float32 bounds) and uploaded, and the k-th
    non-positive element takes the k-th draw (its rank by a cumulative sum on the device, so no count is read
    back). The results equal the CPU's under one seed; the generator moves on by one draw per element (as
    CUDA's kernel draws per element), not per non-positive element."""
    if tuple(self.shape) != tuple(noise.shape):
        raise RuntimeError(f"noise tensor shape must match self tensor shape. Got self.shape = {list(self.shape)} "
                           f"noise.shape = {list(noise.shape)}")
    if not self.dtype.is_floating_point:
        raise NotImplementedError(f'"rrelu_with_noise_out_cpu" not implemented for '
                                  f"'{scalar_type_name(self.dtype)}'")
    if noise.dtype != self.dtype:
        raise RuntimeError(f"expected scalar type {scalar_type_name(self.dtype)} but found "
                           f"{scalar_type_name(noise.dtype)}")
    if not training:
        return run_out("leaky_relu", out, (self,), ((float(lower) + float(upper)) / 2,))
    if float(lower) > float(upper):
        raise RuntimeError("Expected from <= to to be true, but got false.")
    # the bounds rounded to float32, as the CPU kernel's opmath holds them
    low, high = (float(torch.tensor(float(v), dtype=torch.float32)) for v in (lower, upper))
    draws = torch.empty(self.numel(), dtype=torch.float64).uniform_(low, high, generator=generator)
    not_positive = self <= 0
    rank = not_positive.reshape(-1).cumsum(0).sub_(1).clamp_(min=0)
    slopes = copies.upload(draws.float()).index_select(0, rank).view(self.shape)   # float, as the CPU's opmath
    noise.copy_(torch.where(not_positive, slopes, 1.0))
    return out.copy_(torch.where(not_positive, self * slopes, self))


def _floating_result(self: torch.Tensor) -> torch.Tensor:
    return new_like(self, self.dtype if self.dtype.is_floating_point else torch.get_default_dtype())


KERNELS: dict[str, Callable[..., Any]] = {
    "logit": lambda self, eps=None: logit_out(self, eps, out=_floating_result(self)),
    "logit.out": logit_out,
    "logit_": lambda self, eps=None: run(_logit(eps)[0], self, (self,), _logit(eps)[1]),
    "logit_backward.grad_input": logit_backward_out,
    "log_sigmoid_forward": log_sigmoid_forward,
    "log_sigmoid_forward.output": log_sigmoid_forward_out,
    "log_sigmoid_backward": log_sigmoid_backward,
    "log_sigmoid_backward.grad_input": log_sigmoid_backward_out,
    "mish.out": lambda self, *, out: run_out("mish", out, (self,)),
    "glu.out": glu_out,
    "glu_backward": glu_backward,
    "glu_backward.grad_input": glu_backward_out,
    "_prelu_kernel": prelu_kernel,
    "_prelu_kernel_backward": prelu_kernel_backward,
    "rrelu_with_noise": lambda self, noise, lower=0.125, upper=1 / 3, training=False, generator=None:
        rrelu_with_noise_out(self, noise, lower, upper, training, generator, out=new_like(self)),
    "rrelu_with_noise.out": rrelu_with_noise_out,
    "rrelu_with_noise_": lambda self, noise, lower=0.125, upper=1 / 3, training=False, generator=None:
        rrelu_with_noise_out(self, noise, lower, upper, training, generator, out=self),
}
