"""``torch.accelerator`` for the opencl device: synchronize, streams, capability and memory statistics.

torch implements these in C++ through the accelerator's DeviceGuard and its ``c10::DeviceAllocator``. A
Python backend can register neither: ``torch._C._acc``'s guard has no ``synchronizeDevice`` ("Backend
doesn't support synchronizing all streams on device") nor ``getDeviceCapability``, and our storages
come through DLPack, not an allocator (torch asserts "Allocator for opencl is not a DeviceAllocator").
So :func:`patch` routes the Python functions of ``torch.accelerator`` to ``torch.opencl`` whenever
their device (or, for None or an index, the current accelerator) is opencl, and leaves every other
device to torch. Code that imported one of these functions by name before ``import tunecl.backend``
keeps torch's version.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from tunecl.backend.dtypes import DLPACK

BACKEND = "opencl"


def _targets_opencl(device: Any) -> bool:
    if device is None or isinstance(device, int):
        current = torch.accelerator.current_accelerator()
        return current is not None and current.type == BACKEND
    return torch.device(device).type == BACKEND


def _capability(device: Any = None) -> dict[str, Any]:
    """torch's capability dict: the dtypes a tensor can have on the device and be converted between."""
    torch.opencl.get_device_properties(device)   # (refuses a missing device)
    return {"supported_dtypes": set(DLPACK)}


def _memory_stats(device: Any = None) -> OrderedDict[str, int]:
    return OrderedDict(sorted(torch.opencl.memory_stats(device).items()))


# name in torch.accelerator (and torch.accelerator.memory) -> the opencl version, taking the device
_ROUTES: dict[str, Callable[..., Any]] = {
    "synchronize": lambda device=None: torch.opencl.synchronize(device),
    "current_stream": lambda device=None: torch.opencl.current_stream(device),
    "get_device_capability": _capability,
    "memory_stats": _memory_stats,
    "reset_peak_memory_stats": lambda device=None: torch.opencl.reset_peak_memory_stats(device),
    "reset_accumulated_memory_stats": lambda device=None: torch.opencl.reset_accumulated_memory_stats(device),
    "get_memory_info": lambda device=None: torch.opencl.mem_get_info(device),
    "empty_cache": lambda: torch.opencl.empty_cache(),
}
_MEMORY = ("memory_stats", "reset_peak_memory_stats", "reset_accumulated_memory_stats", "get_memory_info",
           "empty_cache")


def _routed(original: Callable[..., Any], ours: Callable[..., Any], takes_device: bool) -> Callable[..., Any]:
    """``original`` for other devices, ``ours`` for opencl. torch.compile's generated code calls
    ``current_stream`` between graphs; the route runs as plain Python there (Dynamo would otherwise trace
    it and every function it calls as frames of their own, and stop at ``torch.Stream``'s C++ ``__new__``
    with a warning)."""
    if takes_device:
        @functools.wraps(original)
        def routed(device: Any = None, /) -> Any:
            if _targets_opencl(device):
                return ours(device)
            return original() if device is None else original(device)
    else:
        @functools.wraps(original)
        def routed() -> Any:
            return ours() if _targets_opencl(None) else original()
    routed = torch.compiler.disable(routed, recursive=True)
    routed._tunecl = True
    return routed


def patch() -> None:
    """Route ``torch.accelerator``'s synchronize, current_stream, set_stream and memory functions to
    ``torch.opencl`` for the opencl device (once). ``memory_allocated``, ``max_memory_reserved`` and the
    like read ``memory_stats`` and follow it."""
    accelerator = torch.accelerator
    memory = torch.accelerator.memory
    for name, ours in _ROUTES.items():
        module = memory if name in _MEMORY else accelerator
        original = getattr(module, name)
        if getattr(original, "_tunecl", False):
            continue
        routed = _routed(original, ours, takes_device=name != "empty_cache")
        setattr(module, name, routed)
        setattr(accelerator, name, routed)
    original_set_stream = accelerator.set_stream
    if not getattr(original_set_stream, "_tunecl", False):
        @functools.wraps(original_set_stream)
        def set_stream(stream: torch.Stream) -> None:
            if isinstance(stream, torch.Stream) and stream.device.type == BACKEND:
                torch.opencl.set_stream(stream)
            else:
                original_set_stream(stream)

        set_stream._tunecl = True
        accelerator.set_stream = set_stream
