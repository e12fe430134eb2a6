"""Every registered elementwise and reduction kernel over 0-dim, size-1, empty and non-contiguous inputs.

The overloads are the ``KERNELS`` tables of ``tunecl/backend/ops/pointwise.py`` and ``reduction.py``;
each is called through ``torch.ops.aten`` with arguments built from its schema (tensors of one layout,
scalars from the schema's defaults or :data:`SCALARS`, a fresh empty ``out=``), on the CPU and on opencl
with ``TUNECL_FALLBACK=error``: the device kernel must run (or refuse as the CPU does) and agree with
CPU torch, in every output and every argument it writes. The default run sweeps a rotating sixth of
the overloads (by the day of the year, or ``TUNECL_SWEEP_SLICE=k/n``); ``TUNECL_OPINFO=full`` sweeps
them all.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
import torch

from tunecl import config
from tunecl.backend.ops import pointwise, reduction

DEVICE = torch.device("opencl")
SLICES = 6
FULL = os.environ.get("TUNECL_OPINFO", "").lower() == "full"

OVERLOADS = sorted({*pointwise.KERNELS, *reduction.KERNELS})

# Required scalar arguments without a schema default, by name.
SCALARS: dict[str, Any] = {
    "alpha": 2, "value": 0.5, "min": -0.5, "max": 0.5, "min_val": -0.5, "max_val": 0.5, "threshold": 0.1,
    "negative_slope": 0.1, "exponent": 2.5, "self": 2.0, "other": 3, "weight": 0.25, "beta": 1.0,
    "scale": 1.0, "input_scale": 1.0, "is_result": False, "self_is_result": False, "dim": 0,
    "half_to_float": False, "input_dtype": torch.float32, "ord": 2, "rounding_mode": "floor", "lambd": 0.5,
    "p": 3, "keepdim": False, "dtype": torch.float32, "n": 1,
}
# Result dtypes other than float32.
BOOL_RESULTS = {"eq", "ne", "lt", "le", "gt", "ge", "isposinf", "isneginf", "isinf", "isnan", "isfinite",
                "logical_and", "logical_or", "logical_xor", "logical_not", "any", "all"}
INT_INPUTS = ("bitwise_",)
# Tensor arguments that are bool masks, or 0-dim by the op's contract.
MASKS = ("condition", "mask")
ZERO_DIM = {("masked_fill_.Tensor", "value")}

LAYOUTS = {
    "0-dim": ((), lambda t: t),
    "size-1": ((1,), lambda t: t),
    "empty": ((0, 3), lambda t: t),
    "non-contiguous": ((5, 6), lambda t: t[:, ::2].t()),
}


def _slice() -> tuple[int, int]:
    spec = os.environ.get("TUNECL_SWEEP_SLICE", "")
    if spec:
        k, _, n = spec.partition("/")
        return int(k), int(n)
    return datetime.date.today().timetuple().tm_yday % SLICES, SLICES


def _overload(name: str) -> torch._ops.OpOverload:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _result_dtype(name: str, out_name: str) -> torch.dtype:
    base = name.partition(".")[0]
    # (max.dim_max and min.dim_min call their indices max_values and min_indices)
    if out_name in ("indices", "max_values", "min_indices") or base in ("argmax", "argmin"):
        return torch.int64
    if base in BOOL_RESULTS:
        return torch.bool
    if name.startswith(INT_INPUTS):
        return torch.int32
    return torch.float32


def _tensor(name: str, arg: str, layout: str, seed: int) -> torch.Tensor:
    shape, view = LAYOUTS[layout]
    if (name, arg) in ZERO_DIM:
        shape, view = (), (lambda t: t)
    gen = torch.Generator().manual_seed(seed)
    if arg in MASKS:
        leaf = torch.rand(shape, generator=gen) > 0.5
    elif name.startswith(INT_INPUTS):
        leaf = torch.randint(-8, 8, shape, generator=gen, dtype=torch.int32)
    else:
        leaf = torch.randn(shape, generator=gen)
    return leaf, view


def _arguments(name: str, layout: str) -> tuple[list[Any], dict[str, Any]]:
    """Arguments as (kind, value) recipes: ("tensor", (leaf, view)), ("out", dtype) or ("value", v)."""
    schema = _overload(name)._schema
    args, kwargs = [], {}
    for i, a in enumerate(schema.arguments):
        kind = str(a.type)
        if a.alias_info is not None and a.alias_info.is_write and a.kwarg_only:
            recipe = ("out", _result_dtype(name, a.name))
        elif kind in ("Tensor", "Tensor?"):
            recipe = ("tensor", _tensor(name, a.name, layout, i))
        elif a.has_default_value():
            continue
        elif a.name in SCALARS:
            recipe = ("value", SCALARS[a.name])
        else:
            raise AssertionError(f"{name}: no value for argument {a.name}: {kind}")
        (kwargs.__setitem__(a.name, recipe) if a.kwarg_only else args.append(recipe))
    return args, kwargs


def _build(recipe: tuple[str, Any], device: torch.device | None) -> Any:
    kind, value = recipe
    if kind == "tensor":
        leaf, view = value
        return view(leaf.clone() if device is None else leaf.to(device))
    if kind == "out":
        return torch.empty(0, dtype=value, device=device)
    return value


def _call(name: str, args: list, kwargs: dict, device: torch.device | None) -> tuple[Any, list[Any]]:
    built = [_build(r, device) for r in args]
    built_kw = {k: _build(r, device) for k, r in kwargs.items()}
    result = _overload(name)(*built, **built_kw)
    return result, [*built, *built_kw.values()]


def _flat(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in _flat(e)]
    return []


def sweep(name: str, layout: str) -> None:
    args, kwargs = _arguments(name, layout)
    try:
        expected, expected_args = _call(name, args, kwargs, None)
    except (RuntimeError, IndexError, ValueError, TypeError) as error:
        with config.override(fallback="error"), pytest.raises(type(error)):
            _call(name, args, kwargs, DEVICE)
        return
    with config.override(fallback="error"):
        actual, actual_args = _call(name, args, kwargs, DEVICE)
    pairs = list(zip(_flat(expected), _flat(actual))) + list(zip(_flat(expected_args), _flat(actual_args)))
    for i, (e, a) in enumerate(pairs):
        assert a.device.type == "opencl", f"{name} ({layout}): result {i} is on {a.device}"
        torch.testing.assert_close(a.cpu(), e, equal_nan=True, msg=lambda m: f"{name} ({layout}) {i}: {m}")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", OVERLOADS if FULL else OVERLOADS[_slice()[0]::_slice()[1]])
def test_kernel_sweep(name, layout):
    sweep(name, layout)


def test_every_overload_has_arguments():
    for name in OVERLOADS:
        _arguments(name, "0-dim")
