"""Pairwise p-norm distances (``torch.cdist`` where torch does not use its matrix-product form: small sets,
p other than 2, ``compute_mode="donot_use_mm_for_euclid_dist"``), forward and backward, composed of device ops
over the (..., P, R, M) differences, with torch's rules for each p (its backward's special cases at zero
distance and for p 0, 1, below 2, 2 and infinity)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch


def _check(x1: torch.Tensor, x2: torch.Tensor, p: float) -> None:
    if x1.dim() < 2 or x2.dim() < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: {x1.dim()}D X2 got: {x2.dim()}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    if not (x1.dtype.is_floating_point and x2.dtype.is_floating_point):
        raise RuntimeError(f"cdist only supports floating-point dtypes, X1 got: {x1.dtype}")


def _differences(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """x1[..., p, :] - x2[..., r, :] for every p and r, batch dims broadcast: (..., P, R, M)."""
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    a = x1.expand(*batch, *x1.shape[-2:])
    b = x2.expand(*batch, *x2.shape[-2:])
    return a.unsqueeze(-2) - b.unsqueeze(-3)


def cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None = None) -> torch.Tensor:
    _check(x1, x2, p)
    diff = _differences(x1, x2)
    if p == 0:
        return (diff != 0).sum(-1).to(diff.dtype)
    return torch.linalg.vector_norm(diff, p, dim=-1)


def cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float,
                   cdist: torch.Tensor) -> torch.Tensor:
    """The gradient with respect to x1 (torch calls it with the operands swapped for x2's)."""
    if p == 0 or not grad.numel() or not x1.numel() or not x2.numel():
        return torch.zeros_like(x1)
    diff = _differences(x1, x2)
    g = grad.unsqueeze(-1)
    dist = cdist.unsqueeze(-1)
    zero = torch.zeros((), dtype=diff.dtype, device=diff.device)
    if p == 1:
        each = g * diff.sign()
    elif p == 2:
        each = torch.where(dist == 0, zero, g * diff / dist)
    elif math.isinf(p):
        each = g * diff.sign() * (diff.abs() == dist)
    elif p < 2:
        vanish = (dist == 0) | ((diff == 0) & (p < 1))
        each = torch.where(vanish, zero, diff.sign() * diff.abs().pow(p - 1) * g / dist.pow(p - 1))
    else:
        each = torch.where(dist == 0, zero, diff * diff.abs().pow(p - 2) * g / dist.pow(p - 1))
    result = each.sum(-2)
    return result.reshape(x1.shape) if result.shape == x1.shape else result.sum_to_size(x1.shape)


KERNELS: dict[str, Callable[..., Any]] = {
    "_cdist_forward": cdist_forward,
    "_cdist_backward": cdist_backward,
}
