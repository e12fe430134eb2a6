"""Neural-network ops: NLL loss, batch norm, 2-D pooling, cat and dropout."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import copies, graphs, half, memory, random_draws, state
from tunecl.backend.copies import contiguous_on_device
from tunecl.backend.allocator import buffers as _buffers
from tunecl.backend.counters import eager_fusions
from tunecl.backend.operands import kernel_dtype, operand
from tunecl.backend.ops import COMPOSITE_KEYS
from tunecl.backend.ops.pointwise import STEP_COUNT_TAG, masked_tag, new_like, run
from tunecl.errors import Unsupported
from tunecl.kernels.ops.pool import Window
from tunecl.kernels.strided import Operand

_REDUCTIONS = ("none", "mean", "sum")


def _opt(t: torch.Tensor | None) -> Operand | None:
    return None if t is None else operand(contiguous_on_device(t))


def into_contiguous(out: torch.Tensor, shape: Sequence[int], compute: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """Run ``compute`` into ``out`` (resized to ``shape``) directly if it is contiguous, else into a
    contiguous temporary that is then copied into ``out``."""
    if list(out.shape) != list(shape):
        out.resize_(shape)
    if out.is_contiguous():
        compute(out)
    else:
        tmp = memory.empty_contiguous(shape, out.dtype)
        compute(tmp)
        copies.device_copy(out, tmp)
    return out


def into_float32(out: torch.Tensor, shape: Sequence[int], compute: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """Run the float32 ``compute`` into ``out`` (resized to ``shape``): directly if ``out`` is contiguous
    float32, else into a float32 temporary rounded into ``out`` (float16 results)."""
    target = half.float32_target(out, shape)
    compute(target)
    return half.write_back(out, target)


# -- NLL loss ----------------------------------------------------------------------------------------
def nll_loss_forward(self: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
                     ignore_index: int, *, output: torch.Tensor, total_weight: torch.Tensor):
    if self.dim() > 2 or self.dim() < 1:
        raise Unsupported(f"nll_loss of a {self.dim()}-d input")
    n, c = (self.shape[0], self.shape[1]) if self.dim() == 2 else (1, self.shape[0])
    mode = _REDUCTIONS[reduction]
    x, t = contiguous_on_device(self), contiguous_on_device(target)
    shape = [n] if mode == "none" and self.dim() == 2 else []
    if list(total_weight.shape):
        total_weight.resize_([])

    def compute(out: torch.Tensor) -> None:
        state.get().loss.forward(operand(x), operand(t), _opt(weight), n, c, mode, ignore_index, operand(out),
                                 operand(total_weight))
    into_contiguous(output, shape, compute)
    return output, total_weight


def nll_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                      weight: torch.Tensor | None, reduction: int, ignore_index: int, total_weight: torch.Tensor,
                      *, grad_input: torch.Tensor) -> torch.Tensor:
    if self.dim() > 2 or self.dim() < 1:
        raise Unsupported(f"nll_loss of a {self.dim()}-d input")
    n, c = (self.shape[0], self.shape[1]) if self.dim() == 2 else (1, self.shape[0])
    g, t = contiguous_on_device(grad_output), contiguous_on_device(target)

    def compute(out: torch.Tensor) -> None:
        state.get().loss.backward(operand(g), operand(out), operand(t), _opt(weight), n, c,
                                  _REDUCTIONS[reduction], ignore_index, operand(total_weight))
    return into_contiguous(grad_input, self.shape, compute)


# -- batch norm ----------------------------------------------------------------------------------------
def _at(t: torch.Tensor | None) -> tuple[Any, int] | None:
    """(buffer, element offset) of a contiguous float32 device tensor, as the norm kernels take it."""
    if t is None:
        return None
    try:
        return _buffers[t.untyped_storage().data_ptr()], t.storage_offset()
    except KeyError:
        raise Unsupported(f"a {t.device.type} tensor among opencl operands") from None


def _at32(t: torch.Tensor | None) -> tuple[Any, int] | None:
    return None if t is None else _at(half.to_float32(t))


def _ncl(x: torch.Tensor) -> tuple[int, int, int]:
    if x.dim() < 2:
        raise Unsupported("batch norm of a tensor with fewer than 2 dims")
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def _plain(*tensors: torch.Tensor | None) -> bool:
    """Every given tensor is None or float32 and contiguous (whether on the device, :func:`_at` checks):
    batch norm's common case, which needs none of the float16 and layout conversions (a quarter of its
    host time)."""
    float32 = torch.float32
    return all(t is None or (t.dtype is float32 and t.is_contiguous()) for t in tensors)


# -- pre-built batch-norm calls ----------------------------------------------------------------------
# A float32 call whose tensors are all contiguous has a signature (the input's shape, strides and offset,
# which of weight, bias and the statistics it has and their offsets, training, eps, momentum, and for the
# backward grad_output's layout and output_mask) that fixes everything but its buffers: the output
# geometry and every launch's kernel variant, grid, packed meta, scratch and scalars. So its launches are
# built once (BatchNorm.prepare_forward / prepare_backward: kernel copies with those arguments set) and a
# call allocates the outputs, binds the buffers and enqueues them, with the launches of the general route
# below bit for bit (the forward's normalising launch still held for an in-place relu; a graph capture or
# a KernelProfile gets the kernels' own launches). The table lives on the BatchNorm (a new backend State
# or a dry run has its own) and is bounded (MAX_CALLS); forget_launches() drops it.
MAX_CALLS = 1024
_FLOAT32 = torch.float32
_NOT_PLAIN = -1   # a parameter's signature when it is not contiguous float32: the general route


def _param(t: torch.Tensor | None) -> int | None:
    """What a pre-built call depends on of a parameter or statistic: None when absent, its storage offset,
    or _NOT_PLAIN."""
    if t is None:
        return None
    return t.storage_offset() if t.dtype is _FLOAT32 and t.is_contiguous() else _NOT_PLAIN


def _keep(calls: dict[tuple, Any], key: tuple, call: Any) -> Any:
    if len(calls) >= MAX_CALLS:   # a safety valve for ever-changing signatures
        calls.clear()
    calls[key] = call
    return call


def _placed(offsets: dict[str, int | None]) -> dict[str, tuple[None, int] | None]:
    """A call's operand layout as the norm kernels' planning takes it, without buffers."""
    return {k: None if o is None else (None, o) for k, o in offsets.items()}


class _BatchNormForward:
    __slots__ = ("outputs", "prepared", "training")

    def __init__(self, norm: Any, input: torch.Tensor, key: tuple, training: bool, momentum: float,
                 eps: float, count: tuple[int, int] | None = None) -> None:
        shape = _ncl(input)
        self.training = training
        # y and the saved statistics (in evaluation empty ones, as the general route returns)
        stats = ((shape[1],), (1,), _FLOAT32) if training else ((0,), (1,), _FLOAT32)
        self.outputs = memory.Layouts([(input.shape, input.stride(), _FLOAT32), stats, stats] if training
                                      else [(input.shape, input.stride(), _FLOAT32), stats])
        offsets = {"x": key[3], "y": 0, "weight": key[4], "bias": key[5], "running_mean": key[6],
                   "running_var": key[7]}
        if training:
            offsets.update(save_mean=0, save_invstd=0)
        if count is not None:   # (the increment, the step count's offset): added by the first launch
            offsets.update(step_count=count[1])
        self.prepared = norm.prepare_forward(shape, _placed(offsets), training, eps, momentum, fusable=True,
                                             count_by=0 if count is None else count[0])


class _BatchNormBackward:
    __slots__ = ("mask", "outputs", "prepared", "train")

    def __init__(self, norm: Any, input: torch.Tensor, key: tuple, train: bool, eps: float,
                 mask: tuple[bool, bool, bool], masked: tuple[str, int, int] | None) -> None:
        shape = _ncl(input)
        self.train, self.mask = train, mask
        stats = ((shape[1],), (1,), _FLOAT32)
        # the outputs output_mask asks for: grad_input, grad_weight, grad_bias
        self.outputs = memory.Layouts([layout for layout, wanted in zip(
            ((input.shape, input.stride(), _FLOAT32), stats, stats), mask) if wanted])
        offsets = {"dy": key[3], "x": key[6], "weight": key[7], "y": 0 if mask[0] else None,
                   "grad_weight": 0 if mask[1] else None, "grad_bias": 0 if mask[2] else None}
        if train:
            offsets.update(save_mean=key[10], save_invstd=key[11])
        else:
            offsets.update(running_mean=key[8], running_var=key[9])
        if masked is not None:   # dy read through an activation's mask, the masked dy written on the way
            offsets.update(act=masked[1], masked_dy=masked[2])
        self.prepared = norm.prepare_backward(shape, _placed(offsets), train, eps, mask[0],
                                              None if masked is None else masked[0])


def _fast_batch_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                     running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
                     momentum: float, eps: float) -> tuple | None:
    """The forward by a pre-built call, or None where the general route serves the call."""
    if input.dtype is not _FLOAT32 or not input.is_contiguous():
        return None
    norm = state.get().norm
    key = ("fwd", input.shape, input.stride(), input.storage_offset(), _param(weight), _param(bias),
           _param(running_mean), _param(running_var), training, eps, momentum, norm.force_parts)
    calls = norm.calls
    call = calls.get(key, calls)
    if call is calls:   # (calls itself: not seen yet)
        eligible = (_NOT_PLAIN not in key[4:8] and input.dim() >= 2 and input.numel() > 0
                    and (training or (running_mean is not None and running_var is not None)))
        call = _BatchNormForward(norm, input, key, training, momentum, eps) if eligible else None
        call = _keep(calls, key, None if call is None or call.prepared is None else call)
    if call is None:
        return None
    # the buffers in the norm kernels' order: x, y, weight, bias, the running and the saved statistics
    buffers = [_buffers[input.untyped_storage().data_ptr()], None]
    for t in (weight, bias, running_mean, running_var):
        if t is not None:
            buffers.append(_buffers[t.untyped_storage().data_ptr()])
    outputs, out_buffers = call.outputs.empty()
    counter = None
    if call.training and state.get().device.holding:   # (last: nothing that may raise comes after the take)
        call, counter = _counting(norm, call, input, key, momentum, eps)
    buffers[1] = out_buffers[0]
    if call.training:
        y, save_mean, save_invstd = outputs
        buffers += out_buffers[1:]
    else:
        y, save_mean = outputs
        save_invstd = save_mean.detach()
    if counter is not None:
        buffers.append(counter)
    # (the held launch's payload keeps every tensor it reads or writes alive: see HeldNormalisation)
    call.prepared.enqueue(buffers, (input, weight, bias, running_mean, running_var, outputs))
    return y, save_mean, save_invstd


def _counting(norm: Any, call: _BatchNormForward, input: torch.Tensor, key: tuple, momentum: float,
              eps: float) -> tuple[_BatchNormForward, Any]:
    """``call``, or where a step count's increment waits, held, right before this training forward (a
    BatchNorm module's ``num_batches_tracked += 1``: :data:`tunecl.backend.ops.pointwise.STEP_COUNT_TAG`),
    the call whose first launch adds it instead, and the count's buffer: one launch fewer per layer."""
    device = state.get().device
    payload = device.peek_held(STEP_COUNT_TAG)
    if payload is None:
        return call, None
    count, by = payload
    counter = _buffers.get(count.untyped_storage().data_ptr())
    counted_key = (*key, by, count.storage_offset())
    calls = norm.calls
    counted = calls.get(counted_key, calls)
    if counted is calls:
        try:
            counted = _BatchNormForward(norm, input, key, True, momentum, eps, (by, count.storage_offset()))
        except Exception:   # (its kernels failed to build) the increment runs by itself, as it would have
            counted = None
        else:
            counted = None if counted.prepared is None else counted
        counted = _keep(calls, counted_key, counted)
    # the increment launches by itself (before this call's launches) where it cannot be taken over
    if counted is None or counter is None or device.take_held(STEP_COUNT_TAG) is not payload:
        return call, None
    eager_fusions["step_count"] += 1
    return counted, counter


