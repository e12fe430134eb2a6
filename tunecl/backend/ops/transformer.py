"""Transformer ops: the triangle masks (tril/triu, causal attention masks), layer norm forward and
backward, and the embedding's backward.

Layer norm's forward is one launch for contiguous float32 tensors: the statistics of each row and the
normalised, weighted and biased output together (torch's composite ``native_layer_norm``, which serves
every other call, runs a batch norm over the rows and then ``addcmul``: three launches, and two more passes
over the activations).

Layer norm's float32 calls are pre-built per signature (the operands' shapes, strides and storage offsets,
eps, which of weight and bias are given, the backward's output mask): the first call of a signature runs
the kernels' route and records its launches (:class:`tunecl.kernels.launches.RecordedRun`), later calls
allocate the outputs, bind the buffers and enqueue."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import copies, half, memory, plans, state
from tunecl.backend.operands import buffers_of, layout_key, operand
from tunecl.errors import Unsupported
from tunecl.kernels import launches
from tunecl.kernels.strided import Operand, merge_dims


def _tri(lower: bool, self: torch.Tensor, diagonal: int, out: torch.Tensor) -> torch.Tensor:
    """``tril``/``triu`` of ``self`` into ``out`` (``out`` may be ``self``: the in-place forms). Batch dims
    are merged into one; where they cannot be (a view with gaps between matrices), a contiguous copy of
    ``self`` is masked into a contiguous temporary that is copied into ``out``."""
    if self.dim() < 2:
        raise Unsupported(f"tril/triu of a {self.dim()}-d tensor")
    if out.dtype != self.dtype:
        raise Unsupported(f"tril/triu of {self.dtype} into {out.dtype}")
    if list(out.shape) != list(self.shape):
        out.resize_(self.shape)
    if self.numel() == 0:
        return out
    lead = list(self.shape[:-2])
    merged, (src_lead, out_lead) = merge_dims(lead, [self.stride()[:-2], out.stride()[:-2]])
    target = out
    if len(merged) > 1:
        self = copies.contiguous_on_device(self)
        target = out if out.is_contiguous() else memory.empty_contiguous(out.shape, out.dtype)
        merged, (src_lead, out_lead) = merge_dims(lead, [self.stride()[:-2], target.stride()[:-2]])
    src, dst = operand(self), operand(target)
    state.get().transformer.tri(lower, merged[0], self.shape[-2], self.shape[-1], diagonal,
                                Operand(dst.buffer, dst.offset, (out_lead[0], *dst.strides[-2:]), dst.dtype),
                                Operand(src.buffer, src.offset, (src_lead[0], *src.strides[-2:]), src.dtype))
    if target is not out:
        copies.device_copy(out, target)
    return out


def tril_out(self: torch.Tensor, diagonal: int = 0, *, out: torch.Tensor) -> torch.Tensor:
    return _tri(True, self, diagonal, out)


def triu_out(self: torch.Tensor, diagonal: int = 0, *, out: torch.Tensor) -> torch.Tensor:
    return _tri(False, self, diagonal, out)


def _plain(t: torch.Tensor | None) -> Operand | None:
    """A contiguous float32 tensor as the layer-norm kernels take it."""
    return None if t is None else operand(t)


MAX_CALLS = 512
_calls = plans.SignatureCalls()   # signature -> _Call (every layer-norm signature can be pre-built)
_native_layer_norm = torch.ops.aten.native_layer_norm.default
_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
_FLOAT32 = torch.float32


def _layer_norm_param(t: torch.Tensor | None, normalized_shape: Sequence[int], device: torch.device) -> bool:
    return t is None or (t.dtype is _FLOAT32 and t.device == device and t.is_contiguous()
                         and list(t.shape) == list(normalized_shape))


class _Call(launches.RecordedRun):
    """A signature's recorded run and, once its launches are recorded, its outputs' layouts."""

    __slots__ = ("outputs",)

    def __init__(self) -> None:
        super().__init__()
        self.outputs: memory.Layouts | None = None

    def layouts(self, shapes: Sequence[Sequence[int]]) -> memory.Layouts:
        """The outputs' layouts, contiguous float32 tensors of ``shapes`` (made on first use)."""
        if self.outputs is None:
            self.outputs = memory.Layouts([(shape, memory.contiguous_strides(shape), _FLOAT32) for shape in shapes])
        return self.outputs


def _recorded(key: tuple) -> _Call | None:
    """The recorded run of a signature (made on its first call); None where none applies (a State whose
    plans are not the backend's own, e.g. a dry run's)."""
    run = _calls.lookup(key)
    if run is _calls:
        run = _calls.keep(key, _Call() if _calls.prebuilds else None, MAX_CALLS)
    return run


def _stat_shape(input: torch.Tensor, axis: int, normalized_shape: Sequence[int]) -> list[int]:
    """The saved statistics' shape, as torch's: the input's leading dims, then ones."""
    return [*input.shape[:axis], *([1] * len(normalized_shape))]


