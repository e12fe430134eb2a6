"""``sort`` (stable or not: always stable here, ties in input order), ``topk`` (the first k of a sort,
so ``sorted=False`` gets them sorted too) along any dim, for every device dtype (NaN sorts as the largest
value, as in torch), and ``isin`` by binary search in the sorted test elements."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend import copies, memory, state
from tunecl.backend.operands import operand, wrapped_dim
from tunecl.backend.ops.scan import split_lines
from tunecl.errors import Unsupported
from tunecl.kernels.ops.sort import padded
from tunecl.kernels.strided import Operand


def _sorted_into(self: torch.Tensor, dim: int, descending: bool, keep: int, values: torch.Tensor,
                 indices: torch.Tensor) -> None:
    """The first ``keep`` of each sorted line of ``self`` along ``dim`` into ``values`` and ``indices``
    (already of the result's shape)."""
    length = self.shape[dim]
    shape = list(self.shape)
    found = split_lines(shape, dim, [self.stride(), values.stride(), indices.stride()])
    targets = values, indices
    if found is None:   # batch dims that do not merge into two: through contiguous copies
        self = copies.contiguous_on_device(self)
        targets = tuple(memory.empty_contiguous(list(t.shape), t.dtype) for t in (values, indices))
        found = split_lines(shape, dim, [self.stride(), targets[0].stride(), targets[1].stride()])
    lines, (src_ab, val_ab, ind_ab) = found
    slots = lines[0] * lines[1] * padded(length)
    keys = memory.empty_contiguous([slots], torch.float32 if self.is_floating_point() else torch.int64)
    pos = memory.empty_contiguous([slots], torch.int64)

    def strided(t: torch.Tensor, ab: list[int]) -> Operand:
        o = operand(t)
        return Operand(o.buffer, o.offset, (t.stride(dim), *ab), o.dtype)

    state.get().sort.sort(length, (lines[0], lines[1]), strided(self, src_ab), strided(targets[0], val_ab),
                          strided(targets[1], ind_ab), operand(keys), operand(pos), descending, keep)
    for target, out in zip(targets, (values, indices)):
        if target is not out:
            copies.device_copy(out, target)


def _prepare(self: torch.Tensor, dim: int, size: int, values: torch.Tensor, indices: torch.Tensor,
             what: str) -> int:
    rank = max(self.dim(), 1)
    if not -rank <= dim < rank:
        raise IndexError(f"{what}: dim {dim} is out of range for a {self.dim()}-d tensor")
    if values.dtype != self.dtype or indices.dtype != torch.int64:
        raise RuntimeError(f"{what}: out tensors must be {self.dtype} and int64, got {values.dtype} and "
                           f"{indices.dtype}")
    shape = list(self.shape)
    if self.dim():
        shape[dim % rank] = size
    for t in (values, indices):
        if list(t.shape) != shape:
            t.resize_(shape)
    return dim % rank


def sort_values_stable(self: torch.Tensor, *, stable: bool | None = None, dim: int = -1, descending: bool = False,
                       values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dim = _prepare(self, dim, self.shape[dim] if self.dim() else 1, values, indices, "sort")
    if self.dim() == 0:
        copies.device_copy(values, self)
        state.get().pointwise("fill", (), operand(indices), (), (0,))
    elif self.numel():
        _sorted_into(self, dim, descending, self.shape[dim], values, indices)
    return values, indices


def topk_values(self: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, *,
                values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    length = self.shape[dim] if self.dim() else 1
    if not 0 <= k <= length:
        raise RuntimeError(f"topk: k ({k}) is out of range for a dim of size {length}")
    dim = _prepare(self, dim, k, values, indices, "topk")
    if self.dim() == 0:
        if k:
            copies.device_copy(values, self)
            state.get().pointwise("fill", (), operand(indices), (), (0,))
    elif values.numel():
        _sorted_into(self, dim, largest, k, values, indices)
    return values, indices


def kthvalue_values(self: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False, *, values: torch.Tensor,
                    indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The k-th smallest along ``dim`` and its index: the last of the k smallest, as topk orders them."""
    dim = wrapped_dim(dim, self.dim())
    if not 1 <= k <= (self.shape[dim] if self.dim() else 1):
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {dim}")
    smallest = torch.topk(self, k, dim, largest=False, sorted=True)
    if self.dim() == 0:
        kth_values, kth_indices = smallest.values, smallest.indices
    else:
        kth_values = smallest.values.narrow(dim, k - 1, 1)
        kth_indices = smallest.indices.narrow(dim, k - 1, 1)
        if not keepdim:
            kth_values, kth_indices = kth_values.squeeze(dim), kth_indices.squeeze(dim)
    return copies.copy_from_and_resize(kth_values, values), copies.copy_from_and_resize(kth_indices, indices)


def _select_along(name: str, self: torch.Tensor, dim: int, keepdim: bool,
                  select: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, index) of a selection along ``dim`` (median, nanmedian, mode): a 0-dim tensor is its own, an empty
    dim torch's IndexError; ``select(dim)`` gives them with ``dim`` kept at size 1, squeezed unless ``keepdim``."""
    dim = wrapped_dim(dim, self.dim())
    if self.dim() == 0:
        return self.clone(), torch.zeros((), dtype=torch.int64, device=self.device)
    if not self.shape[dim]:
        raise IndexError(f"{name}(): Expected reduction dim {dim} to have non-zero size.")
    value, index = select(dim)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


def _of_everything(self: torch.Tensor, op: Callable[..., Any]) -> torch.Tensor:
    """``op`` (torch.median or torch.nanmedian) over all elements; NaN of no elements."""
    if not self.numel():
        return torch.full((), float("nan"), dtype=self.dtype, device=self.device)
    return op(self.reshape(-1), 0).values


def median_dim_values(self: torch.Tensor, dim: int, keepdim: bool = False, *, values: torch.Tensor,
                      indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The lower median along ``dim`` and its index, as torch gives them: a row with NaN has NaN, at its first
    NaN's index."""
    def select(dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        ordered = torch.sort(self, dim)
        middle = (self.shape[dim] - 1) // 2
        value = ordered.values.narrow(dim, middle, 1)
        index = ordered.indices.narrow(dim, middle, 1)
        if self.dtype.is_floating_point:
            missing = torch.isnan(self)
            has_nan = missing.any(dim, keepdim=True)
            value = torch.where(has_nan, torch.full((), float("nan"), dtype=self.dtype, device=self.device), value)
            index = torch.where(has_nan, missing.to(torch.float32).argmax(dim, keepdim=True), index)
        return value, index
    value, index = _select_along("median", self, dim, keepdim, select)
    return copies.copy_from_and_resize(value, values), copies.copy_from_and_resize(index, indices)


def median(self: torch.Tensor) -> torch.Tensor:
    """The lower median of all elements (NaN with any NaN, or of no elements)."""
    return _of_everything(self, torch.median)


def nanmedian_dim_values(self: torch.Tensor, dim: int, keepdim: bool = False, *, values: torch.Tensor,
                         indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The lower median along ``dim`` of the elements that are not NaN, and its index; a row of NaNs only has
    NaN, at its first index. The sort puts NaNs last, so the median sits at (count - 1) // 2 of the rest."""
    def select(dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        ordered = torch.sort(self, stable=True, dim=dim)
        count = (~torch.isnan(self)).sum(dim, keepdim=True) if self.dtype.is_floating_point else \
            torch.full((), self.shape[dim], dtype=torch.int64, device=self.device)
        middle = torch.div((count - 1).clamp(min=0), 2, rounding_mode="floor").expand(
            *self.shape[:dim], 1, *self.shape[dim + 1:])
        return ordered.values.gather(dim, middle), ordered.indices.gather(dim, middle)
    value, index = _select_along("nanmedian", self, dim, keepdim, select)
    return copies.copy_from_and_resize(value, values), copies.copy_from_and_resize(index, indices)


def nanmedian(self: torch.Tensor) -> torch.Tensor:
    """The lower median of the elements that are not NaN (NaN if there are none)."""
    return _of_everything(self, torch.nanmedian)


def mode(self: torch.Tensor, dim: int = -1, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The most frequent value along ``dim`` (the smallest of equally frequent ones) and the index of its last
    occurrence, as torch's CPU kernel gives them. A stable sort makes each value a run, ending at its last
    occurrence; each element's run size comes from a ``bincount`` of (row, run) numbers, and one integer key
    per element (size first, then earlier runs, then later elements) picks the run's last element by ``max``."""
    def select(dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        length = self.shape[dim]
        rows = self.movedim(dim, -1).reshape(-1, length)
        ordered, order = torch.sort(rows, stable=True, dim=-1)
        starts = torch.ones(ordered.shape, dtype=torch.bool, device=self.device)
        if length > 1:
            torch.ne(ordered[:, 1:], ordered[:, :-1], out=starts[:, 1:])
        run = torch.cumsum(starts, -1) - 1
        numbered = run + torch.arange(rows.shape[0], device=self.device).unsqueeze(1) * length
        sizes = torch.bincount(numbered.view(-1), minlength=rows.numel()).index_select(0, numbered.view(-1))
        position = torch.arange(length, device=self.device)
        key = sizes.view(rows.shape) * (length * length) + (length - 1 - run) * length + position
        picked = torch.max(key, -1, keepdim=True).indices
        shape = [*self.shape[:dim], 1, *self.shape[dim + 1:]]
        return ordered.gather(-1, picked).view(shape), order.gather(-1, picked).view(shape)
    return _select_along("mode", self, dim, keepdim, select)


def isin_out(elements: torch.Tensor, test_elements: torch.Tensor, assume_unique: bool = False,
             invert: bool = False, *, out: torch.Tensor) -> torch.Tensor:
    """Whether each element is among ``test_elements``: the test elements sorted once (in their common
    dtype with the elements: float32, or int64 for integers), then a binary search per element."""
    common = torch.result_type(elements, test_elements)
    if common not in _SEARCHABLE or out.dtype != torch.bool:
        raise Unsupported(f"isin of {elements.dtype} in {test_elements.dtype} into {out.dtype}")
    if list(out.shape) != list(elements.shape):
        out.resize_(elements.shape)
    if elements.numel() == 0:
        return out
    key = torch.float32 if common.is_floating_point else torch.int64
    values = memory.empty_contiguous([elements.numel()], key)
    copies.device_copy(values, elements.reshape(-1))
    test = memory.empty_contiguous([test_elements.numel()], key)
    copies.device_copy(test, test_elements.reshape(-1))
    ordered = memory.empty_contiguous([test.numel()], key)
    if test.numel():
        _sorted_into(test, 0, False, test.numel(), ordered, memory.empty_contiguous([test.numel()], torch.int64))
    target = out if out.is_contiguous() else memory.empty_contiguous(list(out.shape), torch.bool)
    state.get().sort.isin(elements.numel(), operand(values), operand(ordered), test.numel(),
                          operand(target), invert)
    if target is not out:
        copies.device_copy(out, target)
    return out


def isin_tensor_scalar_out(elements: torch.Tensor, test_element: Any, assume_unique: bool = False,
                           invert: bool = False, *, out: torch.Tensor) -> torch.Tensor:
    return isin_out(elements, copies.upload(torch.tensor(test_element)), assume_unique, invert, out=out)


def isin_scalar_tensor_out(element: Any, test_elements: torch.Tensor, assume_unique: bool = False,
                           invert: bool = False, *, out: torch.Tensor) -> torch.Tensor:
    return isin_out(copies.upload(torch.tensor(element)), test_elements, assume_unique, invert, out=out)


_SEARCHABLE = (torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)

KERNELS: dict[str, Callable[..., Any]] = {
    "isin.Tensor_Tensor_out": isin_out,
    "isin.Tensor_Scalar_out": isin_tensor_scalar_out,
    "isin.Scalar_Tensor_out": isin_scalar_tensor_out,
    "sort.values_stable": sort_values_stable,
    "topk.values": topk_values,
    "kthvalue.values": kthvalue_values,
    "median": median,
    "median.dim_values": median_dim_values,
    "nanmedian": nanmedian,
    "mode": mode,
    "mode.values": copies.out_overload(mode, "values", "indices"),
    "nanmedian.dim_values": nanmedian_dim_values,
}
