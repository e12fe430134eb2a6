"""``F.ctc_loss`` / ``nn.CTCLoss`` on the device: aten's ``_ctc_loss`` (the loss of each sample and its log_alpha)
and ``_ctc_loss_backward`` (the gradient wrt log_probs), by the kernels of :mod:`tunecl.kernels.ops.ctc`.

torch's composite ``ctc_loss`` above them unsqueezes an unbatched input, moves the targets to the device as
int64, reads lengths given as tensors to the host (so do the ``.Tensor`` overloads), zeroes infinite losses
for ``zero_infinity`` and reduces; autograd reaches ``_ctc_loss_backward`` through ``_ctc_loss``'s
derivative. The arguments are checked as torch's CPU kernel checks them, with its messages; a target length
beyond the input length is no error (its loss is infinite). Each sample's lengths and targets' offset go to
the device as one small int64 table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import copies, memory, state
from tunecl.backend.dtypes import scalar_type_name
from tunecl.backend.operands import operand
from tunecl.kernels.strided import Operand

_CHECKED = "(while checking arguments for ctc_loss_allocate_outputs)"


def _check(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Sequence[int],
           target_lengths: Sequence[int], blank: int) -> None:
    """torch's checks of ``_ctc_loss``'s arguments, in its order and with its messages."""
    if log_probs.dtype != torch.float32:
        raise NotImplementedError(f'"ctc_loss_opencl" not implemented for \'{scalar_type_name(log_probs.dtype)}\'')
    if log_probs.numel() == 0:
        raise RuntimeError("log_probs tensor must not be empty")
    if targets.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(f"Expected tensor for argument #2 'targets' to have scalar type Int; but got "
                           f"torch.{scalar_type_name(targets.dtype)}Tensor instead {_CHECKED}")
    if log_probs.dim() != 3:
        raise RuntimeError(f"Expected 3-dimensional tensor, but got {log_probs.dim()}-dimensional tensor for "
                           f"argument #1 'log_probs' {_CHECKED}")
    if not 1 <= targets.dim() <= 2:
        raise RuntimeError(f"Expected 1 to 2 dimensions, but got {targets.dim()}-dimensional tensor for "
                           f"argument #2 'targets' {_CHECKED}")
    steps, batch, labels = log_probs.shape
    if not 0 <= blank < labels:
        raise RuntimeError("blank must be in label range")
    if len(input_lengths) != batch:
        raise RuntimeError("input_lengths must be of size batch_size")
    if len(target_lengths) != batch:
        raise RuntimeError("target_lengths must be of size batch_size")
    for length in target_lengths:
        if length < 0:
            raise RuntimeError(f"Expected target_lengths to have value at least 0, but got value {length} "
                               f"{_CHECKED}")
    expected = sum(target_lengths) if targets.dim() == 1 else batch
    if targets.shape[0] != expected:
        raise RuntimeError(f"Expected tensor to have size {expected} at dimension 0, but got size "
                           f"{targets.shape[0]} for argument #2 'targets' {_CHECKED}")
    if targets.dim() == 2 and targets.shape[1] < max(target_lengths):
        raise RuntimeError(f"Expected tensor to have size at least {max(target_lengths)} at dimension 1, but got "
                           f"size {targets.shape[1]} for argument #2 'targets' {_CHECKED}")
    for length in input_lengths:
        if length < 0:
            raise RuntimeError(f"Expected input_lengths to have value at least 0, but got value {length} "
                               f"{_CHECKED}")
        if length > steps:
            raise RuntimeError(f"Expected input_lengths to have value at most {steps}, but got value {length} "
                               f"{_CHECKED}")


def _device_targets(targets: torch.Tensor) -> torch.Tensor:
    """``targets`` as an int64 device tensor of the same shape and strides (a 1-element stand-in when empty:
    no label is read then)."""
    if targets.numel() == 0:
        return memory.empty_contiguous([1], torch.int64)
    if targets.device.type != "opencl":
        return copies.upload(targets, torch.int64)
    if targets.dtype == torch.int64:
        return targets
    wide = memory.empty(targets.shape, copies.dense_strides_like(targets), torch.int64)
    copies.device_copy(wide, targets)
    return wide


def _sample_table(targets: torch.Tensor, input_lengths: Sequence[int], target_lengths: Sequence[int]
                  ) -> tuple[torch.Tensor, Operand]:
    """The (N, 3) int64 device table of each sample's input length, target length and targets' element
    offset, and the targets as an operand stepping along one sample's labels."""
    wide = _device_targets(targets)
    if targets.numel() == 0:
        starts = [0] * len(target_lengths)
        step = 0
    elif targets.dim() == 1:
        step = wide.stride(0)
        starts, position = [], 0
        for length in target_lengths:
            starts.append(wide.storage_offset() + position * step)
            position += length
    else:
        step = wide.stride(1)
        starts = [wide.storage_offset() + i * wide.stride(0) for i in range(len(target_lengths))]
    rows = [[int(i), int(t), s] for i, t, s in zip(input_lengths, target_lengths, starts)]
    table = copies.upload(torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 3))
    found = operand(wide)
    return table, Operand(found.buffer, 0, (step,), found.dtype)


