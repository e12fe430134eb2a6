"""The OpenCL runtime: device enumeration and selection, program builds, kernel launches, timing.

One small vocabulary over pyopencl: :func:`list_devices` gives every OpenCL device in a stable
numbered order (GPUs, then accelerators, then CPUs; within a type by platform name and position), and
:func:`select_device` returns the :class:`Device` a selector names. A ``Device`` owns a context and an
in-order profiling queue, builds programs through a cache keyed by (source hash, options, device,
driver) on top of the on-disk compile caches (pyopencl's; NVIDIA's driver's own; for PoCL, the
programs' binaries kept by :func:`build_program`), fetches each kernel once with its scalar argument
types set, and times launches with device events.

The modules: ``devices`` (the device list, selectors, fingerprints), ``selection`` (the one ``Device``
per device), ``device`` (``Device``), ``build`` (build options, kept binaries, the PTX retargeting) and
``probes`` (capability probes, with their kernels in ``capabilities.cl``). This package re-exports their
public names; ``addresses`` (buffers' device addresses, for kernels that take pointers by value) is used
as a module.
"""

from tunecl.runtime.build import (
    ARCH_PTX_MARK,
    ARCH_PTX_OPTION,
    CORRECTLY_ROUNDED_DIVIDE_SQRT,
    build_program,
    compile_error,
    default_build_options,
    keeps_binaries,
    retarget_ptx,
)
from tunecl.runtime.device import AUTO_FLUSH_EVERY, AUTO_LAUNCH_BATCH, Device
from tunecl.runtime.devices import DeviceEntry, fingerprint_of, list_devices, resolve
from tunecl.runtime.probes import (
    CAPABILITY_PROBE_VERSION,
    CP_ASYNC,
    MMA_F16,
    MMA_TF32,
    WGMMA,
    WGMMA_PROBE_CASES,
    capability_probes,
)
from tunecl.runtime.selection import open_devices, select_device

__all__ = [
    "ARCH_PTX_MARK", "ARCH_PTX_OPTION", "AUTO_FLUSH_EVERY", "AUTO_LAUNCH_BATCH", "CAPABILITY_PROBE_VERSION",
    "CORRECTLY_ROUNDED_DIVIDE_SQRT", "CP_ASYNC", "MMA_F16", "MMA_TF32", "WGMMA", "WGMMA_PROBE_CASES",
    "Device", "DeviceEntry", "build_program", "capability_probes", "compile_error", "default_build_options",
    "fingerprint_of", "keeps_binaries", "list_devices", "open_devices", "resolve", "retarget_ptx",
    "select_device",
]