def native_layer_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None,
                      bias: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, mean, rstd), the statistics shaped as torch's (the input's leading dims, then ones)."""
    axis = input.dim() - len(normalized_shape)
    if (input.dtype is not _FLOAT32 or axis < 0 or list(input.shape[axis:]) != list(normalized_shape)
            or not input.is_contiguous() or not _layer_norm_param(weight, normalized_shape, input.device)
            or not _layer_norm_param(bias, normalized_shape, input.device)):
        return _native_layer_norm._op_dk(_COMPOSITE, input, normalized_shape, weight, bias, eps)
    key = ("fwd", layout_key(input), layout_key(weight), layout_key(bias), eps)
    recorded = _recorded(key)
    if recorded is not None and recorded.launches:   # a signature seen before: its outputs in one go
        stat_shape = _stat_shape(input, axis, normalized_shape)
        (out, mean, rstd), buffers = recorded.layouts((input.shape, stat_shape, stat_shape)).empty()
        recorded.launches.enqueue(_calls.owner.device.queue, (*buffers_of((input, weight, bias)), *buffers))
        return out, mean, rstd
    out = memory.empty_contiguous(input.shape, _FLOAT32)
    stat_shape = _stat_shape(input, axis, normalized_shape)
    mean, rstd = memory.empty_contiguous(stat_shape, _FLOAT32), memory.empty_contiguous(stat_shape, _FLOAT32)
    cols = math.prod(normalized_shape)
    if not cols:  # empty rows: CPU torch's statistics (a mean of 0, an rstd of NaN)
        return out, mean.fill_(0.0), rstd.fill_(math.nan)
    rows = input.numel() // cols
    st = state.get()

    def run() -> None:
        st.transformer.layer_norm_forward(rows, cols, operand(input), _plain(weight), _plain(bias), eps,
                                          operand(out), operand(mean), operand(rstd))

    if recorded is None:
        run()
    else:
        recorded(st.device, buffers_of((input, weight, bias, out, mean, rstd)), run)
    return out, mean, rstd


def native_layer_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, normalized_shape: Sequence[int],
                               mean: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None,
                               bias: torch.Tensor | None, output_mask: Sequence[bool]):
    """Layer norm's (grad_input, grad_weight, grad_bias), those ``output_mask`` asks for (else None), in
    float32 (float16 tensors through float32 copies, the results rounded back)."""
    half.check(grad_out, input, mean, rstd, weight, bias)
    axis = input.dim() - len(normalized_shape)
    if axis < 0 or list(input.shape[axis:]) != list(normalized_shape):
        raise Unsupported(f"layer norm over {list(normalized_shape)} of a {list(input.shape)} input")
    cols = math.prod(normalized_shape)
    rows = math.prod(input.shape[:axis])
    x, dy = half.to_float32(input), half.to_float32(grad_out)
    mu, inv, w = half.to_float32(mean), half.to_float32(rstd), half.to_float32(weight)
    # (an empty input's saved statistics are of any shape: torch's composite forward gives them the input's)
    if dy.shape != x.shape or (x.numel() and (mu.numel() != rows or inv.numel() != rows)):
        raise Unsupported("layer norm backward with mismatched shapes")
    param_shape = list(normalized_shape) if weight is None else list(weight.shape)
    param_dtype = input.dtype if weight is None else weight.dtype
    recorded = None
    if all(t is None or t.dtype is _FLOAT32 for t in (grad_out, input, mean, rstd, weight)):
        mask = tuple(bool(m) for m in output_mask)
        key = ("bwd", *map(layout_key, (x, dy, w, mu, inv)), mask)
        recorded = _recorded(key)
        if recorded is not None and recorded.launches:   # a signature seen before: its outputs in one go
            made, buffers = recorded.layouts([shape for shape, wanted in zip(
                (input.shape, param_shape, param_shape), mask) if wanted]).empty()
            wanted = iter(zip(made, buffers))
            grads = [next(wanted) if m else (None, None) for m in mask]
            recorded.launches.enqueue(_calls.owner.device.queue,
                                      (*buffers_of((x, dy, w, mu, inv)), *(b for _, b in grads)))
            return tuple(g for g, _ in grads)
    grad_input = memory.empty_contiguous(input.shape, torch.float32) if output_mask[0] else None
    grad_weight = memory.empty_contiguous(param_shape, torch.float32) if output_mask[1] else None
    grad_bias = memory.empty_contiguous(param_shape, torch.float32) if output_mask[2] else None
    st = state.get()

    def run() -> None:
        st.transformer.layer_norm_backward(rows, cols, operand(x), operand(dy), _plain(w), operand(mu),
                                           operand(inv), _plain(grad_input), _plain(grad_weight),
                                           _plain(grad_bias))

    if recorded is None:
        run()
    else:
        recorded(st.device, buffers_of((x, dy, w, mu, inv, grad_input, grad_weight, grad_bias)), run)
    return (None if grad_input is None else half.cast(grad_input, input.dtype),
            None if grad_weight is None else half.cast(grad_weight, param_dtype),
            None if grad_bias is None else half.cast(grad_bias, param_dtype))


def embedding_dense_backward(grad_output: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int,
                             scale_grad_by_freq: bool) -> torch.Tensor:
    """The embedding's weight gradient: ``grad_output``'s rows summed by index in position order (float16
    through a float32 copy, rounded back)."""
    half.check(grad_output)
    dims = grad_output.shape[-1] if grad_output.dim() else 1
    positions = indices.numel()
    if grad_output.numel() != positions * dims:
        raise Unsupported("embedding backward with mismatched shapes")
    g = half.to_float32(grad_output)
    idx = copies.contiguous_on_device(indices)
    grad_weight = memory.empty_contiguous([num_weights, dims], torch.float32)
    first, count = (memory.empty_contiguous([num_weights], torch.int32) for _ in range(2))
    links = memory.empty_contiguous([max(positions, 1)], torch.int32)
    state.get().transformer.embedding_backward(num_weights, positions, dims, operand(idx), operand(g), padding_idx,
                                               scale_grad_by_freq, operand(first), operand(links), operand(count),
                                               operand(grad_weight))
    return half.cast(grad_weight, grad_output.dtype)


KERNELS: dict[str, Callable[..., Any]] = {
    "tril.out": tril_out,
    "triu.out": triu_out,
    "native_layer_norm": native_layer_norm,
    "native_layer_norm_backward": native_layer_norm_backward,
    "embedding_dense_backward": embedding_dense_backward,
}
