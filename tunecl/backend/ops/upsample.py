"""2-d upsampling: nearest, nearest-exact and bilinear (align_corners either way), forward and backward.

torch's functional and ``.vec`` forms (``F.interpolate``) reach the ``.out``/``.grad_input`` overloads
here with the output allocated in the input's memory format; every kernel reads and writes through
strides. Nearest forward moves raw bits (any dtype); the rest computes in float32 (float16 through
float32 copies, rounded back once, as torch's CPU kernels accumulate float16 in float32)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tunecl.backend import copies, half, memory, state
from tunecl.backend.operands import operand
from tunecl.kernels.ops.upsample import linear_scale, nearest_scale


def _check(what: str, shape: Sequence[int], output_size: Sequence[int],
           grad_output: torch.Tensor | None = None) -> None:
    """The input ``shape`` and ``output_size`` of an upsampling (a backward's ``grad_output`` too)."""
    if len(shape) != 4:
        raise RuntimeError(f"{what}: expected a 4-d (N, C, H, W) input, got sizes {list(shape)}")
    if len(output_size) != 2 or min(output_size) <= 0:
        raise RuntimeError(f"{what}: output_size must be two positive sizes, got {list(output_size)}")
    if min(shape[1:]) <= 0:
        raise RuntimeError(f"{what}: non-empty channels and spatial sizes expected, got sizes {list(shape)}")
    if grad_output is not None and list(grad_output.shape) != [*shape[:2], *output_size]:
        raise RuntimeError(f"{what}: grad_output has sizes {list(grad_output.shape)}, expected "
                           f"{[*shape[:2], *output_size]}")


def _launch(name: str, large: Sequence[int], small: Sequence[int], dst: torch.Tensor, src: torch.Tensor,
            scales: tuple[float, float], **flags: bool) -> torch.Tensor:
    """Run ``name`` from ``src`` into ``dst``; float32 kernels take float16 tensors through float32 copies."""
    if name != "up_nearest":
        half.check(dst, src)
        src = half.to_float32(src) if src.dtype != torch.float32 else src
    target = dst if name == "up_nearest" or dst.dtype == torch.float32 else \
        memory.empty_contiguous(dst.shape, torch.float32)
    state.get().upsample(name, tuple(large), tuple(small), operand(target), operand(src), scales, **flags)
    if target is not dst:
        copies.device_copy(dst, target)
    return dst


def _resized(out: torch.Tensor, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    if list(out.shape) != list(shape):
        out.resize_(shape, memory_format=torch.channels_last if like.dim() == 4 and not like.is_contiguous()
                    and like.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format)
    return out


def _nearest(exact: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
    what = "_upsample_nearest_exact2d" if exact else "upsample_nearest2d"

    def forward(self: torch.Tensor, output_size: Sequence[int], scales_h: float | None = None,
                scales_w: float | None = None, *, out: torch.Tensor) -> torch.Tensor:
        _check(what, self.shape, output_size)
        (n, c, ih, iw), (oh, ow) = self.shape, output_size
        _resized(out, (n, c, oh, ow), self)
        if out.dtype != self.dtype:
            raise RuntimeError(f"{what}: out has dtype {out.dtype}, expected {self.dtype}")
        scales = (nearest_scale(scales_h, ih, oh, exact), nearest_scale(scales_w, iw, ow, exact))
        return _launch("up_nearest", (n, c, oh, ow), (ih, iw), out, self, scales, exact=exact)

    def backward(grad_output: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int],
                 scales_h: float | None = None, scales_w: float | None = None, *,
                 grad_input: torch.Tensor) -> torch.Tensor:
        _check(f"{what}_backward", input_size, output_size, grad_output)
        (n, c, ih, iw), (oh, ow) = input_size, output_size
        _resized(grad_input, input_size, grad_output)
        scales = (nearest_scale(scales_h, ih, oh, exact), nearest_scale(scales_w, iw, ow, exact))
        return _launch("up_nearest_backward", (n, c, oh, ow), (ih, iw), grad_input, grad_output, scales,
                       exact=exact)

    return forward, backward


def upsample_bilinear2d_out(self: torch.Tensor, output_size: Sequence[int], align_corners: bool,
                            scales_h: float | None = None, scales_w: float | None = None, *,
                            out: torch.Tensor) -> torch.Tensor:
    _check("upsample_bilinear2d", self.shape, output_size)
    (n, c, ih, iw), (oh, ow) = self.shape, output_size
    _resized(out, (n, c, oh, ow), self)
    scales = (linear_scale(scales_h, ih, oh, align_corners), linear_scale(scales_w, iw, ow, align_corners))
    return _launch("up_bilinear", (n, c, oh, ow), (ih, iw), out, self, scales, align_corners=align_corners)


def upsample_bilinear2d_backward(grad_output: torch.Tensor, output_size: Sequence[int],
                                 input_size: Sequence[int], align_corners: bool,
                                 scales_h: float | None = None, scales_w: float | None = None, *,
                                 grad_input: torch.Tensor) -> torch.Tensor:
    _check("upsample_bilinear2d_backward", input_size, output_size, grad_output)
    (n, c, ih, iw), (oh, ow) = input_size, output_size
    _resized(grad_input, input_size, grad_output)
    scales = (linear_scale(scales_h, ih, oh, align_corners), linear_scale(scales_w, iw, ow, align_corners))
    return _launch("up_bilinear_backward", (n, c, oh, ow), (ih, iw), grad_input, grad_output, scales,
                   align_corners=align_corners)


_nearest_out, _nearest_backward = _nearest(False)
_exact_out, _exact_backward = _nearest(True)

KERNELS: dict[str, Callable[..., Any]] = {
    "upsample_nearest2d.out": _nearest_out,
    "upsample_nearest2d_backward.grad_input": _nearest_backward,
    "_upsample_nearest_exact2d.out": _exact_out,
    "_upsample_nearest_exact2d_backward.grad_input": _exact_backward,
    "upsample_bilinear2d.out": upsample_bilinear2d_out,
    "upsample_bilinear2d_backward.grad_input": upsample_bilinear2d_backward,
}
