"""The ops transformers need beyond a CNN's (``transformer.cl``): the triangle masks (tril/triu), layer
norm forward and backward, and the embedding's backward.

Layer norm's launch geometry is set by LN_GROUP (work-items per row of the output and of the input gradient) and
LN_PARAM_TILE (columns x rows of a parameter-gradient work-group)."""

from __future__ import annotations

import math

import numpy as np

from tunecl.errors import Unsupported
from tunecl.kernels.strided import (BIT_TYPES, CTYPES, INT32_MAX, Operand, StridedFamily,
                                    meta_dtype, pack_meta, pow2_work_group, work_group)
from tunecl.kernels.sizes import round_up
from tunecl.runtime import Device

LN_GROUP = 256
LN_PARAM_TILE = (32, 8)


class Transformer(StridedFamily):
    source_file = "transformer.cl"

    def __init__(self, device: Device):
        super().__init__(device)
        self.ln_group = pow2_work_group(device, LN_GROUP)
        cols, rows = LN_PARAM_TILE
        self.ln_tile = (cols, max(1, min(rows, work_group(device, cols * rows) // cols)))

    def tri(self, lower: bool, batch: int, rows: int, cols: int, diagonal: int, out: Operand, src: Operand) -> None:
        """``out = tril(src, diagonal)`` (``lower``) or ``triu``, over ``batch`` matrices of ``rows`` x ``cols``;
        each operand's strides are (batch, row, column)."""
        if out.dtype != src.dtype or out.dtype not in BIT_TYPES:
            raise Unsupported(f"tril/triu of {src.dtype} into {out.dtype}")
        count = batch * rows * cols
        if count == 0:
            return
        k = max(-rows - 1, min(cols + 1, diagonal))   # past either edge, every element is kept or cleared
        reach = max(abs(o.offset) + sum((n - 1) * abs(s) for n, s in zip((batch, rows, cols), o.strides))
                    for o in (out, src))
        idx = "long" if max(count, reach) > INT32_MAX else "int"
        bits = BIT_TYPES[out.dtype]
        key = ("tri", lower, bits, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DT={bits}", f"-DIDX={idx}"] + ["-DLOWER"] * lower
            kernel = self.cache.build(key, options, "tri_kernel", [None, None, meta_dtype(12, idx)])
        meta = [count, rows, cols, k, src.offset, *src.strides, out.offset, *out.strides]
        kernel(self.device.queue, (round_up(count, self.local),), (self.local,), out.buffer, src.buffer,
               pack_meta(meta, idx))

    def layer_norm_forward(self, rows: int, cols: int, x: Operand, weight: Operand | None, bias: Operand | None,
                           eps: float, y: Operand, mean: Operand, rstd: Operand) -> None:
        """Layer norm over ``rows`` rows of ``cols`` elements: ``y``, and each row's ``mean`` and ``rstd``
        (1 / sqrt(variance + eps)). Every operand is contiguous float32 (only its buffer and offset are
        read); a weight or bias given as None is left out."""
        if not rows * cols:
            return
        span = max(o.offset for o in (x, weight, bias, y, mean, rstd) if o is not None) + rows * cols + rows + cols
        idx = "long" if span > INT32_MAX else "int"
        meta = pack_meta([rows, cols] + [0 if o is None else o.offset for o in (
            x, bias, weight, mean, rstd, y, None, None)], idx)
        flags = ("HAS_WEIGHT",) * (weight is not None) + ("HAS_BIAS",) * (bias is not None)
        kernel = self._ln_kernel("ln_forward", flags, idx, (np.float32,))   # (eps before the meta)
        kernel(self.device.queue, (rows * self.ln_group,), (self.ln_group,), y.buffer, mean.buffer, rstd.buffer,
               x.buffer, None if weight is None else weight.buffer, None if bias is None else bias.buffer,
               np.float32(eps), meta)

    def layer_norm_backward(self, rows: int, cols: int, x: Operand, dy: Operand, weight: Operand | None,
                            mean: Operand, rstd: Operand, dx: Operand | None, grad_weight: Operand | None,
                            grad_bias: Operand | None) -> None:
        """Layer norm's gradients over ``rows`` rows of ``cols`` elements. Every operand is contiguous float32
        (only its buffer and offset are read); the gradients given as None are not computed."""
        span = max(o.offset for o in (x, dy, mean, rstd, weight, dx, grad_weight, grad_bias) if o is not None) \
            + rows * cols + rows + cols
        idx = "long" if span > INT32_MAX else "int"
        meta = pack_meta([rows, cols] + [0 if o is None else o.offset for o in (
            x, dy, weight, mean, rstd, dx, grad_weight, grad_bias)], idx)
        queue = self.device.queue
        if dx is not None and rows * cols:
            flags = ("HAS_WEIGHT",) if weight is not None else ()
            kernel = self._ln_kernel("ln_backward_input", flags, idx)
            kernel(queue, (rows * self.ln_group,), (self.ln_group,), dx.buffer, x.buffer, dy.buffer,
                   None if weight is None else weight.buffer, mean.buffer, rstd.buffer, meta)
        if (grad_weight is not None or grad_bias is not None) and cols:
            flags = ("HAS_GW",) * (grad_weight is not None) + ("HAS_GB",) * (grad_bias is not None)
            kernel = self._ln_kernel("ln_backward_params", flags, idx)
            tile_cols, tile_rows = self.ln_tile
            kernel(queue, (math.ceil(cols / tile_cols) * tile_cols, tile_rows), self.ln_tile,
                   None if grad_weight is None else grad_weight.buffer,
                   None if grad_bias is None else grad_bias.buffer, x.buffer, dy.buffer, mean.buffer, rstd.buffer,
                   meta)

    def _ln_kernel(self, name: str, flags: tuple[str, ...], idx: str, scalars: tuple = ()):
        key = (name, flags, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            cols, rows = self.ln_tile
            options = [f"-DIDX={idx}", f"-DGROUP={self.ln_group}", f"-DPCOLS={cols}", f"-DPROWS={rows}"]
            kernel = self.cache.build(key, options + [f"-D{f}" for f in flags], name,
                                      [None] * 6 + list(scalars) + [meta_dtype(10, idx)])
        return kernel

    def embedding_backward(self, rows: int, positions: int, dims: int, index: Operand, grad: Operand,
                           padding_idx: int, scale: bool, first: Operand, links: Operand, count: Operand,
                           grad_weight: Operand) -> None:
        """``grad_weight`` (``rows`` x ``dims``) = the rows of ``grad`` (contiguous (``positions``, ``dims``)
        float32) summed by their index (contiguous int64 or int32, ``positions`` of them; one outside
        [0, ``rows``) adds nothing); ``first``, ``links`` and ``count`` are int32 scratch of ``rows``,
        ``positions`` and ``rows`` elements."""
        if index.dtype not in ("int64", "int32"):
            raise Unsupported(f"embedding backward with {index.dtype} indices")
        if positions > INT32_MAX:
            raise Unsupported(f"embedding backward of {positions} indices")
        if rows * dims == 0:
            return
        span = max(index.offset + positions, grad.offset + positions * dims, grad_weight.offset + rows * dims)
        idx = "long" if span > INT32_MAX else "int"
        tidx = CTYPES[index.dtype]
        meta = pack_meta([rows, positions, dims, padding_idx, index.offset, grad.offset, grad_weight.offset], idx)
        link = self._emb_kernel("emb_link", (), idx, tidx)
        queue = self.device.queue
        link(queue, (round_up(rows, self.local),), (self.local,), first.buffer, links.buffer, count.buffer,
             index.buffer, meta)
        add = self._emb_kernel("emb_sum", ("SCALE",) * scale, idx, tidx)
        tile = min(dims, 64, self.local)
        add(queue, (round_up(dims, tile), rows), (tile, 1), grad_weight.buffer, grad.buffer, first.buffer,
            links.buffer, count.buffer, meta)

    def _emb_kernel(self, name: str, flags: tuple[str, ...], idx: str, tidx: str):
        key = (name, flags, idx, tidx)
        kernel = self.cache.get(key)
        if kernel is None:
            options = [f"-DIDX={idx}", f"-DTIDX={tidx}"] + [f"-D{f}" for f in flags]
            buffers = 4 if name == "emb_link" else 5
            kernel = self.cache.build(key, options, name, [None] * buffers + [meta_dtype(7, idx)])
        return kernel
