"""The random family: Philox4x32-10 draws on the device (``random.cl``): from a key and counter held in a
device buffer, for the random ops inside a captured graph (see :mod:`tunecl.backend.graphs`), or from a
key passed with the draw (eager dropout and ``bernoulli_``)."""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from tunecl.kernels.strided import StridedFamily


class Random(StridedFamily):
    source_file = "random.cl"

    def _kernel(self, name: str, dtypes: list) -> cl.Kernel:
        kernel = self.cache.get(name)
        return kernel if kernel is not None else self.cache.build(name, [], name, dtypes)

    def new_state(self, seed: int) -> cl.Buffer:
        """A device buffer holding the key from ``seed`` (64 bits) and a zero counter."""
        words = np.array([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, 0, 0], dtype=np.uint32)
        return cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=words)

    def bernoulli(self, out: cl.Buffer, offset: int, n: int, p: float, state: cl.Buffer,
                  dtype: str = "float32") -> None:
        """``out[offset:offset + n]`` (``dtype`` "float32" or "bool" elements) = 1 with probability ``p``,
        else 0; then the state's counter moves past the ``n`` numbers drawn."""
        if dtype not in ("float32", "bool"):
            raise ValueError(f"a Bernoulli draw fills float32 or bool elements, not {dtype}")
        if n:
            name = "bernoulli_f32" if dtype == "float32" else "bernoulli_u8"
            kernel = self._kernel(name, [None, np.int64, np.int64, np.float32, None])
            kernel(self.device.queue, (-(-n // self.local) * self.local,), (self.local,), out, offset, n, p, state)
        self._kernel("advance", [None, np.int64])(self.device.queue, (1,), (1,), state, n)

    def bernoulli_keyed(self, out: cl.Buffer, offset: int, n: int, p: float, key: int, dtype: str) -> None:
        """``out[offset:offset + n]`` (``dtype`` "float32" or "bool" elements) = 1 with probability ``p``,
        else 0: Philox counters 0 .. n - 1 under the 64-bit ``key``."""
        if dtype not in ("float32", "bool"):
            raise ValueError(f"a keyed Bernoulli draw fills float32 or bool elements, not {dtype}")
        if n:
            name = "bernoulli_keyed_f32" if dtype == "float32" else "bernoulli_keyed_u8"
            kernel = self._kernel(name, [None, np.int64, np.int64, np.float32, np.uint32, np.uint32])
            kernel(self.device.queue, (-(-n // self.local) * self.local,), (self.local,), out, offset, n, p,
                   key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF)

    def dropout_keyed(self, out: cl.Buffer, out_offset: int, mask: cl.Buffer, mask_offset: int, x: cl.Buffer,
                      x_offset: int, n: int, keep: float, scale: float, key: int) -> None:
        """Dropout of ``n`` contiguous float32 elements in one launch: ``mask`` (bytes) as
        :meth:`bernoulli_keyed` draws it with probability ``keep`` under ``key``, and ``out = x * mask *
        scale`` (offsets in elements)."""
        if n:
            kernel = self._kernel("dropout_keyed_f32", [None, np.int64, None, np.int64, None, np.int64, np.int64,
                                                        np.float32, np.float32, np.uint32, np.uint32])
            kernel(self.device.queue, (-(-n // self.local) * self.local,), (self.local,), out, out_offset, mask,
                   mask_offset, x, x_offset, n, keep, scale, key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF)
