"""Reflection and replication padding (``F.pad(mode="reflect" | "replicate")``, ``nn.ReflectionPad2d``, ...),
1-, 2- and 3-d, forward and backward, on the device.

Both pad each of the last one to three dims by an index map: output position j along a dim reads input
position ``map[j]``. The maps are CPU torch's own, read off its kernel run on ``arange(n)`` (negative
padding crops, as in torch), and torch's shape checks and errors come from its meta kernel on the input's
shape. The forward is one ``index_select`` per padded dim (float16 moved bit for bit); the backward
sums each gradient element into the position it was read from, one ``index_add`` per padded dim (float32
sums, float16 gradients summed in float32 and rounded once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import copies
from tunecl.backend.ops.device_tables import DeviceTables
from tunecl.backend.ops.indexing import index_select

_aten = torch.ops.aten
_maps = DeviceTables(512)   # (mode, size, before, after) -> the index map


def _index_map(mode: str, size: int, before: int, after: int, device: torch.device) -> torch.Tensor:
    def make() -> torch.Tensor:
        positions = torch.arange(size, dtype=torch.float64).view(1, size)
        read = getattr(_aten, f"{mode}_pad1d").default(positions, [before, after])
        return read.view(-1).to(torch.int64)
    return _maps.get((mode, size, before, after), device, make)


def _padded_dims(self: torch.Tensor, padding: Sequence[int]) -> list[tuple[int, int, int]]:
    """(dim, before, after) of each dim the padding changes: the last dim takes padding[0:2], the one before
    it padding[2:4], ..."""
    return [(self.dim() - 1 - k, padding[2 * k], padding[2 * k + 1]) for k in range(len(padding) // 2)
            if padding[2 * k] or padding[2 * k + 1]]


def _forward(mode: str, dims: int) -> Callable[..., torch.Tensor]:
    check = getattr(_aten, f"{mode}_pad{dims}d").default

    def kernel(self: torch.Tensor, padding: Sequence[int]) -> torch.Tensor:
        check(torch.empty(self.shape, dtype=self.dtype, device="meta"), padding)   # torch's checks and errors
        out = self
        for dim, before, after in _padded_dims(self, padding):
            out = index_select(out, dim, _index_map(mode, self.shape[dim], before, after, self.device))
        return out if out is not self else self.clone()
    return kernel


def _backward(mode: str, dims: int) -> Callable[..., torch.Tensor]:
    check = getattr(_aten, f"{mode}_pad{dims}d_backward").default

    def kernel(grad_output: torch.Tensor, self: torch.Tensor, padding: Sequence[int]) -> torch.Tensor:
        check(torch.empty(grad_output.shape, dtype=grad_output.dtype, device="meta"),
              torch.empty(self.shape, dtype=self.dtype, device="meta"), padding)
        grad = grad_output if grad_output.dtype == torch.float32 else grad_output.float()
        for dim, before, after in _padded_dims(self, padding):
            shape = list(grad.shape)
            shape[dim] = self.shape[dim]
            grad = torch.zeros(shape, dtype=grad.dtype, device=grad.device).index_add_(
                dim, _index_map(mode, self.shape[dim], before, after, self.device), grad)
        if grad is grad_output:
            grad = grad.clone()
        return grad if grad.dtype == grad_output.dtype else grad.to(grad_output.dtype)
    return kernel


KERNELS: dict[str, Callable[..., Any]] = {}
for _mode in ("reflection", "replication"):
    for _dims in (1, 2, 3):
        _name = f"{_mode}_pad{_dims}d"
        KERNELS[_name] = _forward(_mode, _dims)
        KERNELS[f"{_name}.out"] = copies.out_overload(KERNELS[_name])
        KERNELS[f"{_name}_backward"] = _backward(_mode, _dims)
        KERNELS[f"{_name}_backward.grad_input"] = copies.out_overload(KERNELS[f"{_name}_backward"], "grad_input")
