"""Numeric precisions of tuned results, and which of them a request may be served with.

Every algorithm computes at one precision: ``"fp32"`` (strict IEEE single precision: the fp32 families,
which declare none) or ``"tf32"`` (inputs rounded to TF32, 10 explicit mantissa bits, products summed
in fp32: ``gemm_mma_tf32``). Results are verified with the tolerance of their algorithm's precision and
stored under it; a request names the set of precisions it accepts, and the tuning DB never serves a
result of another one.

The policy mirrors PyTorch's on CUDA: a matmul may use TF32 when
``torch.backends.cuda.matmul.allow_tf32`` is true or ``torch.set_float32_matmul_precision`` is
``"high"`` or ``"medium"``; a convolution when ``torch.backends.cudnn.allow_tf32`` is true (PyTorch's
default). Everything else is strict fp32. Pure values and functions: the backend reads torch's flags
with :func:`torch_flags` and passes the result in; this module never imports torch (nor, at import
time, numpy: the CLI takes its names from here).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

FP32 = "fp32"
TF32 = "tf32"
PRECISIONS = (FP32, TF32)  # most accurate first

# Unit roundoff (half an ulp at 1) of the inputs of a product: fp32 keeps 23 explicit mantissa bits,
# TF32 10, both rounding to nearest.
UNIT_ROUNDOFF = {FP32: 2.0**-24, TF32: 2.0**-11}

# Request kinds whose TF32 permission comes from torch's matmul flags, and from cuDNN's flag.
MATMUL_KINDS = frozenset({"gemm"})
CONV_KINDS = frozenset({"conv"})


def algorithm_precision(algorithm: Any) -> str:
    """The precision an algorithm computes at (``precision`` attribute; none means strict fp32)."""
    return str(getattr(algorithm, "precision", FP32))


def at_least(precision: str) -> frozenset[str]:
    """The precisions that satisfy a request for ``precision``: itself and every more accurate one
    (an fp32 result always satisfies a TF32 request; a TF32 result never satisfies an fp32 one).

    Raises:
        ValueError: an unknown precision.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    return frozenset(PRECISIONS[: PRECISIONS.index(precision) + 1])


@dataclasses.dataclass(frozen=True)
class TorchFlags:
    """The torch settings that decide whether fp32 matmuls and convolutions may use TF32.

    Attributes:
        matmul_allow_tf32: ``torch.backends.cuda.matmul.allow_tf32``.
        float32_matmul_precision: ``torch.get_float32_matmul_precision()``: ``"highest"``, ``"high"``
            or ``"medium"``.
        cudnn_allow_tf32: ``torch.backends.cudnn.allow_tf32`` (convolutions).
    """

    matmul_allow_tf32: bool = False
    float32_matmul_precision: str = "highest"
    cudnn_allow_tf32: bool = False


STRICT = TorchFlags()


def accepted_precisions(kind: str, flags: TorchFlags = STRICT) -> frozenset[str]:
    """The precisions a backend request of problem ``kind`` may be served with under torch's ``flags``.

    ``{"fp32"}`` (strict) unless the flags allow TF32 for that kind: matmuls (``"gemm"``) with
    ``matmul_allow_tf32`` or a float32 matmul precision of ``"high"`` / ``"medium"`` (``"medium"``
    also allows bf16 in PyTorch; TF32 is more accurate than that), convolutions (``"conv"``) with
    ``cudnn_allow_tf32``. Any other kind is strict. Pass the result as ``precision=`` to
    ``TuningDB.lookup``.
    """
    if kind in MATMUL_KINDS:
        tf32 = flags.matmul_allow_tf32 or flags.float32_matmul_precision in ("high", "medium")
    elif kind in CONV_KINDS:
        tf32 = flags.cudnn_allow_tf32
    else:
        tf32 = False
    return at_least(TF32 if tf32 else FP32)


def torch_flags(torch: Any) -> TorchFlags:
    """Read :class:`TorchFlags` from an imported ``torch`` module (the caller imports it).

    PyTorch 2.9+ also has ``fp32_precision`` settings (``"ieee"``, ``"tf32"``, ``"none"`` = inherit
    from the parent); where torch refuses to answer a legacy getter because both APIs were used, the
    new setting decides. Anything that cannot be read counts as strict: in doubt, never TF32.
    """
    backends = getattr(torch, "backends", None)
    cuda_matmul = getattr(getattr(backends, "cuda", None), "matmul", None)
    cudnn = getattr(backends, "cudnn", None)

    def new_api(*settings: Any) -> bool:
        for owner in settings:  # the first explicit setting from the most specific owner wins
            value = _read(owner, "fp32_precision")
            if value in ("ieee", "tf32"):
                return value == "tf32"
        return False

    matmul = _read(cuda_matmul, "allow_tf32")
    if matmul is None:
        matmul = new_api(cuda_matmul, backends)
    precision = _call(getattr(torch, "get_float32_matmul_precision", None))
    if precision is None:
        precision = "high" if new_api(cuda_matmul, backends) else "highest"
    conv = _read(cudnn, "allow_tf32")
    if conv is None:
        conv = new_api(getattr(cudnn, "conv", None), cudnn, backends)
    return TorchFlags(
        matmul_allow_tf32=bool(matmul), float32_matmul_precision=str(precision), cudnn_allow_tf32=bool(conv)
    )


def _read(owner: Any, name: str) -> Any:
    """``owner.name``, or None when it is missing or torch refuses to answer (mixed flag APIs)."""
    if owner is None:
        return None
    try:
        return getattr(owner, name, None)
    except RuntimeError:
        return None


def _call(getter: Any) -> Any:
    if getter is None:
        return None
    try:
        return getter()
    except RuntimeError:
        return None


def tf32_round(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to TF32 like ``cvt.rna.tf32.f32``: to nearest, ties away from zero
    (adding half a TF32 ulp to the magnitude bits, then clearing the 13 low mantissa bits); Inf and
    NaN unchanged. Returns float32."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(special, bits, rounded).astype(np.uint32).view(np.float32)
