"""Advanced indexing on the device: ``x[i, j]`` (``index.Tensor``), ``x[i, j] = v`` and ``+= v``
(``index_put_``, accumulate either way), ``index_add``, ``nonzero`` and ``masked_select``.

The index tensors (bool masks become their nonzero coordinates) are checked against their dims, broadcast
together, and turned into one int64 element offset per indexed position by device arithmetic; the kernels
then walk the other dims by strides. As torch does, the indexed dims' result dims replace them in place
when they are adjacent, and go first otherwise. Out-of-range indices raise IndexError (one host sync per
call, for the check)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import copies, memory, state
from tunecl.backend.operands import operand, same_storage, wrapped_dim
from tunecl.errors import Unsupported
from tunecl.kernels.strided import Operand

_INDEX_DTYPES = (torch.int64, torch.int32)
_MASK_DTYPES = (torch.bool, torch.uint8)


@dataclasses.dataclass
class _Plan:
    base: torch.Tensor          # contiguous int64 element offsets into self, one per position
    positions: int
    index_shape: list[int]      # the broadcast shape of the index tensors
    rest_dims: list[int]        # self's dims that are not indexed, in order
    front: int                  # where the index dims go in the result: len(pre) when adjacent, else 0
    max_offset: int

    def result_shape(self, shape: Sequence[int]) -> list[int]:
        rest = [shape[d] for d in self.rest_dims]
        return rest[:self.front] + self.index_shape + rest[self.front:]


def nonzero(self: torch.Tensor) -> torch.Tensor:
    """The coordinates of the nonzero elements, one int64 row each, in element order."""
    if self.dim() == 0:
        return memory.empty_contiguous([int(bool(self.item())), 0], torch.int64)
    mask = self if self.dtype == torch.bool else torch.ne(self, 0)
    mask = copies.contiguous_on_device(mask)
    if mask.numel() == 0:
        return memory.empty_contiguous([0, self.dim()], torch.int64)
    csum = torch.cumsum(mask.view(-1), 0)
    count = int(csum[-1].item())
    out = memory.empty_contiguous([count, self.dim()], torch.int64)
    flat = mask.view(torch.uint8)
    state.get().index_nd.nonzero(list(mask.shape), operand(out), operand(flat), operand(csum))
    return out


def nonzero_out(self: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    if out.dtype != torch.int64:
        raise RuntimeError(f"nonzero: out must be int64, got {out.dtype}")
    return copies.copy_from_and_resize(nonzero(self), out)


def _expanded(self: torch.Tensor, indices: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """One entry per dim of self (None: not indexed); masks become their nonzero coordinates."""
    if len(indices) > self.dim():
        raise IndexError(f"too many indices for tensor of dimension {self.dim()} (got {len(indices)})")
    out: list[torch.Tensor | None] = []
    for index in indices:
        if index is None:
            out.append(None)
            continue
        if index.device.type not in ("opencl", "cpu"):
            raise Unsupported(f"an index on {index.device}")
        if index.dtype in _MASK_DTYPES:
            dim = len(out)
            span = list(self.shape[dim:dim + index.dim()])
            if list(index.shape) != span:
                raise IndexError(f"The shape of the mask {list(index.shape)} at index {dim} does not match the "
                                 f"shape of the indexed tensor {list(self.shape)} at index {dim}")
            coordinates = nonzero(index.to("opencl"))
            out.extend(coordinates[:, k] for k in range(index.dim()))
        elif index.dtype in _INDEX_DTYPES:
            out.append(index.to("opencl"))
        else:
            raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors, got {index.dtype}")
    if len(out) > self.dim():
        raise IndexError(f"too many indices for tensor of dimension {self.dim()} (got {len(out)})")
    return out + [None] * (self.dim() - len(out))


def _plan(self: torch.Tensor, indices: Sequence[torch.Tensor | None]) -> _Plan:
    per_dim = _expanded(self, indices)
    indexed = [d for d, index in enumerate(per_dim) if index is not None]
    if not indexed:
        raise Unsupported("index without index tensors")
    tensors = torch.broadcast_tensors(*[per_dim[d] for d in indexed])
    index_shape = list(tensors[0].shape)
    base = None
    for d, index in zip(indexed, tensors):
        size = self.shape[d]
        index = index.long()
        if index.numel() and bool(torch.logical_or(index >= size, index < -size).any().item()):
            raise IndexError(f"index out of range: an index is out of bounds for dimension {d} with size {size}")
        wrapped = torch.where(index < 0, index + size, index) * self.stride(d)
        base = wrapped if base is None else base + wrapped
    base = copies.contiguous_on_device(base.expand(index_shape)).view(-1)
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    rest_dims = [d for d in range(self.dim()) if per_dim[d] is None]
    max_offset = sum((self.shape[d] - 1) * abs(self.stride(d)) for d in indexed if self.shape[d])
    return _Plan(base, base.numel(), index_shape, rest_dims, indexed[0] if adjacent else 0, max_offset)


def _self_rest(self: torch.Tensor, plan: _Plan) -> Operand:
    src = operand(self)
    return src._replace(strides=tuple(self.stride(d) for d in plan.rest_dims))


def _rows_view(t: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """``t`` (of the result's shape) as (positions, *rest): its index dims moved first and merged."""
    k = len(plan.index_shape)
    moved = t.movedim(list(range(plan.front, plan.front + k)), list(range(k))) if plan.front else t
    return moved.reshape([plan.positions] + list(moved.shape[k:]))


def index_out(self: torch.Tensor, indices: Sequence[torch.Tensor | None], *, out: torch.Tensor) -> torch.Tensor:
    plan = _plan(self, indices)
    shape = plan.result_shape(self.shape)
    if out.dtype != self.dtype:
        raise RuntimeError(f"index: out has dtype {out.dtype}, expected {self.dtype}")
    if list(out.shape) != shape:
        out.resize_(shape)
    rest = [self.shape[d] for d in plan.rest_dims]
    rows = memory.empty_contiguous([plan.positions] + rest, self.dtype)
    r = operand(rows)
    state.get().index_nd.rows("index_gather", plan.positions, rest, _self_rest(self, plan), r, operand(plan.base),
                              plan.max_offset)
    k = len(plan.index_shape)
    result = rows.view(plan.index_shape + rest)
    if plan.front:
        result = result.movedim(list(range(k)), list(range(plan.front, plan.front + k)))
    copies.device_copy(out, result)
    return out


def index_put_impl_(self: torch.Tensor, indices: Sequence[torch.Tensor | None], values: torch.Tensor,
                    accumulate: bool = False, unsafe: bool = False) -> torch.Tensor:
    if values.dtype != self.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got {self.dtype} for "
                           f"the destination and {values.dtype} for the source.")
    if accumulate and self.dtype == torch.float16:   # summed in a float32 copy, rounded back once
        wide = memory.empty_contiguous(self.shape, torch.float32)
        copies.device_copy(wide, self)
        index_put_impl_(wide, indices, values.float(), True)
        copies.device_copy(self, wide)
        return self
    if accumulate and self.dtype not in (torch.float32, torch.int32):
        raise Unsupported(f"accumulating index_put_ of {self.dtype}")
    if values.device.type != "opencl":
        if values.dim():
            raise Unsupported(f"index_put_ of values on {values.device}")
        values = copies.upload(values)
    plan = _plan(self, indices)
    shape = plan.result_shape(self.shape)
    try:
        expanded = values.expand(shape)
    except RuntimeError:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"indexing result of shape {shape}") from None
    if plan.positions == 0 or math.prod(shape) == 0:
        return self
    if same_storage(values, self):   # reading what the launch writes would race
        expanded = copies.contiguous_on_device(expanded.clone())
    rows = _rows_view(expanded, plan)
    rest = [self.shape[d] for d in plan.rest_dims]
    state.get().index_nd.rows("index_accumulate" if accumulate else "index_scatter", plan.positions, rest,
                              _self_rest(self, plan), operand(rows), operand(plan.base), plan.max_offset)
    return self