def _fast_batch_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None,
                              running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                              save_mean: torch.Tensor | None, save_invstd: torch.Tensor | None, train: bool,
                              eps: float, output_mask: Sequence[bool], masked: tuple | None = None) -> tuple | None:
    """The backward by a pre-built call, or None where the general route serves the call. ``masked``: (mask,
    act, masked_dy), see :func:`_masked_backward` (the caller checked them)."""
    if (input.dtype is not _FLOAT32 or grad_out.dtype is not _FLOAT32 or not input.is_contiguous()
            or not grad_out.is_contiguous()):
        return None
    norm = state.get().norm
    mask = (bool(output_mask[0]), bool(output_mask[1]), bool(output_mask[2]))
    key = ("bwd", grad_out.shape, grad_out.stride(), grad_out.storage_offset(), input.shape, input.stride(),
           input.storage_offset(), _param(weight), _param(running_mean), _param(running_var), _param(save_mean),
           _param(save_invstd), train, eps, mask, norm.force_parts,
           None if masked is None else (masked[0], masked[1].storage_offset(), masked[2].storage_offset()))
    calls = norm.calls
    call = calls.get(key, calls)
    if call is calls:
        eligible = _NOT_PLAIN not in key[7:12] and input.dim() >= 2 and input.numel() > 0
        call = _BatchNormBackward(norm, input, key, train, eps, mask, key[16]) if eligible else None
        call = _keep(calls, key, None if call is None or call.prepared is None else call)
    if call is None:
        return None
    # the buffers in the norm kernels' order: x, y (grad_input), weight, the statistics, dy, the grads
    outputs, out_buffers = call.outputs.empty()
    made = iter(outputs)
    grad_input = next(made) if mask[0] else None
    grad_weight = next(made) if mask[1] else None
    grad_bias = next(made) if mask[2] else None
    buffers = [_buffers[input.untyped_storage().data_ptr()]]
    if mask[0]:
        buffers.append(out_buffers[0])
    if weight is not None:
        buffers.append(_buffers[weight.untyped_storage().data_ptr()])
    for t in (save_mean, save_invstd) if call.train else (running_mean, running_var):
        if t is not None:
            buffers.append(_buffers[t.untyped_storage().data_ptr()])
    buffers.append(_buffers[grad_out.untyped_storage().data_ptr()])
    buffers += out_buffers[1:] if mask[0] else out_buffers   # grad_weight's, grad_bias's
    if masked is not None:
        buffers += (_buffers[masked[1].untyped_storage().data_ptr()], _buffers[masked[2].untyped_storage().data_ptr()])
    call.prepared.enqueue(buffers)
    return grad_input, grad_weight, grad_bias


