"""Which torch dtypes live on the OpenCL device, and their names in the kernel layer.

float32 is the compute type; float16 is computed in float32 (pointwise and reductions load and
store half directly, GEMM/conv/pool/softmax/batch norm convert through float32 scratch, see
:mod:`tunecl.backend.half`); int64/int32/int16/int8,
uint8 and bool serve indices and masks. float64 is refused with a clear error rather than silently
downcast; other dtypes DLPack can describe (bfloat16, complex64, ...) may be stored and copied but
have no kernels, so ops on them take the CPU fallback.
"""

from __future__ import annotations

import torch

# torch dtype -> (DLPack type code, bits). kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4,
# kDLComplex 5, kDLBool 6.
DLPACK: dict[torch.dtype, tuple[int, int]] = {
    torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16),
    torch.int64: (0, 64), torch.int32: (0, 32), torch.int16: (0, 16), torch.int8: (0, 8),
    torch.uint8: (1, 8), torch.bool: (6, 8), torch.complex64: (5, 64),
}

# torch dtype -> the kernel layer's dtype name (only dtypes the kernel families handle)
KERNEL_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.int64: "int64", torch.int32: "int32",
    torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}

ITEMSIZE: dict[torch.dtype, int] = {dt: bits // 8 for dt, (_, bits) in DLPACK.items()}

_REFUSED = {
    torch.float64: "float64 is not supported on the OpenCL device; use float32",
    torch.complex128: "complex128 is not supported on the OpenCL device; use complex64",
    torch.complex32: "complex32 is not supported on the OpenCL device; use complex64",
    **{getattr(torch, name): f"{name} is not supported on the OpenCL device; use int32 or int64"
       for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)},
    **{getattr(torch, name): f"{name} is not supported on the OpenCL device; use float16 or float32"
       for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
                    "float4_e2m1fn_x2") if hasattr(torch, name)},
}


class UnsupportedDtypeError(TypeError):
    """A tensor of this dtype cannot live on the OpenCL device."""


def check_storable(dtype: torch.dtype) -> None:
    """Raise :class:`UnsupportedDtypeError` unless ``dtype`` can be stored on the device."""
    if dtype not in DLPACK:
        stored = ", ".join(str(d).removeprefix("torch.") for d in DLPACK)
        raise UnsupportedDtypeError(_REFUSED.get(
            dtype, f"{str(dtype).removeprefix('torch.')} is not supported on the OpenCL device "
                   f"(it stores {stored})"))


# torch dtype -> the name torch's C++ errors give it (c10's ScalarType names)
_SCALAR_TYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float64: "Double",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}


def scalar_type_name(dtype: torch.dtype) -> str:
    """``dtype`` as torch's own error messages name it ("Float", "Long", ...)."""
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