def index_add_out(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, alpha: Any = 1,
                  out: torch.Tensor) -> torch.Tensor:
    """out = self, then out's slices along ``dim`` at ``index`` += alpha * source, by atomics (float sums
    over repeated indices can differ in the last bit run to run, as on CUDA)."""
    if self.dtype not in (torch.float32, torch.int32) or source.dtype != self.dtype or out.dtype != self.dtype:
        raise Unsupported(f"index_add of {source.dtype} into {self.dtype}")
    if index.dim() > 1 or index.dtype not in _INDEX_DTYPES:
        raise IndexError(f"index_add: index must be a 0-d or 1-d int64/int32 tensor, got {index.dim()}-d "
                         f"{index.dtype}")
    rank = max(self.dim(), 1)
    if not -rank <= dim < rank:
        raise IndexError(f"index_add: dim {dim} is out of range for a {self.dim()}-d tensor")
    dim %= rank
    expected = list(self.shape)
    if self.dim():
        expected[dim] = index.numel()
    if list(source.shape) != expected and not (source.dim() == 0 and self.dim() == 0):
        raise RuntimeError(f"index_add: source of sizes {list(source.shape)}, expected {expected}")
    _out_from_self(out, self)
    if alpha != 1:
        source = torch.mul(source, alpha)
    if self.dim() == 0:
        index_put_impl_(out.view(1), [index.view(-1)], source.reshape(1), True)
        return out
    return index_put_impl_(out, [None] * dim + [index.view(-1)], source, True)


