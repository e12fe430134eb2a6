"""3-d convolutions (``nn.Conv3d``, ``F.conv3d``) and transposed ones (``nn.ConvTranspose3d``) by the 2-d
convolution plans, forward and backward.

A 3-d convolution is a sum over its kernel's depth taps of 2-d convolutions: output depth ``d`` reads input
depth ``d * stride + k * dilation - padding`` through the weight's tap ``k``. For each tap the input depths
it reads (a zero slice where that falls into the padding) are gathered into one batch of ``N * D_out``
images, and the tap's 2-d convolution runs on it by the backend's 2-d route (its tuned plans, or its
fallback); the taps' outputs are summed, the bias added once.

The backward runs each tap's 2-d backward on the same batch: the weight gradient's tap ``k`` is that tap's
weight gradient, and the input gradient sums each tap's input gradient back into the depths it read
(``index_add``, in float32; the padding's zero slice dropped). The bias gradient is one sum over the output
gradient.

A transposed 3-d convolution is the adjoint of the regular one with the same weight: its output is that
convolution's input gradient, its input gradient that convolution's output, and its weight gradient that
convolution's weight gradient with the roles of input and output gradient swapped. Where the output padding
is not below the stride (torch allows it below the dilation), no regular convolution maps the output back
to the input's size: such calls take the counted CPU route, as their 2-d kind does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tunecl.backend.ops.device_tables import DeviceTables
from tunecl.backend.ops.nn import triple
from tunecl.errors import Unsupported

_maps = DeviceTables(256)   # (depth, taps, stride, padding, dilation) -> depth maps


def output_depth(depth: int, taps: int, stride: int, padding: int, dilation: int) -> int:
    return (depth + 2 * padding - dilation * (taps - 1) - 1) // stride + 1


def depth_reads(depth: int, taps: int, stride: int, padding: int, dilation: int, out: int) -> torch.Tensor:
    """(taps, out) int64: the input depth each of ``out`` output depths reads through each tap of a window
    along depth, or ``depth`` (a padding slice appended after the input's last depth) where that is padding."""
    read = torch.arange(out).view(1, out) * stride + torch.arange(taps).view(taps, 1) * dilation - padding
    return torch.where((read >= 0) & (read < depth), read, depth)


def _depth_maps(depth: int, taps: int, stride: int, padding: int, dilation: int,
                device: torch.device) -> torch.Tensor:
    """(taps, D_out) int64 on the device: :func:`depth_reads` of the convolution's output depths."""
    out = output_depth(depth, taps, stride, padding, dilation)
    return _maps.get((depth, taps, stride, padding, dilation), device,
                     lambda: depth_reads(depth, taps, stride, padding, dilation, out))


def _depth_first(input: torch.Tensor) -> torch.Tensor:
    """(N, C, D, H, W) -> (N, D + 1, C, H, W), contiguous, the last depth a zero slice."""
    n, c, d, h, w = input.shape
    out = torch.zeros((n, d + 1, c, h, w), dtype=input.dtype, device=input.device)
    out[:, :d] = input.permute(0, 2, 1, 3, 4)
    return out


def _tap_input(padded: torch.Tensor, maps: torch.Tensor, k: int) -> torch.Tensor:
    """The batch of N * D_out input slices that tap ``k`` reads: (N * D_out, C, H, W)."""
    n, _, c, h, w = padded.shape
    return padded.index_select(1, maps[k]).view(n * maps.shape[1], c, h, w)


Conv2d = Callable[..., torch.Tensor]


def forward(conv2d: Conv2d, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int) -> torch.Tensor:
    """The 3-d convolution by ``conv2d`` (the backend's 2-d ``convolution_overrideable`` adapter)."""
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = triple(stride), triple(padding), triple(dilation)
    n, taps = input.shape[0], weight.shape[2]
    maps = _depth_maps(input.shape[2], taps, sd, pd, dd, input.device)
    out_depth = maps.shape[1]
    padded = _depth_first(input)
    total = None
    for k in range(taps):
        y = conv2d(_tap_input(padded, maps, k), weight[:, :, k].contiguous(), bias if k == 0 else None,
                   (sh, sw), (ph, pw), (dh, dw), False, (0, 0), groups)
        total = y if total is None else total.add_(y)
    o, out_h, out_w = total.shape[1:]
    return total.view(n, out_depth, o, out_h, out_w).permute(0, 2, 1, 3, 4).contiguous()


def backward(conv2d_backward: Callable[..., tuple], grad_output: torch.Tensor, input: torch.Tensor,
             weight: torch.Tensor, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
             groups: int, output_mask: Sequence[bool]) -> tuple[torch.Tensor | None, ...]:
    """(grad_input, grad_weight, grad_bias) by ``conv2d_backward`` (the backend's 2-d
    ``convolution_backward_overrideable`` adapter), each where ``output_mask`` asks for it."""
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = triple(stride), triple(padding), triple(dilation)
    n, _, depth = input.shape[:3]
    taps = weight.shape[2]
    maps = _depth_maps(depth, taps, sd, pd, dd, input.device)
    o, out_depth = grad_output.shape[1:3]
    grad = grad_output.permute(0, 2, 1, 3, 4).reshape(n * out_depth, o, *grad_output.shape[3:])
    c, h, w = input.shape[1], input.shape[3], input.shape[4]
    # the input's values serve the weight gradient only; the input gradient reads its shape
    padded = _depth_first(input) if output_mask[1] else None
    # (the input gradient sums in float32: index_add adds float32)
    grad_padded = torch.zeros((n, depth + 1, c, h, w), dtype=torch.float32, device=input.device) \
        if output_mask[0] else None
    grad_weight = torch.empty_like(weight) if output_mask[1] else None
    for k in range(taps):
        tap_input = _tap_input(padded, maps, k) if padded is not None else \
            torch.empty((n * out_depth, c, h, w), dtype=input.dtype, device=input.device)
        grad_tap, grad_weight_tap, _ = conv2d_backward(
            grad, tap_input, weight[:, :, k].contiguous(), (sh, sw), (ph, pw), (dh, dw), False, (0, 0), groups,
            (output_mask[0], output_mask[1], False))
        if grad_padded is not None:
            grad_padded.index_add_(1, maps[k], grad_tap.view(n, out_depth, *grad_tap.shape[1:]).float())
        if grad_weight is not None:
            grad_weight[:, :, k] = grad_weight_tap
    grad_input = None
    if grad_padded is not None:
        grad_input = grad_padded[:, :depth].permute(0, 2, 1, 3, 4).to(input.dtype,
                                                                       memory_format=torch.contiguous_format)
    grad_bias = grad_output.sum((0, 2, 3, 4)) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


def transposed_forward(conv2d_backward: Callable[..., tuple], input: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None, stride: Sequence[int], padding: Sequence[int],
                       output_padding: Sequence[int], dilation: Sequence[int], groups: int) -> torch.Tensor:
    """The transposed 3-d convolution: the input gradient of the regular one it is the adjoint of (whose output
    is ``input`` and whose weight is ``weight``), by :func:`backward`; the bias added once."""
    stride, padding, output_padding, dilation = (triple(v) for v in (stride, padding, output_padding, dilation))
    _check_output_padding(output_padding, stride)
    size = [(n - 1) * s - 2 * p + d * (k - 1) + op + 1 for n, s, p, d, k, op in
            zip(input.shape[2:], stride, padding, dilation, weight.shape[2:], output_padding)]
    shape = (input.shape[0], weight.shape[1] * groups, *size)
    regular_input = torch.empty(shape, dtype=input.dtype, device=input.device)   # (its shape is what is read)
    out = backward(conv2d_backward, input, regular_input, weight, stride, padding, dilation, groups,
                   (True, False, False))[0]
    return out if bias is None else out.add_(bias.view(1, -1, 1, 1, 1))


def _check_output_padding(output_padding: Sequence[int], stride: Sequence[int]) -> None:
    """Unsupported where the output padding is not below the stride (torch allows it below the dilation): then
    no regular convolution maps the larger output back to the input's size."""
    if any(p >= s for p, s in zip(triple(output_padding), triple(stride))):
        raise Unsupported(f"output_padding {triple(output_padding)} must be smaller than the stride "
                          f"{triple(stride)}")


def transposed_backward(conv2d: Conv2d, conv2d_backward: Callable[..., tuple], grad_output: torch.Tensor,
                        input: torch.Tensor, weight: torch.Tensor, stride: Sequence[int], padding: Sequence[int],
                        output_padding: Sequence[int], dilation: Sequence[int], groups: int,
                        output_mask: Sequence[bool]) -> tuple[torch.Tensor | None, ...]:
    """The transposed 3-d convolution's gradients: the input's is the regular convolution of the output
    gradient, the weight's that regular convolution's weight gradient with the roles swapped."""
    _check_output_padding(output_padding, stride)
    grad_input = forward(conv2d, grad_output, weight, None, stride, padding, dilation, groups) \
        if output_mask[0] else None
    grad_weight = backward(conv2d_backward, input, grad_output, weight, stride, padding, dilation, groups,
                           (False, True, False))[1] if output_mask[1] else None
    grad_bias = grad_output.sum((0, 2, 3, 4)) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias
