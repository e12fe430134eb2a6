"""Strided operands for the backend's non-tunable kernel families (pointwise, reduce, ...).

These families read tensors through arbitrary strides. The host describes each tensor as an
:class:`Operand` (buffer, element offset, strides, dtype name), merges dims that are contiguous in
*every* operand (so a dense tensor becomes one dim), and ships sizes, strides and offsets to the
kernel in one by-value struct (``meta``), so a single binary serves every shape of the same rank.
Nothing here knows about torch: dtypes are names such as ``"float32"``.
"""

from __future__ import annotations

import warnings
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pyopencl as cl

from tunecl.errors import Unsupported
from tunecl.kernels.base import read_source
from tunecl.runtime import Device

# dtype name -> OpenCL C storage type. bool is stored as uchar 0/1 (OpenCL has no bool buffers);
# half is only loaded/stored (vload_half/vstore_half), never computed in.
CTYPES: dict[str, str] = {
    "float32": "float", "float16": "half", "int64": "long", "int32": "int", "int16": "short",
    "int8": "char", "uint8": "uchar", "bool": "uchar",
}
# the unsigned OpenCL type that moves an element's bits unchanged, per dtype (copies, sorts, gathers)
BIT_TYPES: dict[str, str] = {
    "float32": "uint", "float16": "ushort", "int64": "ulong", "int32": "uint", "int16": "ushort",
    "int8": "uchar", "uint8": "uchar", "bool": "uchar",
}
FLOATING = frozenset({"float32", "float16"})
INT32_MAX = 2**31 - 1
# ranks compiled for: a merged rank is padded up to the next bucket, which bounds compiles per op
RANK_BUCKETS = (1, 2, 4, 8)
MAX_RANK = RANK_BUCKETS[-1]


class Operand(NamedTuple):
    """A tensor as a kernel sees it: strides and offset in elements, already broadcast to the op's
    iteration shape (stride 0 along broadcast dims)."""

    buffer: cl.Buffer | None
    offset: int
    strides: tuple[int, ...]
    dtype: str


def merge_dims(shape: Sequence[int], stride_sets: Sequence[Sequence[int]]
               ) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that are contiguous in every stride set.

    Returns the merged shape (at least one dim) and the matching strides of each set.
    """
    merged_shape: list[int] = []
    merged: list[list[int]] = [[] for _ in stride_sets]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if merged_shape and all(m[-1] == st[d] * size for m, st in zip(merged, stride_sets)):
            merged_shape[-1] *= size
            for m, st in zip(merged, stride_sets):
                m[-1] = st[d]
        else:
            merged_shape.append(size)
            for m, st in zip(merged, stride_sets):
                m.append(st[d])
    if not merged_shape:
        return [1], [[0] for _ in stride_sets]
    return merged_shape, merged


def rank_bucket(rank: int) -> int:
    """The compiled rank that serves ``rank`` merged dims."""
    for bucket in RANK_BUCKETS:
        if rank <= bucket:
            return bucket
    raise Unsupported(f"{rank} non-mergeable dims (at most {MAX_RANK} are compiled)")


def pad_front(values: list[int], rank: int, fill: int) -> list[int]:
    return [fill] * (rank - len(values)) + values


def pack_meta(values: Sequence[int], idx: str) -> bytes:
    """The by-value ``meta`` struct: consecutive ``int`` or ``long`` values."""
    return array("i" if idx == "int" else "q", values).tobytes()


def meta_dtype(length: int, idx: str) -> np.dtype:
    """Scalar-arg dtype of a ``meta`` struct of ``length`` values: raw bytes for pyopencl."""
    return np.dtype(f"V{length * (4 if idx == 'int' else 8)}")


def relu_tag(buffer: object, offset: int, count: int) -> tuple:
    """The tag of a held launch whose output (``count`` contiguous float32 elements of ``buffer`` from
    element ``offset``) an in-place activation (relu; relu6 into batch norm) may fold into it
    (:meth:`tunecl.runtime.Device.replace_held`). (The held launch's arguments keep ``buffer`` alive, so its
    id names it while the tag is held.)"""
    return ("relu", id(buffer), offset, count)


class KernelCache:
    """Compiled kernels of one ``.cl`` family on one device, keyed by a small tuple.

    The dict lookup is the hot path; the runtime's program cache (keyed by source hash and options)
    and pyopencl's disk cache sit behind it.
    """

    def __init__(self, device: Device, package: str, filename: str):
        self.device = device
        self.source = read_source(package, filename)
        self._kernels: dict[Any, cl.Kernel] = {}

    def get(self, key: Any) -> cl.Kernel | None:
        return self._kernels.get(key)

    def build(self, key: Any, options: Sequence[str], name: str, scalar_dtypes: Sequence[Any],
              prefix: str = "") -> cl.Kernel:
        """Compile (or fetch from the runtime's caches) and keep the kernel for ``key``; ``prefix``: source
        text compiled in front of the family's file (functions some of its variants call)."""
        with warnings.catch_warnings():
            # drivers (NVIDIA's among them) print notes for valid code; for the backend's users
            # one such warning per op signature is noise
            warnings.simplefilter("ignore", cl.CompilerWarning)
            program = self.device.build(prefix + self.source, options)
        kernel = self.device.kernel(program, name, scalar_dtypes)
        self._kernels[key] = kernel
        return kernel

    def __len__(self) -> int:
        return len(self._kernels)


class StridedFamily:
    """A non-tunable family on one device: the kernels of its ``.cl`` file (:attr:`source_file`, next to
    the subclass's module) in ``cache``, and ``local``, the 1-D work-group size of its element-wise
    launches (256 or the device's limit)."""

    source_file = ""

    def __init__(self, device: Device):
        self.device = device
        self.cache = KernelCache(device, type(self).__module__.rpartition(".")[0], self.source_file)
        self.local = work_group(device, 256)


def work_group(device: Device, preferred: int = 256) -> int:
    """A 1-D work-group size the device accepts."""
    return max(1, min(preferred, device.max_work_group_size))


def pow2_work_group(device: Device, preferred: int = 256) -> int:
    """The largest power-of-two 1-D work-group size (tree sums need one) up to ``preferred`` that the
    device accepts."""
    return 1 << (work_group(device, preferred).bit_length() - 1)
