"""Sorting along one dim (``sort.cl``): a stable bitonic sort of every line in global scratch; topk takes
the first k of a sort, isin searches a sorted copy of the test elements."""

from __future__ import annotations

import numpy as np

from tunecl.errors import Unsupported
from tunecl.kernels.strided import (BIT_TYPES, CTYPES, INT32_MAX, Operand, StridedFamily,
                                    meta_dtype, pack_meta)
from tunecl.kernels.sizes import round_up



def padded(length: int) -> int:
    """The scratch slots a line of ``length`` elements takes: the next power of two."""
    return 1 << max(0, length - 1).bit_length()


class Sort(StridedFamily):
    source_file = "sort.cl"

    def sort(self, length: int, lines: tuple[int, int], src: Operand, values: Operand, indices: Operand,
             keys: Operand, pos: Operand, descending: bool, keep: int | None = None) -> None:
        """Sort every line of ``length`` elements of ``src`` into ``values`` (same dtype) and ``indices``
        (int64), the first ``keep`` (default all) of each line; ``lines`` = (A, B) and each of these
        operands' strides are (scan, a, b). ``keys`` (float for floating inputs, int64 otherwise) and
        ``pos`` (int64) are contiguous scratch of A * B * :func:`padded` (``length``) elements."""
        if values.dtype != src.dtype or src.dtype not in BIT_TYPES or indices.dtype != "int64":
            raise Unsupported(f"sort of {src.dtype} into {values.dtype} and {indices.dtype}")
        count = lines[0] * lines[1]
        slots = padded(length)
        total = count * slots
        if total == 0 or length == 0:
            return
        keep = length if keep is None else keep
        reach = max(abs(o.offset) + sum((n - 1) * abs(s) for n, s in zip((length, *lines), o.strides))
                    for o in (src, values, indices))
        idx = "long" if max(reach, total, keys.offset + total, pos.offset + total) > INT32_MAX else "int"
        floating = src.dtype in ("float32", "float16")
        flags = (("IS_FLOAT",) if floating else ()) + (("HALF_INPUT",) if src.dtype == "float16" else ()) \
            + (("DESCENDING",) if descending else ())
        options = [f"-DIDX={idx}", f"-DTK={'float' if floating else 'long'}",
                   f"-DTI={'half' if src.dtype == 'float16' else CTYPES[src.dtype]}",
                   f"-DT={BIT_TYPES[src.dtype]}"] + [f"-D{f}" for f in flags]
        meta = pack_meta([total, slots, length, lines[1], src.offset, *src.strides, values.offset, *values.strides,
                          indices.offset, *indices.strides, keep], idx)
        if keys.offset or pos.offset:
            raise Unsupported("sort scratch at an offset")
        grid, local = (round_up(total, self.local),), (self.local,)
        queue = self.device.queue
        self._kernel("sort_init", options, 3)(queue, grid, local, keys.buffer, pos.buffer, src.buffer, meta)
        step = self._kernel("sort_step", options, 2, (np.int64, np.int64))
        block = 2
        while block <= slots:
            distance = block // 2
            while distance:
                step(queue, grid, local, keys.buffer, pos.buffer, meta, np.int64(block), np.int64(distance))
                distance //= 2
            block *= 2
        self._kernel("sort_write", options, 4)(queue, grid, local, values.buffer, indices.buffer, pos.buffer,
                                               src.buffer, meta)

    def isin(self, count: int, elements: Operand, sorted_values: Operand, n: int, out: Operand,
             invert: bool) -> None:
        """``out`` (bool) = whether each of ``count`` ``elements`` is among the ``n`` ascending
        ``sorted_values`` (both float32 or int64, contiguous, like ``out``), negated with ``invert``."""
        if elements.dtype != sorted_values.dtype or elements.dtype not in ("float32", "int64"):
            raise Unsupported(f"isin of {elements.dtype} in {sorted_values.dtype}")
        if count == 0:
            return
        if elements.offset or sorted_values.offset or out.offset:
            raise Unsupported("isin operands at an offset")
        options = [f"-DTK={CTYPES[elements.dtype]}"] + ["-DINVERT"] * invert
        key = ("isin_sorted", tuple(options))
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self.cache.build(key, options, "isin_sorted", [None, None, None, np.int64, np.int64])
        kernel(self.device.queue, (round_up(count, self.local),), (self.local,), out.buffer, elements.buffer,
               sorted_values.buffer, np.int64(count), np.int64(n))

    def search_sorted(self, count: int, values: Operand, inner: int, sorted_values: Operand, n: int, rows: bool,
                      sorter: Operand | None, right: bool, out: Operand) -> None:
        """``out`` (int64 or int32) = the insertion point of each of ``count`` ``values`` in its row of ``n``
        ascending ``sorted_values`` (row ``i // inner``, or the one row unless ``rows``), read through
        ``sorter`` (int64 positions within the row) where given; the upper bound with ``right``. ``values``
        and ``sorted_values`` are both float32 or int64; every operand contiguous from offset 0."""
        if values.dtype != sorted_values.dtype or values.dtype not in ("float32", "int64") \
                or out.dtype not in ("int64", "int32") or (sorter is not None and sorter.dtype != "int64"):
            raise Unsupported(f"searchsorted of {values.dtype} in {sorted_values.dtype} into {out.dtype}")
        if count == 0:
            return
        if any(o is not None and o.offset for o in (values, sorted_values, sorter, out)):
            raise Unsupported("searchsorted operands at an offset")
        options = [f"-DTK={CTYPES[values.dtype]}", f"-DOUT_T={CTYPES[out.dtype]}"] + ["-DRIGHT"] * right \
            + ["-DSORTER"] * (sorter is not None)
        key = ("search_sorted", tuple(options))
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self.cache.build(key, options, "search_sorted", [None] * 4 + [np.int64] * 4)
        kernel(self.device.queue, (round_up(count, self.local),), (self.local,), out.buffer, values.buffer,
               sorted_values.buffer, sorter.buffer if sorter is not None else None, np.int64(count),
               np.int64(max(inner, 1)), np.int64(n), np.int64(rows))

    def _kernel(self, name: str, options: list[str], buffers: int, scalars: tuple = ()):
        key = (name, tuple(options))
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self.cache.build(key, options, name, [None] * buffers + [meta_dtype(17, "long" if
                                      "-DIDX=long" in options else "int"), *scalars])
        return kernel
