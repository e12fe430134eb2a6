"""``nn.Module`` conversions to and from the device keep every ``Parameter`` object, and so weight ties.

``Module._apply`` (behind ``.to``, ``.opencl()``, ``.cpu()``, ``.half()``, ...) moves a parameter in place
with ``param.data = moved`` only when torch deems the two tensor types shallow-copy compatible, which it
never does between PrivateUse1 and another device. Otherwise it builds a new ``Parameter`` per module
slot: two modules sharing one parameter (tied input and output embeddings) would end up with two
copies, updated apart by an optimizer, their gradients split. When a conversion crosses between
``opencl`` and another device, :func:`apply_keeping_parameters` runs it with torch's own swap mode
(``torch.utils.swap_tensors``, as ``torch.__future__.set_swap_module_params_on_conversion(True)``
would), which keeps each object and so each tie, as ``param.data =`` does on CUDA. Where a swap is
refused (a parameter still referenced by a live autograd graph, or weakly referenced), the conversion
runs the ordinary way and the slots that shared a parameter are tied to one new ``Parameter`` again.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

_local = threading.local()   # .depth: nesting of _apply calls on this thread (children recurse)


def _crosses_device(module: nn.Module, fn: Callable[[torch.Tensor], Any]) -> bool:
    """Whether ``fn`` moves some parameter or buffer of ``module`` between ``opencl`` and another device
    type, found by applying it to an empty tensor of each (device, dtype) the module holds."""
    kinds = {(t.device, t.dtype) for t in (*module.parameters(), *module.buffers())}
    for device, dtype in kinds:
        with torch.no_grad():
            moved = fn(torch.empty(0, device=device, dtype=dtype))
        if isinstance(moved, torch.Tensor) and (moved.device.type == "opencl") != (device.type == "opencl"):
            return True
    return False


def _parameter_slots(module: nn.Module) -> list[tuple[nn.Module, str, int]]:
    """(module, name, id of its parameter) of every parameter slot, shared parameters once per slot."""
    return [(m, name, id(p)) for m in module.modules() for name, p in m._parameters.items() if p is not None]


def _retie(slots: list[tuple[nn.Module, str, int]]) -> None:
    """Point every slot that held one parameter before a conversion at the parameter its first slot holds now."""
    first: dict[int, nn.Parameter] = {}
    for m, name, original in slots:
        kept = first.setdefault(original, m._parameters[name])
        if m._parameters[name] is not kept:
            m._parameters[name] = kept


def patch_module_apply() -> None:
    """Wrap ``nn.Module._apply`` (once per process) as described in the module docstring."""
    original = nn.Module._apply
    if getattr(original, "_tunecl", False):
        return

    @functools.wraps(original)
    def _apply(self: nn.Module, fn: Callable[[torch.Tensor], Any], recurse: bool = True) -> nn.Module:
        depth = getattr(_local, "depth", 0)
        if depth or torch.__future__.get_swap_module_params_on_conversion() or not _crosses_device(self, fn):
            _local.depth = depth + 1
            try:
                return original(self, fn, recurse)
            finally:
                _local.depth = depth
        slots = _parameter_slots(self)
        _local.depth = 1
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return original(self, fn, recurse)
        except RuntimeError as error:
            if "Couldn't swap" not in str(error):
                raise
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)
            _local.depth = 0
        # a swap was refused: convert the rest the ordinary way (the parameters already swapped are on
        # the target and stay as they are), then tie the slots again
        _local.depth = 1
        try:
            result = original(self, fn, recurse)
        finally:
            _local.depth = 0
        _retie(slots)
        return result

    _apply._tunecl = True
    nn.Module._apply = _apply
