"""``torch.unique`` and ``torch.unique_consecutive``, with and without ``dim``, on the device, composed of device
ops.

The elements are flattened and, for ``unique``, sorted stably. An element starts a new group where it differs
from the one before it, so NaNs stay distinct, as on the CPU, and keep their order. Then:

- the values are the group starts (``masked_select``; its count is the one read from the device);
- the inverse is each element's group number (a ``cumsum`` of the starts), scattered back through the sort;
- the counts are a ``bincount`` of the group numbers.

The values always come sorted, which ``sorted=False`` allows (torch's CUDA kernel sorts too).

With ``dim`` the same runs over the slices along it: a slice starts a group where any of its elements differs
from the slice before it, and ``unique`` orders the slices lexicographically first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import operands
from tunecl.errors import Unsupported


def _slices(self: torch.Tensor, dim: int) -> torch.Tensor:
    """The slices of ``self`` along ``dim`` as the rows of a 2-d tensor; torch's errors for zero-sized dims."""
    if self.dim() == 0:
        raise IndexError(f"Dimension out of range (expected to be in range of [-1, 0], but got {dim})")
    dim = operands.wrapped_dim(dim, self.dim())
    zero_sized = list(self.shape).count(0)
    if self.shape[dim] == 0 and zero_sized > 1:
        raise RuntimeError("Number of zero sized dimensions is more than one, so unique cannot be applied ")
    if self.shape[dim] and zero_sized:
        raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
    moved = self.movedim(dim, 0)
    return moved.reshape(moved.shape[0], math.prod(moved.shape[1:]))


def _grouped(self: torch.Tensor, dim: int, order: torch.Tensor | None, rows: torch.Tensor, return_inverse: bool,
             return_counts: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Values, inverse and counts of the slices of ``self`` along ``dim``, given as the 2-d ``rows`` in the order
    to group them: ``order`` maps each row to the slice it came from (None: the same)."""
    device = self.device
    starts = torch.ones(rows.shape[0], dtype=torch.bool, device=device)
    if rows.shape[0] > 1 and rows.shape[1]:
        torch.any(torch.ne(rows[1:], rows[:-1]), 1, out=starts[1:])
    elif rows.shape[0] > 1:
        starts[1:] = False   # slices of no elements are all equal
    keep = torch.nonzero(starts).view(-1)
    picked = keep if order is None else order.index_select(0, keep)
    values = self.index_select(dim, picked)
    group = torch.cumsum(starts, 0) - 1
    inverse = torch.empty(0, dtype=torch.int64, device=device)
    if return_inverse:
        inverse = group if order is None else torch.empty_like(group).scatter_(0, order, group)
    counts = torch.bincount(group, minlength=keep.numel()) if return_counts else \
        torch.empty(0, dtype=torch.int64, device=device)
    return values, inverse, counts


def _grouped_elements(self: torch.Tensor, order: torch.Tensor | None, flat: torch.Tensor, return_inverse: bool,
                      return_counts: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_grouped` of the elements of ``self``, given flattened in the order to group them as ``flat``; the
    inverse takes ``self``'s shape."""
    values, inverse, counts = _grouped(self.reshape(-1), 0, order, flat.view(-1, 1), return_inverse, return_counts)
    return values, inverse.view(self.shape) if return_inverse else inverse, counts


def unique2(self: torch.Tensor, sorted: bool = True, return_inverse: bool = False,
            return_counts: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ordered, order = torch.sort(self.reshape(-1), stable=True)
    return _grouped_elements(self, order, ordered, return_inverse, return_counts)


def unique(self: torch.Tensor, sorted: bool = True,
           return_inverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    values, inverse, _ = unique2(self, sorted, return_inverse, False)
    return values, inverse


_MAX_SORTED_COLUMNS = 64


def unique_dim(self: torch.Tensor, dim: int, sorted: bool = True, return_inverse: bool = False,
               return_counts: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unique slices along ``dim``, in lexicographic order: one stable sort of the row order per column, from
    the last column to the first (up to 64 columns; wider slices run on the CPU fallback)."""
    rows = _slices(self, dim)
    if rows.dtype == torch.float16:   # ordered and compared the same in float32, and gathered there
        rows = rows.float()
    if rows.shape[1] > _MAX_SORTED_COLUMNS:
        raise Unsupported(f"unique along a dim whose slices hold {rows.shape[1]} elements")
    order = torch.arange(rows.shape[0], device=self.device)
    for column in reversed(range(rows.shape[1])):
        _, within = torch.sort(rows[:, column].index_select(0, order), stable=True)
        order = order.index_select(0, within)
    return _grouped(self, operands.wrapped_dim(dim, self.dim()), order, rows.index_select(0, order),
                    return_inverse, return_counts)


def unique_consecutive(self: torch.Tensor, return_inverse: bool = False, return_counts: bool = False,
                       dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if dim is None:
        return _grouped_elements(self, None, self.reshape(-1), return_inverse, return_counts)
    return _grouped(self, operands.wrapped_dim(dim, max(self.dim(), 1)), None, _slices(self, dim), return_inverse,
                    return_counts)


KERNELS: dict[str, Callable[..., Any]] = {
    "_unique2": unique2,
    "_unique": unique,
    "unique_consecutive": unique_consecutive,
    "unique_dim": unique_dim,
}
