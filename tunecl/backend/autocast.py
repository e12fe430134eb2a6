"""Autocast cast policies for the ``opencl`` device (``torch.autocast("opencl", dtype=torch.float16)``).

torch registers its cast policies in C++ for CUDA, CPU, XPU, MPS, MTIA and MAIA only; the
``AutocastPrivateUse1`` key gets none, so with a plain fallthrough ``torch.autocast("opencl")``
silently computes everything in float32. This module registers Python kernels on that key that do
what CUDA's policies do (``aten/src/ATen/autocast_mode.cpp``), op list for op list:

- ``LOWER_PRECISION``: floating opencl inputs are cast to the autocast dtype (float16), so
  convolutions and matrix products run in half storage (the backend computes them in float32);
- ``FP32``: ops that lose accuracy or range in half (exp, log, pow, norms, losses) get float32;
- ``FP32_SET_OPT_DTYPE``: softmax, log_softmax, sum, prod, cumsum, ... run with ``dtype=float32``
  unless the caller chose a dtype (only when the first argument is an eligible tensor);
- ``PROMOTE``: several floating inputs are cast to the widest floating type among them;
- ``BANNED``: ``binary_cross_entropy`` raises, as on CUDA (use ``binary_cross_entropy_with_logits``).

Every other op falls through. A cast applies to floating opencl tensors other than float64, never
to CPU tensors. The nested call runs with the autocast key excluded, as in C++. Unlike C++, casts of
weights are not cached across uses within one autocast region: each use casts again (one pointwise
copy per use; a resnet uses each weight once per forward).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

KEY = "AutocastPrivateUse1"
DEVICE = "opencl"

LOWER_PRECISION = (
    "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    # CUDA appends dtype=float32 to norm; casting the inputs gives the same float32 result
    "norm.Scalar", "norm.ScalarOpt_dim",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put", "tensordot",
    "scatter_add",
)
BANNED = ("binary_cross_entropy",)

_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast: the backward "
    "of a sigmoid followed by binary_cross_entropy loses accuracy in float16. Use "
    "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, which are safe, "
    "or disable autocast around the loss.")

_libraries: list[torch.library.Library] = []


def _eligible(x: Any) -> bool:
    return (isinstance(x, torch.Tensor) and x.device.type == DEVICE and x.is_floating_point()
            and x.dtype != torch.float64)


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if _eligible(x):
        return x if x.dtype == dtype else x.to(dtype)
    if isinstance(x, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in x):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found = []
    for x in (*args, *kwargs.values()):
        if isinstance(x, (list, tuple)):
            found += [v for v in x if _eligible(v)]
        elif _eligible(x):
            found.append(x)
    return found


def _exclude_autocast() -> Any:
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1))


def _cast_all(op: torch._ops.OpOverload, target: Callable[[tuple, dict], torch.dtype]) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = target(args, kwargs)
        with _exclude_autocast():
            return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})

    return kernel


def _lower(args: tuple, kwargs: dict) -> torch.dtype:
    return torch.get_autocast_dtype(DEVICE)


def _fp32(args: tuple, kwargs: dict) -> torch.dtype:
    return torch.float32


def _widest(args: tuple, kwargs: dict) -> torch.dtype:
    dtype = torch.get_autocast_dtype(DEVICE)
    for t in _tensors(args, kwargs):
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _set_opt_dtype(op: torch._ops.OpOverload) -> Callable[..., Any]:
    names = [a.name for a in op._schema.arguments]
    position = names.index("dtype")
    kwarg_only = op._schema.arguments[position].kwarg_only

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if args and _eligible(args[0]):
            if not kwarg_only and len(args) > position:
                if args[position] is None:
                    args = (*args[:position], torch.float32, *args[position + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        with _exclude_autocast():
            return op(*args, **kwargs)

    return kernel


def _banned(op: torch._ops.OpOverload) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(_BANNED_MESSAGE)

    return kernel


def _overloads(name: str) -> list[torch._ops.OpOverload]:
    """``name`` itself when it names an overload, else every functional tensor overload of the op
    (outs and in-place variants keep their dtypes, as in C++)."""
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return []
    if overload:
        return [getattr(packet, overload)] if overload in packet.overloads() else []
    ops = [getattr(packet, o) for o in packet.overloads()]
    return [op for op in ops
            if any("Tensor" in str(a.type) for a in op._schema.arguments)  # not sum.int(int[]) and kin
            and not any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)]


def policies() -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    """Every overload this torch has in the tables above, with its autocast kernel."""
    table: dict[torch._ops.OpOverload, Callable[..., Any]] = {}
    for names, make in ((LOWER_PRECISION, lambda op: _cast_all(op, _lower)),
                        (FP32, lambda op: _cast_all(op, _fp32)),
                        (FP32_SET_OPT_DTYPE, _set_opt_dtype),
                        (PROMOTE, lambda op: _cast_all(op, _widest)),
                        (BANNED, _banned)):
        for name in names:
            for op in _overloads(name):
                table[op] = make(op)
    return table


def register() -> None:
    """Register the policies on ``AutocastPrivateUse1`` (once; registration.py calls it)."""
    if _libraries:
        return
    lib = torch.library.Library("aten", "IMPL")
    for op, kernel in policies().items():
        name = op._schema.name.split("::", 1)[1]
        if op._overloadname != "default":
            name += "." + op._overloadname
        lib.impl(name, kernel, KEY)
    _libraries.append(lib)
