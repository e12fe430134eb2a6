"""Kernels on ``AutogradPrivateUse1`` for CompositeImplicitAutograd ops: where the decomposition would
make a tensor the device does not store, or costs host time for nothing. They call differentiable ops, so
autograd records what they run.

``_batch_norm_impl_index`` (what ``batch_norm`` calls) gives an empty input statistics of the
accumulate type of its dtype, which for float32 on every device but CUDA's is float64: here they are of
the input's dtype (they are uninitialised and unused, as in torch). A non-empty input takes torch's
composite kernel.

``batch_norm`` (what ``F.batch_norm`` and the ``BatchNorm`` modules call) goes straight to
``native_batch_norm`` when its arguments pass the composite's checks (a non-empty input of at least 2 dims,
every given parameter and statistic of one element per channel, the running statistics given in
evaluation): torch's route through ``_batch_norm_impl_index`` gives the same output, after a second trip
through Python and an allocation of a reserve tensor that ``batch_norm`` drops (about 20 µs per call). Any
other call takes that route, which raises torch's own errors.

``hardtanh_`` (``ReLU6(inplace=True)``, ``F.relu6(x, inplace=True)``, ``Hardtanh(inplace=True)``) where
autograd records it: torch's formula reads the input, so autograd first clones the input to keep it, a
copy of the activations and one allocation per call. Its backward here reads the result instead, which
gives the same mask: ``min < input < max`` exactly where ``min < hardtanh(input) < max`` (a NaN stays NaN,
and is passed or not alike). Without the clone the in-place op also reaches the launch that produced its
input while that launch is still held, so relu6 after a batch norm folds into the batch norm's launch in
training as it does in inference. On a traced tensor (``torch.compile``: fake and functional tensors) the
input is kept as torch keeps it, so compiled graphs are the ones torch's own formula gives. On plain tensors
the op and its backward call the device kernels directly (:mod:`tunecl.backend.direct_calls`), not through
the dispatcher a second time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import direct_calls

_batch_norm_impl_index = torch.ops.aten._batch_norm_impl_index.default
_native_batch_norm = torch.ops.aten.native_batch_norm.default


def batch_norm_impl_index(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                          running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
                          momentum: float, eps: float, cudnn_enabled: bool) -> tuple:
    if input.numel():
        return _batch_norm_impl_index.decompose(input, weight, bias, running_mean, running_var, training,
                                                momentum, eps, cudnn_enabled)
    features = input.shape[1] if input.dim() > 1 else 1
    out = input.clone()
    if weight is not None:
        out = out * weight[0]
    if bias is not None:
        out = out + bias[0]
    return out, input.new_empty((features,)), input.new_empty((features,)), input.new_empty((0,), dtype=torch.uint8), 0


def batch_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
               momentum: float, eps: float, cudnn_enabled: bool) -> torch.Tensor:
    if input.dim() >= 2 and input.numel() and (training or (running_mean is not None and running_var is not None)):
        features = input.shape[1]
        if all(t is None or t.numel() == features for t in (weight, bias, running_mean, running_var)):
            return _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[0]
    return batch_norm_impl_index(input, weight, bias, running_mean, running_var, training, momentum, eps,
                                 cudnn_enabled)[0]


_hardtanh_ = torch.ops.aten.hardtanh_.default
_hardtanh_backward = torch.ops.aten.hardtanh_backward.default


class _HardtanhInPlace(torch.autograd.Function):
    """``hardtanh_`` recorded with a backward that reads the result (``keep_input`` False) or a copy of the
    input made before it is overwritten (True, torch's formula)."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, min_val: float, max_val: float,
                keep_input: bool) -> torch.Tensor:
        kept = input.clone() if keep_input else None
        _below_autograd_hardtanh_(input, min_val, max_val)   # (grad mode is off here)
        ctx.mark_dirty(input)
        ctx.save_for_backward(kept if keep_input else input)
        ctx.bounds = (min_val, max_val)
        return input

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        (mask_source,) = ctx.saved_tensors
        if not torch.is_grad_enabled() and direct_calls.plain(grad, mask_source):
            return direct_calls.kernels["hardtanh_backward"](grad, mask_source, *ctx.bounds), None, None, None
        return _hardtanh_backward(grad, mask_source, *ctx.bounds), None, None, None


def hardtanh_(self: torch.Tensor, min_val: float = -1, max_val: float = 1) -> torch.Tensor:
    if torch.is_grad_enabled() and self.requires_grad:
        traced = type(self) not in (torch.Tensor, torch.nn.Parameter)
        return _HardtanhInPlace.apply(self, min_val, max_val, traced)
    return _below_autograd_hardtanh_(self, min_val, max_val)


def _below_autograd_hardtanh_(self: torch.Tensor, min_val: float, max_val: float) -> torch.Tensor:
    """``hardtanh_`` below autograd: the device kernel called directly where nothing in between sees the
    call (:func:`direct_calls.plain`; the version bump is the one the dispatcher would make), else through
    the dispatcher."""
    if direct_calls.plain(self):
        result = direct_calls.kernels["hardtanh_"](self, min_val, max_val)
        direct_calls.bump_version((self,))
        return result
    with torch._C._AutoDispatchBelowAutograd():
        return _hardtanh_(self, min_val, max_val)


AUTOGRAD_KERNELS: dict[str, Callable[..., Any]] = {
    "_batch_norm_impl_index": batch_norm_impl_index,
    "batch_norm": batch_norm,
    "hardtanh_": hardtanh_,
}