def native_batch_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
                      momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    try:
        result = _fast_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    except KeyError:   # _buffers: an operand on another device (the general route says what is wrong)
        result = None
    if result is not None:
        return result
    shape = _ncl(input)
    if not training and (running_mean is None or running_var is None):
        raise RuntimeError("running_mean and running_var must be defined in evaluation mode")
    plain = _plain(input, weight, bias, running_mean, running_var)
    if not plain:
        for stat in (running_mean, running_var):
            if stat is not None and not stat.is_contiguous():
                raise Unsupported("non-contiguous running statistics")  # updated in place
        half.check(input, weight, bias, running_mean, running_var)
        if any(s is not None and s.dtype != torch.float32 for s in (running_mean, running_var)):
            raise Unsupported("float16 running statistics")  # updated in place by the float32 kernel
    # float16 activations (autocast) run the float32 kernels on converted copies; like torch, the
    # saved statistics take the parameters' dtype (float32 next to float16 input)
    stat_dtype = next((p.dtype for p in (weight, bias, running_mean) if p is not None), input.dtype)
    x = input if plain else half.to_float32(input)
    y = memory.empty_dense(x)
    if training:
        save_mean, save_invstd = (memory.empty([shape[1]], [1], torch.float32) for _ in range(2))
    else:  # empty saved statistics, as the CPU kernel returns; two aliases of one (0.3 µs, an allocation 3.5)
        save_mean = memory.empty([0], [1], torch.float32)
        save_invstd = save_mean.detach()
    at = _at if plain else _at32
    ops = {"x": _at(x), "y": _at(y), "weight": at(weight), "bias": at(bias),
           "running_mean": _at(running_mean), "running_var": _at(running_var)}
    if training:
        ops.update(save_mean=_at(save_mean), save_invstd=_at(save_invstd))
    # (plain: y is a fresh contiguous float32 tensor, so an in-place relu of it may run inside the launch)
    state.get().norm.forward(shape, ops, training, eps, momentum, fusable=plain)
    return half.cast(y, input.dtype), half.cast(save_mean, stat_dtype), half.cast(save_invstd, stat_dtype)


