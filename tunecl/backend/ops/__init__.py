"""ATen overload → adapter tables, one module per kind of op.

Each module exports ``KERNELS: dict[str, callable]`` mapping an overload name (``"add.out"``) to a
thin adapter with that overload's signature; kernel logic lives in :mod:`tunecl.kernels`.
An adapter raises :class:`tunecl.errors.Unsupported` for a case it cannot run on the
device (before touching any output); registration then routes that call to the CPU fallback.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

# A key no kernel is registered for: redispatching an op to it runs torch's composite kernel of the op (for
# a structured op its CompositeExplicitAutogradNonFunctional wrapper: shape and dtype checks, the result
# allocated through the backend's empty_strided, then the backend's ``.out`` kernel). The op modules send the
# calls their own fast paths do not take there.
COMPOSITE_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse3)

_MODULES = ("core", "creation", "pointwise", "reduction", "nn", "indexing", "optim", "foreach", "linalg", "conv",
            "transformer", "attention", "sdpa", "upsample", "group_norm", "scan", "reorder", "loss2d", "dot", "index_nd", "sort", "padding", "losses", "activations", "resample", "distances", "patches", "search", "unique", "grid_sample", "pool3d", "adaptive_max", "embedding_bag", "margin_loss",
            "ctc_loss")


def kernel_table() -> dict[str, Callable[..., Any]]:
    """Every overload the backend implements, merged from the op modules."""
    table: dict[str, Callable[..., Any]] = {}
    for name in _MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        overlap = table.keys() & module.KERNELS.keys()
        if overlap:
            raise RuntimeError(f"ops registered twice: {sorted(overlap)}")
        table.update(module.KERNELS)
    return table
