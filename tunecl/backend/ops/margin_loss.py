"""``F.multi_margin_loss`` / ``nn.MultiMarginLoss`` (the multi-class hinge loss) on the device, forward and backward,
composed of device ops by torch's formula: for a sample of target class ``y``,
``sum over j != y of max(0, margin - x[y] + x[j]) ** p * weight[y] / C``, then the mean or sum over samples.

The target's score is gathered (an out-of-range target raises torch's IndexError at the next read from the
device); the backward gives each other class ``p * h ** (p - 1) * weight[y] / C`` of the output gradient where
its hinge ``h`` is positive, and the target class minus their sum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import copies

_REDUCTIONS = ("none", "mean", "sum")


def _check(self: torch.Tensor, target: torch.Tensor, p: Any, weight: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """self as (N, C) and target as (N, 1), after torch's checks."""
    if p not in (1, 2):
        raise RuntimeError("only p == 1 and p == 2 supported")
    if self.dim() > 2 or (self.dim() == 2 and self.shape[1] == 0):
        raise RuntimeError(f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
                           f"{list(self.shape)}")
    rows = self.reshape(1, -1) if self.dim() <= 1 else self
    if target.numel() != rows.shape[0] or target.dim() > 1:
        raise RuntimeError(f"multi_margin_loss: target tensor should be 1-D with size equal to the number of input "
                           f"samples (batch size). Expected target size [{rows.shape[0]}], but got "
                           f"{list(target.shape)}. Input has shape {list(self.shape)}.")
    if weight is not None and (weight.dim() > 1 or weight.numel() != rows.shape[1]):
        raise RuntimeError(f"inconsistent weight size, expected {rows.shape[1]} but got {list(weight.shape)}")
    return rows, target.reshape(-1, 1).long()


def _hinges(rows: torch.Tensor, target: torch.Tensor, margin: Any) -> torch.Tensor:
    """max(0, margin - x[y] + x[j]) for every class j, 0 at j = y."""
    hinge = (margin - rows.gather(1, target) + rows).clamp_min(0)
    return hinge.scatter(1, target, 0.0)


def _class_weights(rows: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor | float:
    return 1.0 / rows.shape[1] if weight is None else weight.index_select(0, target.view(-1)).unsqueeze(1) / \
        rows.shape[1]


def multi_margin_loss(self: torch.Tensor, target: torch.Tensor, p: Any = 1, margin: Any = 1,
                      weight: torch.Tensor | None = None, reduction: int = 1) -> torch.Tensor:
    rows, target = _check(self, target, p, weight)
    hinge = _hinges(rows, target, margin)
    each = ((hinge if p == 1 else hinge * hinge) * _class_weights(rows, target, weight)).sum(1)
    mode = _REDUCTIONS[reduction]
    if mode == "none":
        return each.reshape(target.shape[0]) if self.dim() == 2 else each.reshape(())
    return each.mean() if mode == "mean" else each.sum()


def multi_margin_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor, p: Any,
                               margin: Any, weight: torch.Tensor | None = None, reduction: int = 1) -> torch.Tensor:
    rows, target = _check(self, target, p, weight)
    hinge = _hinges(rows, target, margin)
    slope = (hinge > 0).to(rows.dtype) if p == 1 else 2 * hinge
    scale = grad_output.reshape(-1, 1) if _REDUCTIONS[reduction] == "none" else grad_output
    if _REDUCTIONS[reduction] == "mean":
        scale = scale / rows.shape[0]
    each = slope * _class_weights(rows, target, weight) * scale
    grad = each.scatter(1, target, -each.sum(1, keepdim=True))
    return grad.reshape(self.shape)


KERNELS: dict[str, Callable[..., Any]] = {
    "multi_margin_loss": multi_margin_loss,
    "multi_margin_loss.out": copies.out_overload(multi_margin_loss),
    "multi_margin_loss_backward": multi_margin_loss_backward,
    "multi_margin_loss_backward.grad_input": copies.out_overload(multi_margin_loss_backward, "grad_input"),
}