def native_batch_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None,
                               running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                               save_mean: torch.Tensor | None, save_invstd: torch.Tensor | None, train: bool,
                               eps: float, output_mask: Sequence[bool]):
    if state.get().device.holding:
        grads = _masked_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train,
                                 eps, output_mask)
        if grads is not None:
            return grads
    try:
        grads = _fast_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                                          save_invstd, train, eps, output_mask)
    except KeyError:   # _buffers: an operand on another device (the general route says what is wrong)
        grads = None
    if grads is not None:
        return grads
    return _batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train,
                                eps, output_mask)


def _masked_backward(grad_out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None,
                     running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                     save_mean: torch.Tensor | None, save_invstd: torch.Tensor | None, train: bool, eps: float,
                     output_mask: Sequence[bool]) -> tuple | None:
    """The backward where ``grad_out`` is the output of an activation's backward that still waits, held
    (a relu's or relu6's after the batch norm, eagerly: :func:`tunecl.backend.ops.pointwise._dense_backward`):
    that launch is dropped and the batch norm's reduction computes it instead, reading the activation's
    gradient through its mask and writing the masked gradient into ``grad_out`` on the way, so ``grad_out``
    holds what it would have and every result is bit for bit the same, one launch fewer. None (nothing
    done) where the call does not qualify: no reduction (evaluation without parameter gradients), operands
    that are not contiguous float32 of one shape, or no such launch waiting."""
    if not (train or output_mask[1] or output_mask[2]) or grad_out.dtype is not _FLOAT32:
        return None
    buffer = _buffers.get(grad_out.untyped_storage().data_ptr())
    if buffer is None:
        return None
    device = state.get().device
    tag = masked_tag(buffer, grad_out)
    if device.peek_held(tag) is None:   # (first: most calls find no such launch waiting)
        return None
    if (input.shape != grad_out.shape
            or not _plain(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd)
            or input.dim() < 2 or not input.numel()
            or any(t is not None and t.untyped_storage().data_ptr() not in _buffers
                   for t in (input, weight, running_mean, running_var, save_mean, save_invstd))):
        return None   # (the activation's backward launches by itself; an operand on another device: the
                      # general route says what is wrong)
    payload = device.take_held(tag)
    if payload is None:
        return None
    mask, dy, act = payload   # (contiguous float32 tensors of grad_out's shape, see _dense_backward)
    eager_fusions["activation_backward"] += 1
    masked = (mask, act, grad_out)
    grads = _fast_batch_norm_backward(dy, input, weight, running_mean, running_var, save_mean, save_invstd, train,
                                      eps, output_mask, masked)
    if grads is not None:
        return grads
    return _batch_norm_backward(dy, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                                output_mask, act, mask, grad_out)


