"""The DLPack structs through which every opencl tensor is made (``torch._C._from_dlpack`` of a
``DLManagedTensor`` with device type kDLExtDev, which torch maps to PrivateUse1), and :class:`Slot`, one
such struct with its shape and stride arrays, recycled by the allocator with its block."""

from __future__ import annotations

import ctypes
import struct


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype = ctypes.py_object
capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
KDL_EXT_DEV = 12
# data, device (type, id), ndim, dtype (code, bits, lanes): the DLTensor's first 24 bytes, written
# in one call (three ctypes field stores cost twice as much)
DL_HEADER = struct.Struct("=QiiiBBH")
assert (DLTensor.device.offset, DLTensor.ndim.offset, DLTensor.dtype.offset, DLTensor.shape.offset) == (8, 16, 20, 24)


class Slot:
    """A recycled DLManagedTensor with shape/stride arrays (ctypes objects are slow to create).
    Its deleter stays NULL: blocks are reclaimed through weak references instead."""

    __slots__ = ("address", "dtype", "layout", "managed", "rank", "shape", "strides", "tensor")

    def __init__(self, ndim: int):
        self.rank = ndim
        # what the struct describes now, (size, stride) as tuples and the DLPack dtype: a tensor of the same
        # layout needs only its address written
        self.layout: tuple = ((), ())
        self.dtype: tuple[int, int] | None = None
        self.managed = DLManagedTensor()
        self.shape = (ctypes.c_int64 * ndim)()
        self.strides = (ctypes.c_int64 * ndim)()
        self.tensor = tensor = self.managed.dl_tensor  # a view into managed, kept to skip lookups
        tensor.shape = self.shape
        tensor.strides = self.strides
        tensor.device = DLDevice(KDL_EXT_DEV, 0)
        self.address = ctypes.addressof(self.managed)


