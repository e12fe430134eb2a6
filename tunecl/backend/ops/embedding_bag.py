"""``F.embedding_bag`` / ``nn.EmbeddingBag`` on the device, forward and backward: sum (with per-sample weights),
mean and max bags, ``padding_idx``, ``include_last_offset``, ``scale_grad_by_freq``, empty bags.

The bag of each index is found by a binary search of its position in the offsets (``searchsorted``). With
``include_last_offset`` the last offset must equal the number of indices (the CSR format torch documents): other
values raise an error here, where torch's CPU kernel ends the last bag at the last offset in sum mode, at the
end of the indices in max mode, and in mean mode sums to the one but divides by the count to the other.
Then:

- sum and mean: the weight rows read (times the per-sample weights) are added into their bags
  (``index_add``), and a mean divides by the bag's count of indices other than ``padding_idx``; an empty bag
  is zero;
- max: the offsets are read to the host, each bag's positions are laid out in a table padded to the longest
  bag, and the rows gathered by it are reduced with ``max`` (the first maximal index on ties; an empty bag
  is zero with index 0, as on the CPU).

The backward adds each bag's gradient into the weight rows its indices read (sum, mean: scaled as the forward
scaled them, and by ``1 / count`` of each index with ``scale_grad_by_freq``; max: into the row that gave each
maximum of a bag that is not empty, as torch's kernel does), and the per-sample weights' gradient is the dot
product of a bag's gradient with the row read.
torch's checks of the offsets (the first 0, none past the indices) read two numbers from the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tunecl.errors import Unsupported

_SUM, _MEAN, _MAX = 0, 1, 2


def _bags(indices: torch.Tensor, offsets: torch.Tensor, include_last_offset: bool) -> tuple[torch.Tensor, int]:
    """(offset2bag: each index's bag, the number of bags), after torch's checks of the offsets."""
    count = offsets.numel() - 1 if include_last_offset else offsets.numel()
    if offsets.dim() != 1:
        raise ValueError(f"offsets has to be a 1D Tensor, but got Tensor of dimension {offsets.dim()}")
    if indices.numel() and offsets.numel():
        first, last = (int(v) for v in torch.stack((offsets[0], offsets[-1])).tolist())
        if first != 0:
            raise RuntimeError(f"offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start "
                               f"from position 0. However, got {first}")
        if last > indices.numel():
            raise RuntimeError(f"offsets[-1] can not be greater than input's length {indices.numel()}, but got "
                               f"offsets[-1] of {last}")
        if include_last_offset and last != indices.numel():
            raise RuntimeError(f"embedding_bag: with include_last_offset=True the last offset ends the last bag "
                               f"and must equal the number of indices (the CSR format), {indices.numel()}, but "
                               f"got {last}")
    positions = torch.arange(indices.numel(), dtype=offsets.dtype, device=indices.device)
    starts = offsets[:count] if count > 0 else offsets[:0]
    offset2bag = torch.searchsorted(starts, positions, right=True) - 1
    return offset2bag.to(torch.int64), max(count, 0)


def _kept(indices: torch.Tensor, padding_idx: int) -> torch.Tensor | None:
    """Which indices count (None: all)."""
    return None if padding_idx < 0 else indices != padding_idx


def embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                  scale_grad_by_freq: bool = False, mode: int = _SUM, sparse: bool = False,
                  per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False,
                  padding_idx: int = -1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if weight.dtype != torch.float32:
        raise Unsupported(f"embedding_bag of {weight.dtype} weights")
    if sparse:
        raise Unsupported("embedding_bag with sparse gradients")
    indices, offsets = indices.reshape(-1).long(), offsets.long()
    offset2bag, bags = _bags(indices, offsets, include_last_offset)
    dim = weight.shape[1]
    device = weight.device
    kept = _kept(indices, padding_idx)
    if per_sample_weights is not None and mode != _SUM:
        raise NotImplementedError("embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                  "supported for mode='sum'")
    counts = torch.zeros(bags, dtype=torch.int32, device=device)   # (index_add adds int32)
    if indices.numel():
        counts.index_add_(0, offset2bag, torch.ones(indices.shape, dtype=torch.int32, device=device)
                          if kept is None else kept.int())
    counts = counts.long()
    if mode == _MAX:
        output, max_indices = _max_bags(weight, indices, offsets, kept, counts)
        return output, offset2bag, counts, max_indices
    rows = weight.index_select(0, indices)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1)
    if kept is not None:
        rows = rows * kept.unsqueeze(1)
    output = torch.zeros((bags, dim), dtype=weight.dtype, device=device)
    if indices.numel():
        output.index_add_(0, offset2bag, rows)
    if mode == _MEAN:
        output = output / counts.clamp(min=1).unsqueeze(1)
    return output, offset2bag, counts, torch.zeros_like(counts)


def _max_bags(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, kept: torch.Tensor | None,
              counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each bag's elementwise maximum over its rows, and the weight row each maximum came from; ``counts``: the
    indices each bag counts."""
    device, dim, n, bags = weight.device, weight.shape[1], indices.numel(), counts.numel()
    starts = offsets.cpu()[:bags].tolist() if bags else []
    ends = starts[1:] + [n]
    longest = max([end - start for start, end in zip(starts, ends)] + [1])
    table = torch.full((bags, longest), n, dtype=torch.int64)   # n: the padding row
    for bag, (start, end) in enumerate(zip(starts, ends)):
        table[bag, :end - start] = torch.arange(start, end)
    table = table.to(device)
    rows = torch.full((n + 1, dim), float("-inf"), dtype=weight.dtype, device=device)
    if n:
        read = weight.index_select(0, indices)
        rows[:n] = read if kept is None else torch.where(kept.unsqueeze(1), read, float("-inf"))
    values, within = torch.max(rows.index_select(0, table.view(-1)).view(bags, longest, dim), 1)
    ids = torch.cat((indices, torch.zeros(1, dtype=torch.int64, device=device)))
    max_indices = ids.index_select(0, table.view(-1)).view(bags, longest).gather(1, within)
    empty = (counts == 0).unsqueeze(1)   # a bag with no counted index: zero, index 0
    return torch.where(empty, 0.0, values), torch.where(empty, 0, max_indices)


def embedding_bag_dense_backward(grad: torch.Tensor, indices: torch.Tensor, offset2bag: torch.Tensor,
                                 bag_size: torch.Tensor, maximum_indices: torch.Tensor, num_weights: int,
                                 scale_grad_by_freq: bool, mode: int, per_sample_weights: torch.Tensor | None,
                                 padding_idx: int = -1) -> torch.Tensor:
    indices = indices.reshape(-1).long()
    dim = grad.shape[1]
    out = torch.zeros((num_weights, dim), dtype=grad.dtype, device=grad.device)
    if not indices.numel() or not grad.numel():
        return out
    if mode == _MAX:   # as torch's kernel: empty bags send nothing; no frequency scale, no padding rule
        flat = maximum_indices * dim + torch.arange(dim, device=grad.device)
        weights = grad * (bag_size > 0).unsqueeze(1)
        out.view(-1).index_add_(0, flat.reshape(-1), weights.reshape(-1))
        return out
    rows = grad.index_select(0, offset2bag)
    if mode == _MEAN:
        rows = rows / bag_size.clamp(min=1).index_select(0, offset2bag).unsqueeze(1)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.reshape(-1, 1)
    if padding_idx >= 0 or scale_grad_by_freq:
        rows = rows * _index_scale(indices, indices, num_weights, scale_grad_by_freq, padding_idx).unsqueeze(-1)
    out.index_add_(0, indices, rows)
    return out


def _index_scale(targets: torch.Tensor, indices: torch.Tensor, num_weights: int, scale_grad_by_freq: bool,
                 padding_idx: int) -> torch.Tensor:
    """Each target row's gradient factor: 0 for ``padding_idx``, else 1 / its count among ``indices`` with
    ``scale_grad_by_freq``."""
    scale = torch.ones(targets.shape, dtype=torch.float32, device=targets.device)
    if scale_grad_by_freq:
        counts = torch.bincount(indices, minlength=num_weights).float()
        scale = 1.0 / counts.index_select(0, targets.reshape(-1)).clamp(min=1).view(targets.shape)
    if padding_idx >= 0:
        scale = torch.where(targets == padding_idx, 0.0, scale)
    return scale


def embedding_bag_per_sample_weights_backward(grad: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor,
                                              offsets: torch.Tensor, offset2bag: torch.Tensor, mode: int,
                                              padding_idx: int = -1) -> torch.Tensor:
    if mode != _SUM:
        raise RuntimeError("embedding_bag_backward: per_sample_weights only supported for mode='sum'")
    indices = indices.reshape(-1).long()
    if not indices.numel():
        return torch.zeros(0, dtype=grad.dtype, device=grad.device)
    result = (grad.index_select(0, offset2bag) * weight.index_select(0, indices)).sum(1)
    return result if padding_idx < 0 else torch.where(indices == padding_idx, 0.0, result)


def embedding_bag_backward(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                           offset2bag: torch.Tensor, bag_size: torch.Tensor, maximum_indices: torch.Tensor,
                           num_weights: int, scale_grad_by_freq: bool, mode: int, sparse: bool,
                           per_sample_weights: torch.Tensor | None, padding_idx: int = -1) -> torch.Tensor:
    if sparse:
        raise Unsupported("embedding_bag with sparse gradients")
    return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                        scale_grad_by_freq, mode, per_sample_weights, padding_idx)


def embedding_bag_forward_only(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    return embedding_bag(*args, **kwargs)


KERNELS: dict[str, Callable[..., Any]] = {
    "_embedding_bag": embedding_bag,
    "_embedding_bag_forward_only": embedding_bag_forward_only,
    "_embedding_bag_backward": embedding_bag_backward,
    "_embedding_bag_dense_backward": embedding_bag_dense_backward,
    "_embedding_bag_per_sample_weights_backward": embedding_bag_per_sample_weights_backward,
}