def _batch_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None,
                         running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                         save_mean: torch.Tensor | None, save_invstd: torch.Tensor | None, train: bool, eps: float,
                         output_mask: Sequence[bool], act: torch.Tensor | None = None,
                         mask: str | None = None, masked_dy: torch.Tensor | None = None) -> tuple:
    """The backward's general route; with ``act`` and ``mask`` (contiguous float32 operands only) dy is read
    through that activation's mask (see :func:`batch_norm_backward_masked`), and with ``masked_dy`` too the
    masked dy is written there (see :func:`_masked_backward`)."""
    shape = _ncl(input)
    c = shape[1]
    plain = _plain(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd)
    if not plain:
        half.check(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd)
    dy, x = (grad_out, input) if plain else (half.to_float32(grad_out), half.to_float32(input))
    param_dtype = weight.dtype if weight is not None else input.dtype
    grad_input = memory.empty_dense(x) if output_mask[0] else None
    grad_weight = memory.empty([c], [1], torch.float32) if output_mask[1] else None
    grad_bias = memory.empty([c], [1], torch.float32) if output_mask[2] else None
    at = _at if plain else _at32
    ops = {"dy": _at(dy), "x": _at(x), "weight": at(weight), "y": _at(grad_input),
           "grad_weight": _at(grad_weight), "grad_bias": _at(grad_bias), "act": _at(act),
           "masked_dy": _at(masked_dy)}
    if train:
        ops.update(save_mean=at(save_mean), save_invstd=at(save_invstd))
    else:
        ops.update(running_mean=at(running_mean), running_var=at(running_var))
    state.get().norm.backward(shape, ops, train, eps, grad_input is not None, mask=mask)
    return (None if grad_input is None else half.cast(grad_input, input.dtype),
            None if grad_weight is None else half.cast(grad_weight, param_dtype),
            None if grad_bias is None else half.cast(grad_bias, param_dtype))


