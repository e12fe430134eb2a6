"""Advanced indexing (``index_nd.cl``): gather, scatter and atomic accumulate of rows picked by element
offsets, and nonzero's coordinate rows."""

from __future__ import annotations

from collections.abc import Sequence

from tunecl.errors import Unsupported
from tunecl.kernels.strided import (BIT_TYPES, INT32_MAX, Operand, StridedFamily, merge_dims,
                                    meta_dtype, pack_meta)
from tunecl.kernels.sizes import round_up

_ACCUMULATE = {"float32": "float", "int32": "int"}
REST_RANK = 4
MAX_NONZERO_RANK = 8


class IndexNd(StridedFamily):
    source_file = "index_nd.cl"

    def rows(self, name: str, positions: int, rest: Sequence[int], self_: Operand, other: Operand,
             base: Operand, max_offset: int) -> None:
        """``index_gather``, ``index_scatter`` or ``index_accumulate`` over ``positions`` rows of shape
        ``rest``: ``self_``'s strides are its rest strides, ``other``'s its position stride then its rest
        strides; ``base`` holds the int64 element offsets (at most ``max_offset``) of the rows in self."""
        if self_.dtype != other.dtype:
            raise Unsupported(f"{name} of {other.dtype} into {self_.dtype}")
        if name == "index_accumulate" and self_.dtype not in _ACCUMULATE:
            raise Unsupported(f"accumulating index_put of {self_.dtype} (float32 and int32 only)")
        shape, (self_rest, other_rest) = merge_dims(list(rest), [self_.strides, other.strides[1:]])
        if len(shape) > REST_RANK:
            raise Unsupported(f"indexing with {len(shape)} non-mergeable other dims")
        count = positions * _prod(rest)
        if count == 0:
            return
        pad = REST_RANK - len(shape)
        shape, self_rest, other_rest = [1] * pad + shape, [0] * pad + self_rest, [0] * pad + other_rest
        reach = max(self_.offset + max_offset + sum((n - 1) * abs(s) for n, s in zip(shape, self_rest)),
                    other.offset + (positions - 1) * abs(other.strides[0])
                    + sum((n - 1) * abs(s) for n, s in zip(shape, other_rest)), base.offset + positions, count)
        idx = "long" if reach > INT32_MAX else "int"
        if name == "index_accumulate":
            element, flags = _ACCUMULATE[self_.dtype], ["-DFLOAT_ADD"] * (self_.dtype == "float32")
            options = [f"-DTA={element}"] + flags
        else:
            element = BIT_TYPES[self_.dtype]
            options = [f"-DT={element}"]
        key = (name, element, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self.cache.build(key, options + [f"-DIDX={idx}"], name, [None, None, None, meta_dtype(18, idx)])
        meta = [count, _prod(shape), *shape, self_.offset, *self_rest, other.offset, other.strides[0], *other_rest,
                base.offset]
        first, second = (other, self_) if name == "index_gather" else (self_, other)
        kernel(self.device.queue, (round_up(count, self.local),), (self.local,), first.buffer, second.buffer,
               base.buffer, pack_meta(meta, idx))

    def nonzero(self, shape: Sequence[int], out: Operand, mask: Operand, csum: Operand) -> None:
        """Rows of coordinates (int64, ``len(shape)`` each, from ``out``'s offset) of the nonzero elements of
        a contiguous uchar ``mask`` of ``shape``, given its int64 inclusive prefix sum ``csum`` (contiguous,
        offset 0 for both)."""
        rank = len(shape)
        count = _prod(shape)
        if rank > MAX_NONZERO_RANK:
            raise Unsupported(f"nonzero of a {rank}-d tensor")
        if count == 0 or rank == 0:
            return
        if mask.offset or csum.offset or out.offset:
            raise Unsupported("nonzero with offset operands")
        idx = "long" if count * rank > INT32_MAX else "int"
        key = ("nonzero_write", rank, idx)
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self.cache.build(key, [f"-DRANK={rank}", f"-DIDX={idx}"], "nonzero_write",
                                      [None, None, None, meta_dtype(rank + 1, idx)])
        kernel(self.device.queue, (round_up(count, self.local),), (self.local,), out.buffer, mask.buffer,
               csum.buffer, pack_meta([count, *shape], idx))


def _prod(values: Sequence[int]) -> int:
    result = 1
    for v in values:
        result *= v
    return result
