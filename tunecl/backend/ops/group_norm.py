"""Group norm's backward on the device.

The forward needs no kernel of its own: torch's composite ``native_group_norm`` (redispatched in
:mod:`tunecl.backend.ops.nn`) runs it on the device's batch-norm and pointwise kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import half, memory, state
from tunecl.backend.operands import operand
from tunecl.errors import Unsupported


def native_group_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                               weight: torch.Tensor | None, N: int, C: int, HxW: int, group: int,
                               output_mask: Sequence[bool]):
    """Group norm's (grad_input, grad_weight, grad_bias), those ``output_mask`` asks for (else None), in
    float32 (float16 tensors through float32 copies, the results rounded back)."""
    half.check(grad_out, input, mean, rstd, weight)
    if group <= 0 or C % group:
        raise RuntimeError(f"native_group_norm_backward: {C} channels do not split into {group} groups")
    if input.numel() != N * C * HxW or grad_out.shape != input.shape:
        raise RuntimeError(f"native_group_norm_backward: an input of sizes {list(input.shape)} and a gradient "
                           f"of {list(grad_out.shape)} for N={N}, C={C}, HxW={HxW}")
    if mean.numel() != N * group or rstd.numel() != N * group or (weight is not None and weight.numel() != C):
        raise Unsupported("group norm backward with statistics or a weight of unexpected sizes")
    x, dy = half.to_float32(input), half.to_float32(grad_out)
    mu, inv, w = half.to_float32(mean), half.to_float32(rstd), half.to_float32(weight)
    param_dtype = input.dtype if weight is None else weight.dtype
    grad_input = memory.empty_contiguous(input.shape, torch.float32) if output_mask[0] else None
    grad_weight = memory.empty_contiguous([C], torch.float32) if output_mask[1] else None
    grad_bias = memory.empty_contiguous([C], torch.float32) if output_mask[2] else None
    ds, db = (memory.empty_contiguous([N * C], torch.float32) for _ in range(2))
    c2, c3 = (memory.empty_contiguous([N * group], torch.float32) for _ in range(2))
    state.get().group_norm.backward(N, C, HxW, group, operand(x), operand(dy), operand(mu), operand(inv),
                                    None if w is None else operand(w),
                                    *(None if t is None else operand(t) for t in (grad_input, grad_weight,
                                                                                  grad_bias)),
                                    operand(ds), operand(db), operand(c2), operand(c3))
    return (None if grad_input is None else half.cast(grad_input, input.dtype),
            None if grad_weight is None else half.cast(grad_weight, param_dtype),
            None if grad_bias is None else half.cast(grad_bias, param_dtype))


KERNELS: dict[str, Callable[..., Any]] = {
    "native_group_norm_backward": native_group_norm_backward,
}
