"""Convolution: the two ``*_overrideable`` ops torch routes PrivateUse1 convolutions through.

Their default kernels only raise "not implemented", so they must be registered even before a device
algorithm exists. For now both adapters run torch's CPU convolution *explicitly*, counted and
governed as a fallback (``TUNECL_FALLBACK=error`` raises). Replace :func:`convolution` and
:func:`convolution_backward` with plan-based versions when the conv families land.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tunecl.backend import fallback

aten = torch.ops.aten


def convolution(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
                groups: int) -> torch.Tensor:
    """``aten::convolution_overrideable`` — CPU route until a conv algorithm serves it."""
    return fallback.run_on_cpu(aten.convolution.default, (input, weight, bias, stride, padding, dilation,
                                                          transposed, output_padding, groups), {},
                               name="aten::convolution_overrideable", reason="no OpenCL conv algorithm yet")


def convolution_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                         stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                         output_padding: Sequence[int], groups: int, output_mask: Sequence[bool]):
    """``aten::convolution_backward_overrideable`` — CPU route until a conv algorithm serves it."""
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
    return fallback.run_on_cpu(aten.convolution_backward.default,
                               (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                output_padding, groups, output_mask), {},
                               name="aten::convolution_backward_overrideable", reason="no OpenCL conv algorithm yet")


KERNELS = {
    "convolution_overrideable": convolution,
    "convolution_backward_overrideable": convolution_backward,
}
