"""``nll_loss2d`` (segmentation losses: an (N, C, H, W) input, (N, H, W) targets) on the device: the input
read as N * H * W rows of C classes (a channels-last copy) through the 1-d ``nll_loss`` kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import copies, memory

_NONE = 0   # torch's Reduction::None


def _check(self: torch.Tensor, target: torch.Tensor) -> None:
    if self.dim() != 4:
        raise RuntimeError(f"nll_loss2d: input must be 4-d (N, C, H, W), got sizes {list(self.shape)}")
    if target.dim() != 3:
        raise RuntimeError(f"nll_loss2d: only batches of spatial targets supported (3-d tensors), got targets "
                           f"of sizes {list(target.shape)}")
    n, _, h, w = self.shape
    if list(target.shape) != [n, h, w]:
        raise RuntimeError(f"nll_loss2d: input sizes {list(self.shape)} do not match target sizes "
                           f"{list(target.shape)}")


def _rows(self: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = self.shape[1]
    return self.permute(0, 2, 3, 1).reshape(-1, c), target.reshape(-1)


def nll_loss2d_forward(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                       ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    _check(self, target)
    rows, labels = _rows(self, target)
    output, total_weight = torch.ops.aten.nll_loss_forward(rows, labels, weight, reduction, ignore_index)
    if reduction == _NONE:
        output = output.view(target.shape)
    return output, total_weight


def nll_loss2d_forward_output(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                              reduction: int, ignore_index: int, *, output: torch.Tensor,
                              total_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    result, weight_sum = nll_loss2d_forward(self, target, weight, reduction, ignore_index)
    return copies.copy_from_and_resize(result, output), copies.copy_from_and_resize(weight_sum, total_weight)


def nll_loss2d_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                        weight: torch.Tensor | None, reduction: int, ignore_index: int,
                        total_weight: torch.Tensor) -> torch.Tensor:
    _check(self, target)
    rows, labels = _rows(self, target)
    grad = grad_output.reshape(-1) if reduction == _NONE else grad_output
    grad_rows = torch.ops.aten.nll_loss_backward(grad, rows, labels, weight, reduction, ignore_index, total_weight)
    n, c, h, w = self.shape
    out = memory.empty_contiguous(self.shape, grad_rows.dtype)
    copies.device_copy(out, grad_rows.view(n, h, w, c).permute(0, 3, 1, 2))
    return out


def nll_loss2d_backward_grad_input(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                                   weight: torch.Tensor | None, reduction: int, ignore_index: int,
                                   total_weight: torch.Tensor, *, grad_input: torch.Tensor) -> torch.Tensor:
    return copies.copy_from_and_resize(nll_loss2d_backward(grad_output, self, target, weight, reduction,
                                                           ignore_index, total_weight), grad_input)


KERNELS: dict[str, Callable[..., Any]] = {
    "nll_loss2d_forward": nll_loss2d_forward,
    "nll_loss2d_forward.output": nll_loss2d_forward_output,
    "nll_loss2d_backward": nll_loss2d_backward,
    "nll_loss2d_backward.grad_input": nll_loss2d_backward_grad_input,
}