def masked_select(self: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_select: expected a bool mask, got {mask.dtype}")
    x, m = torch.broadcast_tensors(self, mask)
    if x.dim() == 0:
        x, m = x.view(1), m.view(1)
    out = memory.empty_contiguous([0], self.dtype)
    return index_out(x, [copies.contiguous_on_device(m)], out=out)


def masked_select_out(self: torch.Tensor, mask: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return copies.copy_from_and_resize(masked_select(self, mask), out)


def masked_scatter_(self: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """self's elements where ``mask`` (broadcast to self) is set take ``source``'s first elements, in
    order (masked_select's gradient)."""
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_scatter_: expected a bool mask, got {mask.dtype}")
    if source.dtype != self.dtype:
        raise RuntimeError(f"masked_scatter_: expected source of dtype {self.dtype}, got {source.dtype}")
    if self.dim() == 0:
        if bool(mask.item()):
            copies.device_copy(self, source.reshape(-1)[0])
        return self
    coordinates = nonzero(copies.contiguous_on_device(mask.expand(self.shape)))
    count = coordinates.shape[0]
    if source.numel() < count:
        raise RuntimeError(f"masked_scatter_: the mask sets {count} elements but source has {source.numel()}")
    if count:
        index_put_impl_(self, [coordinates[:, k] for k in range(self.dim())], source.reshape(-1)[:count])
    return self


def _scatter_checks(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> int:
    """torch's checks of a scatter_add / scatter_reduce; the normalised dim."""
    if index.dtype not in _INDEX_DTYPES and index.numel():   # (torch accepts an empty index of any dtype)
        raise RuntimeError(f"scatter(): Expected dtype int32/int64 for index, got {index.dtype}")
    if src.dtype != self.dtype:
        raise RuntimeError("scatter(): Expected self.dtype to be equal to src.dtype")
    # (a 0-dim tensor counts as one of 1 dim, as in torch)
    index_shape, self_shape, src_shape = (list(t.shape) or [1] for t in (index, self, src))
    if index.numel() and (len(index_shape) != len(self_shape) or len(index_shape) != len(src_shape)):
        raise RuntimeError("Index tensor must have the same number of dimensions as self tensor")
    dim = wrapped_dim(dim, self.dim())
    if index.numel() and any(n > src_shape[d] or (d != dim and n > self_shape[d])
                             for d, n in enumerate(index_shape)):   # (an empty index of any shape is no-op)
        raise RuntimeError(f"Expected index {list(index.shape)} to be no larger than self {list(self.shape)} apart "
                           f"from dimension {dim} and to be no larger size than src {list(src.shape)}")
    return dim


def _scatter_coordinates(index: torch.Tensor, dim: int) -> list[torch.Tensor]:
    """The full coordinates an index_put takes for scatter's ``index`` along ``dim``: ``index`` itself there,
    each other dim's position (broadcast views of aranges)."""
    coordinates = []
    for d, n in enumerate(index.shape):
        if d == dim:
            coordinates.append(index)
        else:
            shape = [1] * index.dim()
            shape[d] = n
            coordinates.append(torch.arange(n, device=index.device).view(shape).expand(index.shape))
    return coordinates


def _out_from_self(out: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
    """``out`` holding self's values (nothing to do where it is self), for an op that then writes into it."""
    if not (same_storage(out, self) and out.stride() == self.stride() and out.storage_offset() == self.storage_offset()
            and out.shape == self.shape):
        if list(out.shape) != list(self.shape):
            out.resize_(self.shape)
        copies.device_copy(out, self)
    return out


def scatter_add_out(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, *,
                    out: torch.Tensor) -> torch.Tensor:
    """out = self, then out[index[i][j]][j] += src[i][j] (along ``dim``; graph nets' message sums) by an
    accumulating index put (float sums over repeated indices can differ in the last bit run to run, as on
    CUDA)."""
    dim = _scatter_checks(self, dim, index, src)
    _out_from_self(out, self)
    if not index.numel():
        return out
    if self.dim() == 0:
        index_put_impl_(out.view(1), [index.view(1)], src.reshape(1), True)
    else:
        index_put_impl_(out, _scatter_coordinates(index, dim), src[tuple(slice(0, n) for n in index.shape)], True)
    return out


def scatter_reduce_out(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, *,
                       include_self: bool = True, out: torch.Tensor) -> torch.Tensor:
    """``scatter_reduce`` with "sum", "amax", "amin" and, for floating tensors, "mean" (torch's rules: without
    include_self a position scattered to starts from nothing; one scattered to by none keeps self's value; NaN
    wins a maximum or minimum); "prod" takes the CPU fallback."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    if reduce == "prod" or (reduce == "mean" and not self.dtype.is_floating_point):
        raise Unsupported(f"scatter_reduce with reduce={reduce!r} of {self.dtype}")
    dim = _scatter_checks(self, dim, index, src)
    _out_from_self(out, self)
    if not index.numel():
        return out
    target = out.view(1) if self.dim() == 0 else out
    coordinates = [index.view(1)] if self.dim() == 0 else _scatter_coordinates(index, dim)
    values = src.reshape(1) if self.dim() == 0 else src[tuple(slice(0, n) for n in index.shape)]
    if reduce in ("amax", "amin"):
        _scatter_extreme(target, coordinates, values, reduce == "amax", include_self)
        return out
    if not include_self:
        index_put_impl_(target, coordinates, torch.zeros((), dtype=self.dtype, device=self.device).expand(
            values.shape), False)
    index_put_impl_(target, coordinates, values, True)
    if reduce == "mean":
        counts = torch.full(target.shape, 1.0 if include_self else 0.0, dtype=torch.float32, device=self.device)
        index_put_impl_(counts, coordinates, torch.ones((), device=self.device).expand(values.shape), True)
        # (a position no element was scattered to holds self's value, untouched: counts 0 there)
        copies.device_copy(target, torch.where(counts > 0, target / counts.clamp_min(1).to(target.dtype), target))
    return out


def _scatter_extreme(target: torch.Tensor, coordinates: list[torch.Tensor], values: torch.Tensor, maximum: bool,
                     include_self: bool) -> None:
    """target[coordinates] = the maximum (or minimum) of the values scattered to each position, and of target's
    own value with ``include_self``. The values are sorted stably, then stably by their flat target position:
    each position's run is then ascending with NaNs last, so its last element is the maximum and its first the
    minimum, unless the last is NaN."""
    strides = [math.prod(target.shape[d + 1:]) for d in range(target.dim())]
    position = sum(c.long() * s for c, s in zip(coordinates, strides)).reshape(-1)
    ordered, first_order = torch.sort(values.reshape(-1), stable=True)
    position, second_order = torch.sort(position.index_select(0, first_order), stable=True)
    ordered = ordered.index_select(0, second_order)
    count = position.numel()
    ends = torch.ones(count, dtype=torch.bool, device=target.device)
    starts = torch.ones(count, dtype=torch.bool, device=target.device)
    if count > 1:
        torch.ne(position[1:], position[:-1], out=ends[:-1])
        torch.ne(position[1:], position[:-1], out=starts[1:])
    positions = torch.masked_select(position, ends)
    result = torch.masked_select(ordered, ends)
    if not maximum:
        lowest = torch.masked_select(ordered, starts)
        result = torch.where(torch.isnan(result), result, lowest) if result.is_floating_point() else lowest
    flat = target.contiguous().view(-1)
    if include_self:
        current = flat.index_select(0, positions)
        result = torch.maximum(current, result) if maximum else torch.minimum(current, result)
    index_put_impl_(flat, [positions], result, False)
    if flat.data_ptr() != target.data_ptr() or not target.is_contiguous():
        copies.device_copy(target, flat.view(target.shape))


def index_copy_out(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *,
                   out: torch.Tensor) -> torch.Tensor:
    """out = self, then out's slices along ``dim`` at ``index`` = source's slices in order (an index put)."""
    if index.dim() > 1 or index.dtype != torch.int64:
        raise IndexError(f"index_copy_(): Index should have dimension 1 or 0 and dtype int64 (got {index.dim()}-d "
                         f"{index.dtype})")
    if source.dtype != self.dtype:
        raise RuntimeError(f"index_copy_(): self and source expected to have the same dtype, but got (self) "
                           f"{self.dtype} and (source) {source.dtype}")
    dim = wrapped_dim(dim, self.dim())
    count = source.shape[dim] if source.dim() else 1
    if index.numel() != count:
        raise IndexError(f"index_copy_(): Number of indices ({index.numel()}) should be equal to source.size(dim) "
                         f"({count})")
    _out_from_self(out, self)
    if not index.numel():
        return out
    if self.dim() == 0:
        index_put_impl_(out.view(1), [index.view(-1)], source.reshape(1))
    else:
        index_put_impl_(out, [None] * dim + [index.view(-1)], source)
    return out


def put_(self: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """self, read as a flat tensor in row-major order, takes (or adds) source at ``index`` (an index put on the
    flat view; a non-contiguous self through a contiguous copy)."""
    if index.dtype != torch.int64:
        raise RuntimeError(f"put_(): Expected a long tensor for index, but got {index.dtype}")
    if source.dtype != self.dtype:
        raise RuntimeError(f"put_(): self and source expected to have the same dtype, but got self.dtype = "
                           f"{self.dtype} and source.dtype = {source.dtype}")
    if index.numel() != source.numel():
        raise RuntimeError(f"put_(): Expected source and index to have the same number of elements, but got "
                           f"source.numel() = {source.numel()}, index.numel() = {index.numel()}")
    if not index.numel():
        return self
    flat = self if self.is_contiguous() else self.contiguous()   # (row-major order, as torch reads self)
    index_put_impl_(flat.view(-1), [index.reshape(-1)], source.reshape(-1), accumulate)
    if flat is not self:
        copies.device_copy(self, flat)
    return self


def take(self: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """self read as a flat tensor at ``index`` (put's source gradient), shaped like ``index``."""
    if index.dtype != torch.int64:
        raise RuntimeError(f"take(): Expected a long tensor for index, but got {index.dtype}")
    flat = self.reshape(-1)
    return torch.ops.aten.index.Tensor(flat, [index.reshape(-1)]).view(index.shape)


def histc_out(self: torch.Tensor, bins: int = 100, min: Any = 0, max: Any = 0, *, out: torch.Tensor) -> torch.Tensor:
    """Counts of ``self`` in ``bins`` equal bins over [min, max] (the data's range when both are 0; a value
    equal to max in the last bin, values outside or NaN not counted), as torch's kernel bins them: position
    (x - min) * bins / (max - min), truncated."""
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"torch.histc: input tensor and hist tensor should have the same dtype, but got input "
                           f"{self.dtype} and hist {out.dtype}")
    low, high = float(min), float(max)
    if low > high:
        raise RuntimeError("torch.histc: max must be larger than min")
    if low == high and self.numel():
        low, high = (float(extreme) for extreme in torch.aminmax(self))
    if low == high:
        low, high = low - 1, high + 1
    if not (math.isfinite(low) and math.isfinite(high)):
        raise RuntimeError(f"torch.histc: range of [{low}, {high}] is not finite")
    # in the input's dtype, edges and width rounded to it, as torch's kernel computes (float16 binning differs)
    low_t, high_t = torch.tensor(low, dtype=self.dtype), torch.tensor(high, dtype=self.dtype)
    width = float(high_t - low_t)
    x = self.reshape(-1)
    inside = (x >= float(low_t)) & (x <= float(high_t))
    position = torch.where(inside, (x - float(low_t)) * bins / width, 0.0).clamp(0, bins - 1).to(torch.int64)
    counts = torch.zeros(bins, dtype=torch.float32, device=self.device)
    if x.numel():
        index_put_impl_(counts, [position], inside.float(), True)
    return copies.copy_from_and_resize(counts, out)


def bincount(self: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0) -> torch.Tensor:
    """Occurrences of each value of a 1-d tensor of non-negative integers (weighted: the sum of the weights),
    ``max(self) + 1`` or ``minlength`` long (one read of the maximum from the device)."""
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if self.dim() != 1 or self.dtype.is_floating_point or self.dtype == torch.bool:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if weights is not None and weights.dtype != torch.float32:
        raise Unsupported(f"bincount with {weights.dtype} weights")
    length = minlength
    if self.numel():
        low, high = torch.aminmax(self)
        if int(low) < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = builtins_max(int(high) + 1, minlength)
    if weights is None:
        counts = torch.zeros(length, dtype=torch.int32, device=self.device)
        if self.numel():
            index_put_impl_(counts, [self.long()], torch.ones((), dtype=torch.int32, device=self.device).expand(
                self.shape), True)
        return counts.long()
    sums = torch.zeros(length, dtype=torch.float32, device=self.device)
    if self.numel():
        index_put_impl_(sums, [self.long()], weights, True)
    return sums


builtins_max = max


def index_fill_(self: torch.Tensor, dim: int, index: torch.Tensor, value: Any) -> torch.Tensor:
    """self's slices along ``dim`` at ``index`` set to ``value`` (a number or a 0-dim tensor; ``trace``'s
    gradient), by an index put of the value broadcast over them."""
    if isinstance(value, torch.Tensor) and value.dim():
        raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.dim()} dimension(s).")
    if index.dtype != torch.int64:
        raise IndexError("index_fill_(): Expected dtype int64 for index.")
    if index.dim() > 1:
        raise IndexError(f"index_fill_(): Index is supposed to be a vector, got {index.dim()}-d")
    dim = wrapped_dim(dim, self.dim())
    fill = value.to(self.device, self.dtype) if isinstance(value, torch.Tensor) else torch.full(
        (), value, dtype=self.dtype, device=self.device)
    if self.dim() == 0:
        index_put_impl_(self.view(1), [index.view(-1)], fill)
        return self
    return index_put_impl_(self, [None] * dim + [index.view(-1)], fill)


KERNELS: dict[str, Callable[..., Any]] = {
    "scatter_add.out": scatter_add_out,
    "index_copy.out": index_copy_out,
    "put_": put_,
    "take": take,
    "histc.out": histc_out,
    "histc": lambda self, bins=100, min=0, max=0: histc_out(self, bins, min, max, out=memory.empty_contiguous(
        (bins,), self.dtype)),
    "bincount": bincount,
    "scatter_reduce.two_out": scatter_reduce_out,
    "index_fill_.int_Scalar": index_fill_,
    "index_fill_.int_Tensor": index_fill_,
    "masked_scatter_": masked_scatter_,
    "nonzero": nonzero,
    "nonzero.out": nonzero_out,
    "index.Tensor_out": index_out,
    "_index_put_impl_": index_put_impl_,
    "index_add.out": index_add_out,
    "masked_select": masked_select,
    "masked_select.out": masked_select_out,
}