def batch_norm_backward_masked(grad_out: torch.Tensor, act: torch.Tensor, mask: str, input: torch.Tensor,
                               weight: torch.Tensor | None, running_mean: torch.Tensor | None,
                               running_var: torch.Tensor | None, save_mean: torch.Tensor | None,
                               save_invstd: torch.Tensor | None, train: bool, eps: float,
                               output_mask: Sequence[bool]) -> tuple:
    """``native_batch_norm_backward`` of the gradient that the backward of the activation after the batch
    norm makes of ``grad_out``: ``mask`` "relu" for ``threshold_backward(grad_out, act, 0)`` (act: the relu's
    output), "relu6" for ``hardtanh_backward(grad_out, act, 0, 6)`` (act: its input). Where every tensor is
    contiguous float32 of one shape, the backward kernels read grad_out through that mask: no masked copy is
    made or read. A compiled backward graph calls this (:mod:`tunecl.backend.norm_fusion`)."""
    if (mask in ("relu", "relu6") and _plain(grad_out, input, act, weight, running_mean, running_var, save_mean,
                                               save_invstd)
            and act.shape == grad_out.shape == input.shape and act.device == grad_out.device):
        return _batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                                    train, eps, output_mask, act, mask)
    aten = torch.ops.aten
    if mask == "relu":
        grad = aten.threshold_backward.default(grad_out, act, 0)
    elif mask == "relu6":
        grad = aten.hardtanh_backward.default(grad_out, act, 0, 6)
    else:
        raise ValueError(f"mask must be 'relu' or 'relu6', not {mask!r}")
    return aten.native_batch_norm_backward.default(grad, input, weight, running_mean, running_var, save_mean,
                                                   save_invstd, train, eps, output_mask)


# -- pooling ---------------------------------------------------------------------------------------------
def _expand(values: Sequence[int] | int, n: int, default: Sequence[int] | None) -> tuple[int, ...]:
    """A pooling or convolution parameter as ``n`` ints: an int or a single value repeated, an empty list read
    as ``default``."""
    if isinstance(values, int):
        return (values,) * n
    values = list(values) or list(default or ())
    return (values[0],) * n if len(values) == 1 else tuple(values[i] for i in range(n))


def _pair(values: Sequence[int] | int, default: Sequence[int] | None = None) -> tuple[int, int]:
    return _expand(values, 2, default)


def triple(values: Sequence[int] | int, default: Sequence[int] | None = None) -> tuple[int, int, int]:
    return _expand(values, 3, default)


