"""2-d nearest and bilinear upsampling (``upsample.cl``), forward and backward, on strided (N, C, H, W)
operands; the source scales follow torch's CPU kernels (``ATen/native/UpSample.h``)."""

from __future__ import annotations

import numpy as np

from tunecl.errors import Unsupported
from tunecl.kernels.strided import (BIT_TYPES, INT32_MAX, Operand, StridedFamily, meta_dtype,
                                    pack_meta)
from tunecl.kernels.sizes import round_up

IDENTITY = -1.0   # the scale of an axis whose sizes are equal: torch copies it one to one


def scale_value(scale: float | None, size_in: int, size_out: int) -> float:
    """torch's ``compute_scales_value<float>``: 1 / the given scale factor, else in / out, in float32."""
    if scale is not None and scale > 0:
        return float(np.float32(1.0 / scale))
    return float(np.float32(size_in) / np.float32(size_out))


def nearest_scale(scale: float | None, size_in: int, size_out: int, exact: bool) -> float:
    """The source scale of a nearest axis (``nearest_idx``: equal sizes copy, double sizes halve)."""
    if not exact:
        if size_out == size_in:
            return IDENTITY
        if size_out == 2 * size_in:
            return 0.5
    return scale_value(scale, size_in, size_out)


def linear_scale(scale: float | None, size_in: int, size_out: int, align_corners: bool) -> float:
    """The source scale of a bilinear axis (``area_pixel_compute_scale``; equal sizes copy)."""
    if size_out == size_in:
        return IDENTITY
    if align_corners:
        return float(np.float32(size_in - 1) / np.float32(size_out - 1)) if size_out > 1 else 0.0
    return scale_value(scale, size_in, size_out)


class Upsample(StridedFamily):
    source_file = "upsample.cl"

    def __call__(self, name: str, large: tuple[int, int, int, int], small: tuple[int, int], dst: Operand,
                 src: Operand, scales: tuple[float, float], exact: bool = False, align_corners: bool = False
                 ) -> None:
        """Run kernel ``name`` (``up_nearest``, ``up_nearest_backward``, ``up_bilinear``,
        ``up_bilinear_backward``) between the resampled side of shape ``large`` (N, C, OH, OW) and the input
        side of ``small`` (IH, IW). The forward kernels read ``src`` from the input side and write ``dst`` on
        the resampled side, the backward kernels the reverse; both operands carry four strides. Nearest
        forward moves any dtype's bits; the others take float32 operands."""
        n, c, oh, ow = large
        ih, iw = small
        forward = not name.endswith("_backward")
        count = n * c * (oh * ow if forward else ih * iw)
        if count == 0:
            return
        if name == "up_nearest":
            if dst.dtype != src.dtype or dst.dtype not in BIT_TYPES:
                raise Unsupported(f"nearest upsampling of {src.dtype} into {dst.dtype}")
            element = BIT_TYPES[dst.dtype]
        elif dst.dtype != "float32" or src.dtype != "float32":
            raise Unsupported(f"{name} of {src.dtype} into {dst.dtype} (float32 kernels)")
        else:
            element = "float"
        src_shape = (n, c, ih, iw) if forward else (n, c, oh, ow)
        dst_shape = (n, c, oh, ow) if forward else (n, c, ih, iw)
        reach = max(abs(o.offset) + sum((d - 1) * abs(s) for d, s in zip(shape, o.strides))
                    for o, shape in ((src, src_shape), (dst, dst_shape)))
        idx = "long" if max(count, reach) > INT32_MAX else "int"
        exact = exact and name.startswith("up_nearest")
        align_corners = align_corners and name.startswith("up_bilinear")
        key = (name, element, idx, exact, align_corners)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DT={element}", f"-DIDX={idx}"] + ["-DEXACT"] * exact
            options += ["-DALIGN_CORNERS"] * align_corners
            kernel = self.cache.build(key, options, name,
                                      [None, None, meta_dtype(16, idx), np.float32, np.float32])
        meta = [count, c, oh, ow, ih, iw, src.offset, *src.strides, dst.offset, *dst.strides]
        kernel(self.device.queue, (round_up(count, self.local),), (self.local,), dst.buffer, src.buffer,
               pack_meta(meta, idx), np.float32(scales[0]), np.float32(scales[1]))
