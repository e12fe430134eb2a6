"""Infrastructure ops every PrivateUse1 backend must provide: allocation, copies, views, resize."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from tunecl.backend import copies, memory, state
from tunecl.backend.memory import contiguous_strides, storage_nbytes

aten = torch.ops.aten
_STRIDED, _CONTIGUOUS, _PRESERVE = torch.strided, torch.contiguous_format, torch.preserve_format
CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _check_factory(dtype: torch.dtype | None, layout: torch.layout | None,
                   device: torch.device | None) -> torch.dtype:
    state.check_index(device)
    if layout not in (None, torch.strided):
        raise RuntimeError(f"opencl tensors are strided; {layout} is not supported")
    return torch.get_default_dtype() if dtype is None else dtype


def empty_memory_format(size: Sequence[int], *, dtype: torch.dtype | None = None,
                        layout: torch.layout | None = None, device: torch.device | None = None,
                        pin_memory: bool | None = None,
                        memory_format: torch.memory_format | None = None) -> torch.Tensor:
    if (dtype is not None and (layout is None or layout is _STRIDED) and (device is None or not device.index)
            and (memory_format is None or memory_format is _CONTIGUOUS or memory_format is _PRESERVE)):
        return memory.empty_contiguous(size, dtype)   # (the common call: nothing else to check)
    dtype = _check_factory(dtype, layout, device)
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        return memory.empty_contiguous(size, dtype)
    # channels_last(_3d): let torch's own rules compute the strides
    return memory.empty(size, torch.empty(size, device="meta", memory_format=memory_format).stride(), dtype)


def empty_strided(size: Sequence[int], stride: Sequence[int], *, dtype: torch.dtype | None = None,
                  layout: torch.layout | None = None, device: torch.device | None = None,
                  pin_memory: bool | None = None) -> torch.Tensor:
    return memory.empty(size, stride, _check_factory(dtype, layout, device))


def _view_kernel(op: torch._ops.OpOverload):
    """Metadata-only ops: the CPU kernel only builds a TensorImpl over the same storage."""
    def kernel(*args, **kwargs):
        return op.redispatch(CPU_KEYS, *args, **kwargs)
    return kernel


def _redispatch_to_cpu(op: torch._ops.OpOverload):
    """A view op's kernel: the CPU kernel called straight from the dispatcher (no Python frame of its own;
    a transformer step makes ~1,000 of these calls, through ``transpose``, ``permute``, ``expand`` and
    indexing, which reach ``as_strided``)."""
    return functools.partial(op._handle.redispatch_boxed, CPU_KEYS)


def resize_(self: torch.Tensor, size: Sequence[int], *,
            memory_format: torch.memory_format | None = None) -> torch.Tensor:
    item = self.element_size()
    needed = storage_nbytes(size, contiguous_strides(size), item) + self.storage_offset() * item
    storage = self.untyped_storage()
    if needed > storage.nbytes():
        # DLPack storages cannot grow: move the bytes to a bigger storage and point self at it
        grown = memory.empty([-(-needed // item)], [1], self.dtype)
        if storage.nbytes():
            st = state.get()
            st.cl.enqueue_copy(st.queue, memory.buffer_of(grown), memory.storage_buffer(storage),
                               byte_count=storage.nbytes())
        aten.set_.source_Storage_storage_offset.redispatch(
            CPU_KEYS, self, grown.untyped_storage(), self.storage_offset(), list(size),
            contiguous_strides(size))
    return aten.resize_.default.redispatch(CPU_KEYS, self, size, memory_format=memory_format)


def set_empty(self: torch.Tensor) -> torch.Tensor:
    """``aten::set_`` without a source: an empty storage on the device (the CPU kernel would
    attach a CPU storage)."""
    storage = memory.empty([0], [1], self.dtype).untyped_storage()
    return aten.set_.source_Storage_storage_offset.redispatch(CPU_KEYS, self, storage, 0, [0], [1])


def local_scalar_dense(self: torch.Tensor) -> bool | int | float:
    """``.item()``: one element to the host (waits for the device)."""
    return copies.host_view(self).item()


# Views: registered without the backend's per-call wrapper (they never fall back, write nothing and are not
# device work, so they are not counted in the backend's op statistics either)
VIEW_KERNELS = {name: _redispatch_to_cpu(op) for name, op in [
    ("view", aten.view.default),
    ("as_strided", aten.as_strided.default),
    ("_reshape_alias", aten._reshape_alias.default),
    ("unfold", aten.unfold.default),
    ("view_as_real", aten.view_as_real.default),
    ("view_as_complex", aten.view_as_complex.default),
]}

KERNELS = {
    "empty.memory_format": empty_memory_format,
    "empty_strided": empty_strided,
    "_copy_from": copies.copy_from,
    "_copy_from_and_resize": copies.copy_from_and_resize,
    "_to_copy": copies.to_copy,
    "resize_": resize_,
    "set_": set_empty,
    "_local_scalar_dense": local_scalar_dense,
    **{name: _view_kernel(op) for name, op in [
        ("set_.source_Storage", aten.set_.source_Storage),
        ("set_.source_Storage_storage_offset", aten.set_.source_Storage_storage_offset),
        ("set_.source_Tensor", aten.set_.source_Tensor),
    ]},
}

# Ops that are metadata-only: never fallbacks (the views of VIEW_KERNELS are not counted as ops either;
# set_ is, through the backend's wrapper, which tells the weight cache of the write)
VIEW_OPS = frozenset(VIEW_KERNELS) | {"set_.source_Storage", "set_.source_Storage_storage_offset",
                                      "set_.source_Tensor"}
