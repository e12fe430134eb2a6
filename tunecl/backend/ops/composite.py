"""Kernels on ``AutogradPrivateUse1`` for CompositeImplicitAutograd ops whose decomposition would make a
tensor the device does not store; they call differentiable ops, so autograd records what they run.

``_batch_norm_impl_index`` (what ``batch_norm`` calls) gives an empty input statistics of the
accumulate type of its dtype, which for float32 on every device but CUDA's is float64: here they are of
the input's dtype (they are uninitialised and unused, as in torch). A non-empty input takes torch's
composite kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_batch_norm_impl_index = torch.ops.aten._batch_norm_impl_index.default


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


AUTOGRAD_KERNELS: dict[str, Callable[..., Any]] = {
    "_batch_norm_impl_index": batch_norm_impl_index,
}
