"""The OpenCL devices of this machine: :func:`list_devices` numbers every device of every platform in a
stable order (devices whose compiler works first, then GPUs, accelerators, CPUs; within a type by platform
name and position), :func:`resolve` finds the entry a selector names, :func:`fingerprint_of` gives a
device's identity."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyopencl as cl

from tunecl import config
from tunecl.errors import DeviceNotFoundError
from tunecl.fingerprint import Fingerprint
from tunecl.runtime.build import compile_error

_TYPE_RANK = {"gpu": 0, "accelerator": 1, "cpu": 2, "other": 3}


def _device_type(device: cl.Device) -> str:
    if device.type & cl.device_type.GPU:
        return "gpu"
    if device.type & cl.device_type.ACCELERATOR:
        return "accelerator"
    if device.type & cl.device_type.CPU:
        return "cpu"
    return "other"


@dataclasses.dataclass(frozen=True)
class DeviceEntry:
    """One row of the device list: its number, where pyopencl finds it, and what it is."""

    index: int
    platform_index: int
    device_index: int
    platform: str
    name: str
    device_type: str
    cl_device: cl.Device = dataclasses.field(repr=False, compare=False)
    search_text: str = dataclasses.field(default="", repr=False, compare=False)
    compiler_error: str = ""  # why a probe build failed ("" = the device compiles OpenCL C)

    @property
    def usable(self) -> bool:
        return not self.compiler_error

    def describe(self) -> dict[str, Any]:
        d = self.cl_device
        return {
            "index": self.index, "selector": f"{self.platform_index}:{self.device_index}",
            "platform": self.platform, "name": self.name, "type": self.device_type,
            "compute_units": d.max_compute_units, "global_mem_bytes": d.global_mem_size,
            "local_mem_bytes": d.local_mem_size, "driver": d.driver_version,
            "opencl_c": d.opencl_c_version, "usable": self.usable, "compiler_error": self.compiler_error,
        }


_entries: list[DeviceEntry] | None = None
_lock = threading.RLock()


def list_devices() -> list[DeviceEntry]:
    """All OpenCL devices of all platforms, numbered in a stable order (cached per process)."""
    global _entries
    with _lock:
        if _entries is None:
            try:
                platforms = cl.get_platforms()
            except cl.Error:  # no ICD loader or no platform at all
                platforms = []
            found = []
            for p_index, platform in enumerate(platforms):
                try:
                    devices = platform.get_devices()
                except cl.Error:  # a platform with no usable device
                    continue
                for d_index, device in enumerate(devices):
                    found.append((platform, p_index, d_index, device))
            errors = {id(f[3]): _probe_compiler(f[3]) for f in found}
            # devices whose compiler works first, then GPUs, accelerators, CPUs, then platform name
            found.sort(key=lambda f: (bool(errors[id(f[3])]), _TYPE_RANK[_device_type(f[3])], f[0].name,
                                      f[1], f[2]))
            _entries = [
                DeviceEntry(i, p, d, plat.name.strip(), dev.name.strip(), _device_type(dev), dev,
                            " ".join((dev.name, dev.vendor, plat.name, plat.vendor)).lower(),
                            errors[id(dev)])
                for i, (plat, p, d, dev) in enumerate(found)]
        return list(_entries)


_PROBE_SOURCE = "__kernel void tunecl_probe(__global float *x) { x[get_global_id(0)] = 1.0f; }"


def _probe_compiler(device: cl.Device) -> str:
    """Build a trivial kernel once per device and driver; return the first line of the error, or "".

    Why: some OpenCL runtimes enumerate a device they cannot compile for (PyPI's PoCL 3.0, built on
    LLVM 14, fails with "unknown target CPU 'generic'" on CPUs newer than LLVM 14 knows, such as AMD
    Zen 5). Such a device must not become the default. The verdict is cached on disk per fingerprint.
    """
    fingerprint = fingerprint_of(device)
    cache = Path(config.get().cache_dir) / "probe" / f"{fingerprint.key}.json"
    try:
        return json.loads(cache.read_text())["compiler_error"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    error = ""
    try:
        context = cl.Context([device])
        cl.Program(context, _PROBE_SOURCE).build()
    except cl.Error as exc:
        error = compile_error(exc)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"device": fingerprint.label, "compiler_error": error}))
    except OSError:  # a read-only cache only costs a re-probe next time
        pass
    return error


def _available(entries: Sequence[DeviceEntry]) -> str:
    if not entries:
        return ("no OpenCL device is available (on Linux, `pip install pocl-binary-distribution` "
                "provides a CPU device)")
    rows = "; ".join(f"{e.index}: {e.name} [{e.platform}, {e.platform_index}:{e.device_index}]"
                     + ("" if e.usable else " (cannot compile)") for e in entries)
    return f"available devices: {rows}"


def resolve(selector: str | int | None = None) -> DeviceEntry:
    """The device entry a selector names.

    Args:
        selector: an index into :func:`list_devices` (``0``), ``platform:device`` pyopencl indices
            (``1:0``), or a case-insensitive part of the device's or platform's name or vendor
            (``h200``, ``nvidia``, ``pocl``);
            the first match in list order wins. ``None`` uses ``TUNECL_DEVICE`` (default ``0``).

    Raises:
        DeviceNotFoundError: nothing matches; the message lists the available devices.
    """
    entries = list_devices()
    text = str(config.get().device if selector is None else selector).strip()
    if text.isdigit():
        index = int(text)
        if index < len(entries):
            return entries[index]
        raise DeviceNotFoundError(f"no OpenCL device number {index}; {_available(entries)}")
    plat, sep, dev = text.partition(":")
    if sep and plat.strip().isdigit() and dev.strip().isdigit():
        for entry in entries:
            if (entry.platform_index, entry.device_index) == (int(plat), int(dev)):
                return entry
        raise DeviceNotFoundError(f"no OpenCL device at platform:device {text}; {_available(entries)}")
    needle = text.lower()
    for entry in entries:
        if needle and needle in entry.search_text:
            return entry
    raise DeviceNotFoundError(f"no OpenCL device matches {text!r}; {_available(entries)}")


def fingerprint_of(device: cl.Device, platform_name: str = "") -> Fingerprint:
    return Fingerprint(
        vendor=device.vendor.strip(), name=device.name.strip(), driver_version=device.driver_version.strip(),
        opencl_c_version=device.opencl_c_version.strip(), device_type=_device_type(device),
        compute_units=int(device.max_compute_units), max_work_group_size=int(device.max_work_group_size),
        local_mem_size=int(device.local_mem_size), global_mem_size=int(device.global_mem_size),
        platform=platform_name or device.platform.name.strip(), device_version=device.version.strip())
