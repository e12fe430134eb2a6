"""``torch.opencl.get_device_properties()``: the OpenCL device under ``torch.cuda``'s attribute names.

Only what OpenCL reports directly is given: ``torch.cuda``'s compute capability (``major``/``minor``),
warp size, L2 size and UUID have no portable OpenCL query, so those attributes are absent rather than
guessed. Dict-style access (``props["name"]``) keeps serving the keys of
:meth:`tunecl.runtime.DeviceEntry.describe`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyopencl as cl

from tunecl.runtime import Device


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` gives, for the OpenCL device behind ``opencl:0``.

    Attributes:
        name: the device's name (``CL_DEVICE_NAME``).
        total_memory: global memory in bytes (``CL_DEVICE_GLOBAL_MEM_SIZE``).
        multi_processor_count: compute units (``CL_DEVICE_MAX_COMPUTE_UNITS``; SMs on NVIDIA, CUs on AMD).
        is_integrated: whether the device shares the host's memory (``CL_DEVICE_HOST_UNIFIED_MEMORY``).
        max_work_group_size: most work-items in one work-group (CUDA's threads per block).
        max_work_item_sizes: the most work-items per dimension of a work-group.
        shared_memory_per_block: local memory per work-group in bytes (CUDA's shared memory per block).
        max_alloc_size: the largest single buffer in bytes (``CL_DEVICE_MAX_MEM_ALLOC_SIZE``).
        clock_rate_mhz: the highest clock in MHz (``CL_DEVICE_MAX_CLOCK_FREQUENCY``).
        type: ``"gpu"``, ``"cpu"``, ``"accelerator"`` or ``"other"``.
        platform: the OpenCL platform's name.
        vendor: the device vendor's name.
        driver_version: ``CL_DRIVER_VERSION``.
        opencl_c_version: ``CL_DEVICE_OPENCL_C_VERSION``.
        index: the device's number in ``tunecl devices``.
    """

    name: str
    total_memory: int
    multi_processor_count: int
    is_integrated: bool
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    shared_memory_per_block: int
    max_alloc_size: int
    clock_rate_mhz: int
    type: str
    platform: str
    vendor: str
    driver_version: str
    opencl_c_version: str
    index: int
    _described: dict[str, Any] = dataclasses.field(repr=False, compare=False)

    def __getitem__(self, key: str) -> Any:
        """The value of ``key`` in :meth:`tunecl.runtime.DeviceEntry.describe` (``"name"``, ``"index"``,
        ``"type"``, ``"compute_units"``, ``"global_mem_bytes"``, ...)."""
        return self._described[key]

    def __repr__(self) -> str:
        return (f"_OpenCLDeviceProperties(name={self.name!r}, total_memory={self.total_memory >> 20}MB, "
                f"multi_processor_count={self.multi_processor_count}, "
                f"max_work_group_size={self.max_work_group_size}, type={self.type!r}, "
                f"platform={self.platform!r})")


def of(device: Device) -> DeviceProperties:
    """The properties of ``device`` (each read from the driver once per call)."""
    d = device.cl_device
    entry = device.entry
    try:
        integrated = bool(d.host_unified_memory)
    except cl.Error:  # CL_DEVICE_HOST_UNIFIED_MEMORY is deprecated since OpenCL 2.0; a driver may refuse it
        integrated = False
    return DeviceProperties(
        name=device.name, total_memory=int(d.global_mem_size), multi_processor_count=int(d.max_compute_units),
        is_integrated=integrated, max_work_group_size=int(d.max_work_group_size),
        max_work_item_sizes=tuple(int(n) for n in d.max_work_item_sizes),
        shared_memory_per_block=int(d.local_mem_size), max_alloc_size=int(d.max_mem_alloc_size),
        clock_rate_mhz=int(d.max_clock_frequency), type=entry.device_type, platform=entry.platform,
        vendor=d.vendor.strip(), driver_version=d.driver_version, opencl_c_version=d.opencl_c_version,
        index=entry.index, _described=entry.describe())
