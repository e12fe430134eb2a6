"""``torch.compile(model)`` with its default backend, on opencl tensors: compiled by ``backend="tunecl"``.

torch.compile's default backend is Inductor, which generates Triton or C++ code for each device and has
no code generator for OpenCL: on an opencl model it fails deep inside with ``KeyError: 'opencl'``.
Registering the device wraps torch's entry to Inductor (``torch._TorchCompileInductorWrapper.__call__``):
a graph with an opencl tensor among its example inputs is compiled by the backend registered as "tunecl"
(:func:`tunecl.backend.compile.tunecl_backend`, found by name as ``backend="tunecl"`` finds it), with one
warning that says so, that ``mode`` and ``options`` are Inductor's and do not apply, and that
``backend="tunecl"`` chooses it explicitly. Graphs without opencl tensors go to Inductor as before.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from tunecl.backend.accelerator import BACKEND

_warned = False


def _on_opencl(inputs: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == BACKEND for t in inputs or ())


def _tunecl_backend() -> Any:
    """The backend registered as "tunecl" (the package's entry point, or :mod:`tunecl.backend.compile` once
    imported), looked up by name as ``torch.compile(backend="tunecl")`` does."""
    from torch._dynamo.backends.registry import lookup_backend

    try:
        return lookup_backend("tunecl")
    except Exception as error:   # (torch's InvalidBackend: no entry point, e.g. run from a source tree)
        raise RuntimeError("torch.compile's default backend (Inductor) generates no OpenCL code, and the "
                           "'tunecl' backend is not registered in this process: import tunecl.backend.compile "
                           "(or install the package) and pass backend='tunecl'") from error


def patch() -> None:
    """Route torch.compile's default backend to tunecl's for graphs on the opencl device (once)."""
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_tunecl", False):
        return
    inductor = wrapper.__call__

    @functools.wraps(inductor)
    def call(self: Any, model_: Any, inputs_: Any, *args: Any, **kwargs: Any) -> Any:
        if not _on_opencl(inputs_):
            return inductor(self, model_, inputs_, *args, **kwargs)
        global _warned
        if not _warned:
            _warned = True
            ignored = sorted(getattr(self, "config", None) or {})
            warnings.warn("torch.compile's default backend (Inductor) generates no OpenCL code: graphs on the "
                          "opencl device compile with backend='tunecl' instead"
                          + (f" (Inductor's settings {ignored} do not apply)" if ignored else "")
                          + "; pass backend='tunecl' to choose it explicitly", stacklevel=2)
        return _tunecl_backend()(model_, inputs_)

    call._tunecl = True
    wrapper.__call__ = call