def pooled_size(size: int, kernel: int, pad: int, stride: int, dilation: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape."""
    out = (size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def max_pool_backward(grad_output: torch.Tensor, self: torch.Tensor, indices: torch.Tensor,
                      dims: int) -> torch.Tensor:
    """The input gradient of a max pooling over the last ``dims`` dims of ``self``: each output gradient added
    into the position its index names (a flat offset in its plane), in float32, rounded once."""
    size = math.prod(self.shape[-dims:])
    planes = self.numel() // size if size else 0
    grad = torch.zeros((planes, size), dtype=torch.float32, device=self.device)
    if grad_output.numel():
        grad.scatter_add_(1, indices.reshape(planes, -1), grad_output.float().reshape(planes, -1))
    return grad.view(self.shape).to(self.dtype)


def _planes(x: torch.Tensor) -> tuple[int, list[int]]:
    """(number of planes, leading dims) of a (N, C, H, W) or (C, H, W) tensor."""
    if x.dim() not in (3, 4):
        raise Unsupported(f"2-d pooling of a {x.dim()}-d tensor")
    lead = list(x.shape[:-2])
    return math.prod(lead), lead


def _window(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int] | int,
            dilation: Sequence[int] | int, ceil_mode: bool, count_include_pad: bool = True,
            divisor: int | None = None) -> Window:
    planes, _ = _planes(x)
    (kh, kw), (ph, pw), (dh, dw) = _pair(kernel_size), _pair(padding), _pair(dilation)
    sh, sw = _pair(stride, (kh, kw))
    h, w = x.shape[-2:]
    return Window(planes, h, w, pooled_size(h, kh, ph, sh, dh, ceil_mode), pooled_size(w, kw, pw, sw, dw, ceil_mode),
                  kh, kw, sh, sw, ph, pw, dh, dw, count_include_pad, divisor or 0)


def max_pool2d_out(self: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
                   padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,), ceil_mode: bool = False, *,
                   out: torch.Tensor, indices: torch.Tensor):
    win = _window(self, kernel_size, stride, padding, dilation, ceil_mode)
    x = half.to_float32(self)
    shape = _planes(self)[1] + [win.oh, win.ow]
    if not indices.is_contiguous() or list(indices.shape) != shape:
        raise Unsupported("max_pool2d indices must be a contiguous tensor of the output's shape")
    into_float32(out, shape, lambda o: state.get().pool("max_forward", win, operand(o), operand(x),
                                                              operand(indices)))
    return out, indices


def max_pool2d_backward(grad_output: torch.Tensor, self: torch.Tensor, kernel_size: Sequence[int],
                        stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool,
                        indices: torch.Tensor, *, grad_input: torch.Tensor) -> torch.Tensor:
    win = _window(self, kernel_size, stride, padding, dilation, ceil_mode)
    g, idx = half.to_float32(grad_output), contiguous_on_device(indices)
    return into_float32(grad_input, self.shape, lambda o: state.get().pool(
        "max_backward", win, operand(o), operand(g), operand(idx)))


def avg_pool2d_out(self: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
                   padding: Sequence[int] = (0,), ceil_mode: bool = False, count_include_pad: bool = True,
                   divisor_override: int | None = None, *, out: torch.Tensor) -> torch.Tensor:
    win = _window(self, kernel_size, stride, padding, 1, ceil_mode, count_include_pad, divisor_override)
    x = half.to_float32(self)
    shape = _planes(self)[1] + [win.oh, win.ow]
    return into_float32(out, shape, lambda o: state.get().pool("avg_forward", win, operand(o), operand(x)))


def avg_pool2d_backward(grad_output: torch.Tensor, self: torch.Tensor, kernel_size: Sequence[int],
                        stride: Sequence[int], padding: Sequence[int], ceil_mode: bool, count_include_pad: bool,
                        divisor_override: int | None, *, grad_input: torch.Tensor) -> torch.Tensor:
    win = _window(self, kernel_size, stride, padding, 1, ceil_mode, count_include_pad, divisor_override)
    g = half.to_float32(grad_output)
    return into_float32(grad_input, self.shape, lambda o: state.get().pool(
        "avg_backward", win, operand(o), operand(g)))


def _adaptive_window(x: torch.Tensor, output_size: Sequence[int]) -> Window:
    planes, _ = _planes(x)
    oh, ow = _pair(output_size)
    return Window(planes, x.shape[-2], x.shape[-1], oh, ow)


def adaptive_avg_pool2d_out(self: torch.Tensor, output_size: Sequence[int], *, out: torch.Tensor) -> torch.Tensor:
    win = _adaptive_window(self, output_size)
    x = half.to_float32(self)
    shape = _planes(self)[1] + [win.oh, win.ow]
    return into_float32(out, shape, lambda o: state.get().pool("adaptive_forward", win, operand(o), operand(x)))


def adaptive_avg_pool2d(self: torch.Tensor, output_size: Sequence[int]) -> torch.Tensor:
    win = _adaptive_window(self, output_size)
    out = memory.empty_contiguous(_planes(self)[1] + [win.oh, win.ow], self.dtype)
    return adaptive_avg_pool2d_out(self, output_size, out=out)


def adaptive_avg_pool2d_backward(grad_output: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
    win = _adaptive_window(self, grad_output.shape[-2:])
    g = half.to_float32(grad_output)
    grad_input = half.empty_like_float32(self.dtype, self.shape)
    state.get().pool("adaptive_backward", win, operand(grad_input), operand(g))
    return half.cast(grad_input, self.dtype)


# -- cat and dropout -----------------------------------------------------------------------------------
def cat_out(tensors: Sequence[torch.Tensor], dim: int = 0, *, out: torch.Tensor) -> torch.Tensor:
    # torch skips legacy empty tensors (shape (0,)) next to tensors of other ranks
    parts = [t for t in tensors if not (t.dim() == 1 and t.numel() == 0)]
    if not parts:
        return out
    ref = parts[0]
    dim %= max(ref.dim(), 1)
    shape = list(ref.shape)
    shape[dim] = sum(t.shape[dim] for t in parts)
    if list(out.shape) != shape:
        out.resize_(shape)
    buffer, base, strides, dtype = _buffers[out.untyped_storage().data_ptr()], out.storage_offset(), out.stride(), \
        kernel_dtype(out)
    position = 0
    pointwise = state.get().pointwise
    for t in parts:
        # the slice of out this part fills, described without creating a view
        target = Operand(buffer, base + position * strides[dim], strides, dtype)
        pointwise("copy", t.shape, target, [operand(t)])
        position += t.shape[dim]
    return out


def native_dropout(input: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropout with its mask stored as bool, drawn where :mod:`tunecl.backend.random_draws` says (on the
    device under a key from the CPU generator, or on the host as the CPU kernel draws it; in a graph
    capture from the graph's device generator, or on the host at every replay)."""
    if train is False or input.numel() == 0:
        mask = new_like(input, torch.bool)
        state.get().pointwise("fill", mask.shape, operand(mask), (), (True,))
        return run("copy", new_like(input), (input,)), mask
    keep = 1.0 - p
    scale = 0.0 if keep == 0 else 1.0 / keep
    shape, dtype = list(input.shape), input.dtype

    def host_mask() -> torch.Tensor:   # (as the CPU kernel draws it)
        return torch.empty(shape, dtype=dtype).bernoulli_(keep).bool()

    mask = None
    if graphs.capturing():   # each replay draws anew: on the host, or from the graph's device generator
        mask = memory.empty_contiguous(shape, torch.bool)
        if not graphs.draw_on_host(mask, host_mask, copies.write_bytes) and not graphs.bernoulli_(mask, keep):
            mask = None
    elif (done := random_draws.dropout(input, keep, scale)) is not None:
        return done
    elif not random_draws.on_host():
        mask = memory.empty_contiguous(shape, torch.bool)
        if not random_draws.bernoulli_(mask, keep):
            mask = None
    if mask is None:
        mask = copies.upload(host_mask())
    return run("scale_mask", new_like(input), (input, mask), (scale,)), mask


def native_dropout_backward(grad_output: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    return run("scale_mask", new_like(grad_output), (grad_output, mask), (scale,))


def native_group_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, n: int, c: int,
                      hxw: int, group: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch's composite group norm (reached by redispatching to a key without kernels) on a contiguous
    input: it reshapes the input with ``view``, which fails for a non-contiguous one."""
    return torch.ops.aten.native_group_norm.default.redispatch(
        COMPOSITE_KEYS, input.contiguous(), weight, bias, n, c, hxw, group, eps)


KERNELS: dict[str, Callable[..., Any]] = {
    "native_group_norm": native_group_norm,
    "nll_loss_forward.output": nll_loss_forward,
    "nll_loss_backward.grad_input": nll_loss_backward,
    "native_batch_norm": native_batch_norm,
    # the forms AOTAutograd's graphs (torch.compile) call: the same kernel, statistics spelled out
    "_native_batch_norm_legit": native_batch_norm,
    "_native_batch_norm_legit.no_stats": lambda input, weight, bias, training, momentum, eps: native_batch_norm(
        input, weight, bias, None, None, training, momentum, eps),
    "_native_batch_norm_legit_no_training": lambda input, weight, bias, running_mean, running_var, momentum, eps:
        native_batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps),
    "native_batch_norm_backward": native_batch_norm_backward,
    "max_pool2d_with_indices.out": max_pool2d_out,
    "max_pool2d_with_indices_backward.grad_input": max_pool2d_backward,
    "avg_pool2d.out": avg_pool2d_out,
    "avg_pool2d_backward.grad_input": avg_pool2d_backward,
    "_adaptive_avg_pool2d": adaptive_avg_pool2d,
    "adaptive_avg_pool2d.out": adaptive_avg_pool2d_out,
    "_adaptive_avg_pool2d_backward": adaptive_avg_pool2d_backward,
    "cat.out": cat_out,
    "native_dropout": native_dropout,
    "native_dropout_backward": native_dropout_backward,
}
