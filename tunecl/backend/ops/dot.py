"""``dot`` of two 1-d tensors on the device: the elementwise product summed by the reduction kernels
(in the vectors' dtype, as torch's dot returns it; its gradient is two products, also on the device)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def dot(self: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    if self.dim() != 1 or tensor.dim() != 1:
        raise RuntimeError(f"dot: 1D tensors expected, but got {self.dim()}D and {tensor.dim()}D tensors")
    if self.numel() != tensor.numel():
        raise RuntimeError(f"dot: inconsistent tensor size, {self.numel()} and {tensor.numel()} elements")
    if self.dtype != tensor.dtype:
        raise RuntimeError(f"dot: expected both vectors to have same dtype, but found {self.dtype} and "
                           f"{tensor.dtype}")
    return torch.sum(torch.mul(self, tensor), dtype=self.dtype)


KERNELS: dict[str, Callable[..., Any]] = {
    "dot": dot,
}