def _on_device(t: torch.Tensor) -> torch.Tensor:
    return t if t.device.type == "opencl" else copies.upload(t)


def ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Sequence[int],
             target_lengths: Sequence[int], blank: int = 0, zero_infinity: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """aten's ``_ctc_loss``: (neg_log_likelihood (N,), log_alpha (N, T, 2 * max target length + 1))."""
    _check(log_probs, targets, input_lengths, target_lengths, blank)
    steps, batch, labels = log_probs.shape
    longest = max(target_lengths) if targets.dim() == 1 else targets.shape[1]
    width = 2 * longest + 1
    nll = memory.empty_contiguous([batch], log_probs.dtype)
    log_alpha = memory.empty_contiguous([batch, steps, width], log_probs.dtype)
    table, tg = _sample_table(targets, input_lengths, target_lengths)
    state.get().ctc.forward((steps, batch, labels, width), blank, operand(log_probs), tg, operand(table),
                            operand(nll), operand(log_alpha))
    return nll, log_alpha


def _vector(t: torch.Tensor, batch: int, name: str) -> Operand:
    """A (N,) (or 0-dim, for one sample) tensor as an operand with one stride."""
    if t.numel() != batch or t.dim() > 1:
        raise RuntimeError(f"_ctc_loss_backward: {name} of shape {list(t.shape)} for a batch of {batch}")
    found = operand(_on_device(t))
    return Operand(found.buffer, found.offset, (found.strides[0] if t.dim() else 0,), found.dtype)


def ctc_loss_backward(grad: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor,
                      input_lengths: Sequence[int], target_lengths: Sequence[int], neg_log_likelihood: torch.Tensor,
                      log_alpha: torch.Tensor, blank: int, zero_infinity: bool = False) -> torch.Tensor:
    """aten's ``_ctc_loss_backward``: the gradient wrt ``log_probs`` ((T, N, C) contiguous), 0 past each
    sample's input length (and for a sample whose loss is infinite, with ``zero_infinity``)."""
    _check(log_probs, targets, input_lengths, target_lengths, blank)
    steps, batch, labels = log_probs.shape
    longest = max(target_lengths) if target_lengths else 0
    if log_alpha.dim() != 3 or tuple(log_alpha.shape[:2]) != (batch, steps) or log_alpha.shape[2] < 2 * longest + 1:
        raise RuntimeError(f"_ctc_loss_backward: log_alpha of shape {list(log_alpha.shape)} for log_probs of "
                           f"shape {list(log_probs.shape)} and targets of length up to {longest}")
    alpha = copies.contiguous_on_device(_on_device(log_alpha))
    width = alpha.shape[2]
    log_beta = memory.empty_contiguous(alpha.shape, log_probs.dtype)
    links = memory.empty_contiguous([max(1, batch * (width // 2) * 2)], torch.int64)
    result = memory.empty_contiguous(log_probs.shape, log_probs.dtype)
    table, tg = _sample_table(targets, input_lengths, target_lengths)
    state.get().ctc.backward((steps, batch, labels, width), blank, zero_infinity, operand(log_probs), tg,
                             operand(table), _vector(neg_log_likelihood, batch, "neg_log_likelihood"),
                             operand(alpha), _vector(grad, batch, "grad"), operand(log_beta), operand(links),
                             operand(result))
    return result


def _host_lengths(input_lengths: torch.Tensor, target_lengths: torch.Tensor) -> tuple[list[int], list[int]]:
    """Lengths given as tensors, read to the host as torch's ``.Tensor`` overloads read them."""
    for name, lengths in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
            raise RuntimeError(f"{name} must be integral")
    return input_lengths.cpu().reshape(-1).tolist(), target_lengths.cpu().reshape(-1).tolist()


def ctc_loss_tensor(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                    target_lengths: torch.Tensor, blank: int = 0, zero_infinity: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    return ctc_loss(log_probs, targets, *_host_lengths(input_lengths, target_lengths), blank, zero_infinity)


def ctc_loss_backward_tensor(grad: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor,
                             input_lengths: torch.Tensor, target_lengths: torch.Tensor,
                             neg_log_likelihood: torch.Tensor, log_alpha: torch.Tensor, blank: int,
                             zero_infinity: bool = False) -> torch.Tensor:
    return ctc_loss_backward(grad, log_probs, targets, *_host_lengths(input_lengths, target_lengths),
                             neg_log_likelihood, log_alpha, blank, zero_infinity)


KERNELS: dict[str, Callable[..., Any]] = {
    "_ctc_loss": ctc_loss,
    "_ctc_loss.out": copies.out_overload(ctc_loss, "out0", "out1"),
    "_ctc_loss.Tensor": ctc_loss_tensor,
    "_ctc_loss.Tensor_out": copies.out_overload(ctc_loss_tensor, "out0", "out1"),
    "_ctc_loss_backward": ctc_loss_backward,
    "_ctc_loss_backward.out": copies.out_overload(ctc_loss_backward),
    "_ctc_loss_backward.Tensor": ctc_loss_backward_tensor,
}
