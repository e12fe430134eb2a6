"""The OpenCL runtime: device enumeration and selection, program builds, kernel launches, timing.

One small vocabulary over pyopencl: :func:`list_devices` gives every OpenCL device in a stable
numbered order (GPUs, then accelerators, then CPUs; within a type by platform name and position), and
:func:`select_device` returns the :class:`Device` a selector names. A ``Device`` owns a context and an
in-order profiling queue, builds programs through a cache keyed by (source hash, options, device,
driver) on top of the on-disk compile caches (pyopencl's; NVIDIA's driver's own; for PoCL, the
programs' binaries kept by :func:`build_program`), fetches each kernel once with its scalar argument
types set, and times launches with device events.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import threading
import warnings
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl import config
from tunecl.errors import BuildError, DeviceNotFoundError
from tunecl.fingerprint import Fingerprint
from tunecl.precision import tf32_round

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
_devices: dict[int, Device] = {}
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
        error = _compile_error(exc)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"device": fingerprint.label, "compiler_error": error}))
    except OSError:  # a read-only cache only costs a re-probe next time
        pass
    return error


MMA_TF32 = "mma_tf32"  # mma.sync m16n8k8 with TF32 operands and fp32 accumulation, via inline PTX
MMA_F16 = "mma_f16"    # mma.sync m16n8k16 with f16 operands and fp32 accumulation, via inline PTX
CP_ASYNC = "cp_async"  # cp.async global -> local copies (with zero fill) from a __local pointer, via PTX
WGMMA = "wgmma"        # wgmma.mma_async (sm_90a), TF32 and f16, operands in local memory, via PTX
AUTO_LAUNCH_BATCH = 32  # Device.defer's batch on CPU devices (TUNECL_LAUNCH_BATCH=auto)
AUTO_FLUSH_EVERY = 16  # Device.queue submits (clFlush) every this many uses on non-CPU devices (TUNECL_FLUSH_EVERY=auto)
CAPABILITY_PROBE_VERSION = 3  # bump when a probe changes: cached verdicts of other versions are ignored

# Architecture-specific PTX. NVIDIA's OpenCL compiler assembles for the plain target (sm_90 on an H200),
# which rejects sm_90a-only instructions such as wgmma, and takes no option to change the target. A
# kernel that needs them writes each such instruction after the ARCH_ASM macro; built with
# ARCH_PTX_OPTION, ARCH_ASM turns it into a PTX comment starting with ARCH_PTX_MARK, so the source
# compiles; build_program then restores the instructions in the compiled PTX, retargets it to sm_XXa and
# loads it as a program binary (NVIDIA's program binaries are PTX, which its driver assembles).
ARCH_PTX_OPTION = "-DTUNECL_ARCH_PTX=1"
ARCH_PTX_MARK = "//@arch "


def retarget_ptx(ptx: str) -> str:
    """``ptx`` (NVIDIA's compiled PTX of a program built with ARCH_PTX_OPTION) with its hidden
    instructions restored and its ``.target sm_XX`` made ``sm_XXa``; BuildError if it has neither."""
    if ARCH_PTX_MARK not in ptx:
        raise BuildError("the compiled program has no architecture-specific PTX (is this NVIDIA's compiler, "
                         "and does the kernel write its sm_90a instructions after ARCH_ASM?)")
    text, found = re.subn(r"^(\.target sm_\d+)(?=[,\s])", r"\1a", ptx.replace(ARCH_PTX_MARK, ""),
                          count=1, flags=re.MULTILINE)
    if not found:
        raise BuildError("the compiled PTX names no .target sm_XX to make architecture-specific")
    return text


# OpenCL lets float division be off by 2.5 ulp and sqrt by 3 unless a program is built with this option;
# NVIDIA's compiler uses that latitude (1/sqrt(x) off by up to 2 ulp, x/y by 2, on the H200), where torch
# rounds both correctly. Ill-conditioned results amplify the difference: a layer norm's weight gradient
# over one element, a cov gradient that cancels to ~0.
CORRECTLY_ROUNDED_DIVIDE_SQRT = "-cl-fp32-correctly-rounded-divide-sqrt"


def default_build_options(cl_device: cl.Device) -> tuple[str, ...]:
    """Options every program is built with on ``cl_device``: correctly rounded float division and sqrt
    (as torch computes them) where the device supports them."""
    try:
        config_bits = int(cl_device.single_fp_config)
    except cl.Error:
        return ()
    if config_bits & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
        return (CORRECTLY_ROUNDED_DIVIDE_SQRT,)
    return ()


def keeps_binaries(cl_device: cl.Device) -> bool:
    """Whether :func:`build_program` keeps the programs it builds for ``cl_device`` as binaries on disk:
    on the devices whose driver pyopencl leaves the caching to, but NVIDIA's. A hit in PoCL's own cache
    still runs its compiler's front end: 40-70 ms per program against 1 ms for loading the binary (PoCL
    3.1, one CPU core), most of a fresh process's first training step of a small net. (Elsewhere pyopencl
    keeps binaries itself.)"""
    from pyopencl.characterize import has_src_build_cache, nv_compute_capability

    return bool(has_src_build_cache(cl_device)) and nv_compute_capability(cl_device) is None


def _binary_path(cache_dir: str, cl_device: cl.Device, source: str, options: Sequence[str]) -> Path:
    """Where the binary of ``source`` built with ``options`` for ``cl_device`` is kept: named by a hash of
    them and of the device's platform, name and driver versions."""
    platform = cl_device.platform
    identity = (platform.name, platform.version, cl_device.name, cl_device.version, cl_device.driver_version)
    key = hashlib.sha256("\0".join((source, " ".join(options), *identity)).encode()).hexdigest()
    return Path(cache_dir) / "binaries" / f"{key}.bin"


def build_program(context: cl.Context, cl_device: cl.Device, source: str, options: Sequence[str],
                  cache_dir: str | None = None) -> cl.Program:
    """Compile ``source`` with ``options`` for one device; with ARCH_PTX_OPTION among them, by way of
    its retargeted PTX (see retarget_ptx). With ``cache_dir``, the on-disk caches serve a program built
    before: pyopencl's, the driver's, or where :func:`keeps_binaries`, the binary kept there (a kept
    binary the driver refuses is built again from source). Raises cl.Error as the compiler does."""
    kept = None
    if cache_dir is not None and ARCH_PTX_OPTION not in options and keeps_binaries(cl_device):
        kept = _binary_path(cache_dir, cl_device, source, options)
        with contextlib.suppress(OSError, cl.Error):
            return cl.Program(context, [cl_device], [kept.read_bytes()]).build(options=list(options))
    program = cl.Program(context, source).build(options=list(options), cache_dir=cache_dir)
    if kept is not None:
        _keep_binary(program, cl_device, kept)
    if ARCH_PTX_OPTION not in options:
        return program
    ptx = program.binaries[0].decode("utf-8", errors="replace").rstrip("\x00")
    return cl.Program(context, [cl_device], [retarget_ptx(ptx).encode() + b"\x00"]).build()


def _keep_binary(program: cl.Program, cl_device: cl.Device, path: Path) -> None:
    """Write ``program``'s binary for ``cl_device`` to ``path`` (whole or not at all: into a temporary file
    renamed over it; a cache that cannot be written only costs a build next time)."""
    with contextlib.suppress(OSError, cl.Error, ValueError):
        devices = program.get_info(cl.program_info.DEVICES)
        binary = program.get_info(cl.program_info.BINARIES)[devices.index(cl_device)]
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
        temporary.write_bytes(binary)
        os.replace(temporary, path)


def _compile_error(error: cl.Error) -> str:
    """What a failed build log says, in one line of at most 600 characters: its first three lines that
    mention an error, leaving out summaries such as ptxas's "Ptx assembly aborted due to errors" when a
    line says what the error is; the first line of the log when none mentions one."""
    lines = [ln.strip() for ln in str(error).splitlines() if "error" in ln.lower() and ln.strip()]
    specific = [ln for ln in lines if "aborted due to errors" not in ln.lower()]
    text = " | ".join((specific or lines)[:3]) or (str(error).splitlines()[0] if str(error) else "")
    return text[:600] or "build failed"


def _may_compile_ptx(fingerprint: Fingerprint) -> bool:
    """Whether the device's OpenCL compiler can be NVIDIA's (the only one known to accept inline PTX)."""
    return "nvidia" in f"{fingerprint.vendor} {fingerprint.platform}".lower()


def _mma_probe_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A (16 x 8), B (8 x 8) and C (16 x 8) of the mma probe: small integers (every sum exact in fp32),
    two of them with a fraction that cvt.rna.tf32.f32 rounds up (truncation would round it down)."""
    rng = np.random.default_rng(20240611)
    a = rng.integers(-4, 5, (16, 8)).astype(np.float32)
    b = rng.integers(-4, 5, (8, 8)).astype(np.float32)
    c = rng.integers(-4, 5, (16, 8)).astype(np.float32)
    a[3, 5] = 1 + 3 * 2.0**-12   # 0.75 TF32 ulp above 1: rounds to 1 + 2**-10
    b[5, 6] = -(2 + 3 * 2.0**-11)  # rounds to -(2 + 2**-9)
    return a, b, c


def _mma_f16_probe_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A (16 x 16), B (16 x 8) as float16 and C (16 x 8) as float32 of the f16 mma probe: small
    integers (every sum exact in fp32), and in A and B one value each that needs all 10 fraction bits
    of a half (bfloat16 or a lossy conversion would change D)."""
    rng = np.random.default_rng(20240612)
    a = rng.integers(-4, 5, (16, 16)).astype(np.float16)
    b = rng.integers(-4, 5, (16, 8)).astype(np.float16)
    c = rng.integers(-4, 5, (16, 8)).astype(np.float32)
    a[5, 11] = 1 + 2.0**-10   # exact in half, not in bfloat16
    b[13, 6] = -(3 + 2.0**-9)
    return a, b, c


def _cp_async_expected(src: np.ndarray) -> np.ndarray:
    """What probe_cp_async writes for ``src`` (128 floats): 16-, 8- and 4-byte copies per lane, the
    lanes with ``lane % 3 == 1`` zero-filling the second half of theirs (all of a 4-byte one)."""
    out = np.full(128, -1.0, np.float32)
    for lane in range(32):
        if lane < 16:
            start, width = 4 * lane, 4
        elif lane < 24:
            start, width = 64 + 2 * (lane - 16), 2
        else:
            start, width = 80 + lane - 24, 1
        copied = width // 2 if lane % 3 == 1 else width
        out[start:start + width] = 0.0
        out[start:start + copied] = src[start:start + copied]
    return out


class _ProbeRun:
    """A context and queue of their own for one probe, so a probe that faults leaves the device's
    working context (and its sticky errors) alone."""

    def __init__(self, cl_device: cl.Device, define: str):
        self.context = cl.Context([cl_device])
        self.queue = cl.CommandQueue(self.context, cl_device)
        source = resources.files("tunecl").joinpath("capabilities.cl").read_text()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyopencl warns about any non-empty build log
            options = [f"-D{define}"] + ([ARCH_PTX_OPTION] if define in _ARCH_PTX_PROBES else [])
            self.program = build_program(self.context, cl_device, source, options)

    def buffer(self, array: np.ndarray) -> cl.Buffer:
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
        return cl.Buffer(self.context, flags, hostbuf=np.ascontiguousarray(array))

    def read(self, buffer: cl.Buffer, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        cl.enqueue_copy(self.queue, out, buffer, is_blocking=True)
        return out


_ARCH_PTX_PROBES = {"PROBE_WGMMA"}  # probes of architecture-specific instructions (see ARCH_PTX_OPTION)


def _probe(cl_device: cl.Device, define: str, check: Callable[[_ProbeRun], str]) -> str:
    """Build the probe ``define`` selects in a context of its own and run ``check(run)`` on it."""
    try:
        run = _ProbeRun(cl_device, define)
    except cl.Error as error:
        return f"build failed: {_compile_error(error)}"
    except BuildError as error:
        return f"build failed: {error}"
    try:
        return check(run)
    except cl.Error as error:
        return f"launch failed: {type(error).__name__}: {str(error).strip()[:200]}"


def _probe_mma_tf32(cl_device: cl.Device) -> str:
    """One m16n8k8 TF32 mma on one warp: "" when D = tf32(A) @ tf32(B) + C exactly, else why not."""
    def check(run: _ProbeRun) -> str:
        a, b, c = _mma_probe_data()
        d_buf = run.buffer(c)
        run.program.probe_mma_tf32(run.queue, (32,), (32,), run.buffer(a), run.buffer(b), d_buf).wait()
        d = run.read(d_buf, c)
        expected = tf32_round(a).astype(np.float64) @ tf32_round(b).astype(np.float64) + c
        return _mismatch(d, expected)

    return _probe(cl_device, "PROBE_MMA_TF32", check)


def _probe_mma_f16(cl_device: cl.Device) -> str:
    """One m16n8k16 f16 mma on one warp: "" when D = A @ B + C exactly (fp32), else why not."""
    def check(run: _ProbeRun) -> str:
        a, b, c = _mma_f16_probe_data()
        d_buf = run.buffer(c)
        run.program.probe_mma_f16(run.queue, (32,), (32,), run.buffer(a), run.buffer(b), d_buf).wait()
        d = run.read(d_buf, c)
        expected = a.astype(np.float64) @ b.astype(np.float64) + c
        return _mismatch(d, expected)

    return _probe(cl_device, "PROBE_MMA_F16", check)


def _probe_cp_async(cl_device: cl.Device) -> str:
    """cp.async copies of 16, 8 and 4 bytes with zero fill: "" when the local words come out right."""
    def check(run: _ProbeRun) -> str:
        src = np.arange(1, 129, dtype=np.float32)
        dst = np.zeros(128, np.float32)
        dst_buf = run.buffer(dst)
        run.program.probe_cp_async(run.queue, (32,), (32,), run.buffer(src), dst_buf).wait()
        return _mismatch(run.read(dst_buf, dst), _cp_async_expected(src))

    return _probe(cl_device, "PROBE_CP_ASYNC", check)


# The layouts probe_wgmma runs: (f16, swizzle bytes, A MN-major, B MN-major): TF32 K-major with every
# swizzle, f16 with every swizzle and every pair of transpose flags (all that gemm_wgmma builds).
WGMMA_PROBE_CASES = [(0, sw, 0, 0) for sw in (0, 32, 64, 128)] + [
    (1, sw, a_mn, b_mn) for sw in (0, 32, 64, 128) for a_mn in (0, 1) for b_mn in (0, 1)
]


def _wgmma_probe_data(f16: bool, case: int) -> tuple[np.ndarray, np.ndarray]:
    """op(A) (64 x K) and op(B)^T (64 x K) of one probe_wgmma launch, K = 128 bytes of k: small
    integers, so every product and sum is exact in fp32 and any misplaced element changes D."""
    rng = np.random.default_rng(20240613 + case)
    k = 64 if f16 else 32
    a = rng.integers(-4, 5, (64, k))
    b = rng.integers(-4, 5, (64, k))
    dtype = np.float16 if f16 else np.float32
    return a.astype(dtype), b.astype(dtype)


def _probe_wgmma(cl_device: cl.Device) -> str:
    """64 x 64 wgmma products through every layout gemm_wgmma uses: "" when all are exact."""
    def check(run: _ProbeRun) -> str:
        kernel = run.program.probe_wgmma  # one retrieval for all cases
        for case, (f16, swizzle, a_mn, b_mn) in enumerate(WGMMA_PROBE_CASES):
            a, b = _wgmma_probe_data(bool(f16), case)
            out = np.zeros((64, 64), np.float32)
            info = np.full(1, 7, np.uint32)
            out_buf, info_buf = run.buffer(out), run.buffer(info)
            kernel(run.queue, (128,), (128,), run.buffer(a), run.buffer(b), out_buf, info_buf,
                   np.int32(f16), np.int32(swizzle), np.int32(a_mn), np.int32(b_mn)).wait()
            label = f"{'f16' if f16 else 'tf32'} swizzle {swizzle} A {'MN' if a_mn else 'K'}-major " \
                    f"B {'MN' if b_mn else 'K'}-major"
            misaligned = int(run.read(info_buf, info)[0])
            if misaligned:
                return f"local array not 1024-byte aligned (address % 1024 = {misaligned})"
            wrong = _mismatch(run.read(out_buf, out), a.astype(np.float64) @ b.astype(np.float64).T)
            if wrong:
                return f"{label}: {wrong}"
        return ""

    return _probe(cl_device, "PROBE_WGMMA", check)


def _mismatch(got: np.ndarray, expected: np.ndarray) -> str:
    """"" when ``got`` equals ``expected`` (up to 1e-6 relative), else where it does not."""
    wrong = ~(np.abs(got - expected) <= 1e-6 * (1 + np.abs(expected)))
    if not wrong.any():
        return ""
    where = tuple(int(i) for i in np.argwhere(wrong)[0])
    return (f"wrong result: {int(wrong.sum())} of {wrong.size} elements, first at {where}: "
            f"got {got[where]:.9g}, expected {expected[where]:.9g}")


# capability -> its probe (given the cl.Device); each returns "" when present, else the reason it is not
_PROBES: dict[str, Callable[[cl.Device], str]] = {MMA_TF32: _probe_mma_tf32, CP_ASYNC: _probe_cp_async,
                                                   MMA_F16: _probe_mma_f16, WGMMA: _probe_wgmma}


def capability_probes(device: Device, *, force: bool = False) -> dict[str, str]:
    """Every capability probe's verdict for ``device``: name -> "" (present) or why not.

    Probes run once per device model and driver (fingerprint key) and probe version; the verdicts are
    cached on disk in the cache folder. On devices whose compiler cannot be NVIDIA's the PTX probes are
    skipped (``force``: run them anyway, uncached — for tests).
    """
    fingerprint = device.fingerprint
    if not force and not _may_compile_ptx(fingerprint):
        return {name: "not an NVIDIA OpenCL device: inline PTX is not compiled" for name in _PROBES}
    cache = Path(config.get().cache_dir) / "probe" / f"{fingerprint.key}.capabilities.json"
    if not force:
        try:
            cached = json.loads(cache.read_text())
            if cached["version"] == CAPABILITY_PROBE_VERSION and set(cached["probes"]) == set(_PROBES):
                return {str(k): str(v) for k, v in cached["probes"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            pass
    verdicts = {name: probe(device.cl_device) for name, probe in _PROBES.items()}
    if not force:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"device": fingerprint.label, "version": CAPABILITY_PROBE_VERSION,
                                         "probes": verdicts}))
        except OSError:  # a read-only cache only costs a re-probe next time
            pass
    return verdicts


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


def open_devices() -> list[Device]:
    """The devices this process has opened (by :func:`select_device`)."""
    with _lock:
        return list(_devices.values())


def select_device(selector: str | int | None = None) -> Device:
    """The :class:`Device` a selector names (one object per device per process)."""
    entry = resolve(selector)
    with _lock:
        device = _devices.get(entry.index)
        if device is None:
            device = _devices[entry.index] = Device(entry)
        return device


def fingerprint_of(device: cl.Device, platform_name: str = "") -> Fingerprint:
    return Fingerprint(
        vendor=device.vendor.strip(), name=device.name.strip(), driver_version=device.driver_version.strip(),
        opencl_c_version=device.opencl_c_version.strip(), device_type=_device_type(device),
        compute_units=int(device.max_compute_units), max_work_group_size=int(device.max_work_group_size),
        local_mem_size=int(device.local_mem_size), global_mem_size=int(device.global_mem_size),
        platform=platform_name or device.platform.name.strip(), device_version=device.version.strip())


class Device:
    """One OpenCL device: context, in-order queue, program/kernel caches, buffers, timing.

    The queue profiles its commands (every event carries device timestamps) unless
    :meth:`set_profiling_default` turned that off, as the PyTorch backend does: on NVIDIA's driver a launch
    on a profiling queue costs ~16 µs of host time against ~11 µs without (``benchmarks/launch_cost.py``
    on the H200). Whatever reads event times (the tuner's measurements, :class:`tunecl.profiling.KernelProfile`)
    does so inside :meth:`profiling`, which moves the device to its profiling queue for the block.
    """

    def __init__(self, entry: DeviceEntry):
        self.entry = entry
        self.index = entry.index
        self.cl_device = entry.cl_device
        self.name = entry.name
        self.fingerprint = fingerprint_of(entry.cl_device, entry.platform)
        self.context = cl.Context([entry.cl_device])
        self._profiling_queue = cl.CommandQueue(self.context, entry.cl_device,
                                                properties=cl.command_queue_properties.PROFILING_ENABLE)
        self._plain_queue: cl.CommandQueue | None = None  # made when profiling is first turned off
        self._queue = self._profiling_queue  # the queue in use: one of the two
        self._profile_by_default = True
        self._profiling_depth = 0  # open profiling() blocks
        self._queue_lock = threading.RLock()
        settings = config.get()
        cpu = self.fingerprint.device_type == "cpu"
        batch = settings.launch_batch
        self.launch_batch = (AUTO_LAUNCH_BATCH if cpu else 0) if batch is None else batch
        every = settings.flush_every
        self.flush_every = (0 if cpu else AUTO_FLUSH_EVERY) if every is None else every
        self._queue_uses = 0
        self._deferred: list[tuple[cl.Kernel, tuple[int, ...], tuple[int, ...] | None, list]] = []
        self._deferred_lock = threading.RLock()  # reentrant: a finalizer run by the GC mid-flush may flush
        self._held: tuple[object, tuple, Callable[[], cl.Kernel]] | None = None   # see hold()
        self.local_mem_size = int(entry.cl_device.local_mem_size)
        self.max_work_group_size = int(entry.cl_device.max_work_group_size)
        self.max_alloc_size = int(entry.cl_device.max_mem_alloc_size)
        self._programs: dict[tuple[str, tuple[str, ...]], cl.Program] = {}
        self._kernels: dict[tuple[int, str], cl.Kernel] = {}
        self._lock = threading.RLock()
        self._capabilities: frozenset[str] | None = None
        self._default_options = default_build_options(entry.cl_device)

    @property
    def capabilities(self) -> frozenset[str]:
        """Optional features a probe showed this device to have (``{"mma_tf32", "cp_async", "mma_f16", "wgmma"}``; empty
        on PoCL).

        Not part of the fingerprint: the fingerprint key (model and driver) determines them, and the DB
        keys results by fingerprint, so adding them there would only change existing keys. Probed on
        first use (see :func:`capability_probes`), then kept.
        """
        with self._lock:
            if self._capabilities is None:
                self._capabilities = frozenset(
                    name for name, reason in capability_probes(self).items() if not reason)
            return self._capabilities

    def __repr__(self) -> str:
        return f"<tunecl.Device {self.index}: {self.name} [{self.entry.platform}]>"

    # -- the queue and deferred launches -----------------------------------------------------------
    @property
    def queue(self) -> cl.CommandQueue:
        """The in-order queue in use (see the class docstring), with every deferred launch enqueued first:
        whatever the caller enqueues next, or waits for, comes after them (see :meth:`defer`)."""
        if self._deferred:
            self.flush()
        if self.flush_every:
            # Submit what was enqueued so far every few uses (each launch, copy or wait uses the queue
            # once): NVIDIA's driver otherwise holds a non-profiling queue's commands back, and the
            # device idles while the host enqueues (resnet50 batch 16 training on the H200: 83.4 ms per
            # step without, 73.8 ms flushing every 16 uses; inference 18.5 -> 17.1 ms).
            self._queue_uses += 1
            if self._queue_uses >= self.flush_every:
                self._queue_uses = 0
                self._queue.flush()
        return self._queue

    @property
    def profiles(self) -> bool:
        """Whether commands enqueued now get events with device timestamps."""
        return self._queue is self._profiling_queue

    def set_profiling_default(self, enabled: bool) -> None:
        """Profile commands outside :meth:`profiling` blocks (``True``, the default) or not."""
        with self._queue_lock:
            self._profile_by_default = enabled
            if not self._profiling_depth:
                self._use_queue(enabled)

    @contextlib.contextmanager
    def profiling(self):
        """A block whose commands get profiling events (blocks nest; the queue switches back after the
        outermost). Switching queues waits for everything enqueued on the previous one, so commands stay
        in order; inside a block that was already profiling it costs nothing."""
        with self._queue_lock:
            self._profiling_depth += 1
            if self._profiling_depth == 1:
                self._use_queue(True)
        try:
            yield self
        finally:
            with self._queue_lock:
                self._profiling_depth -= 1
                if not self._profiling_depth:
                    self._use_queue(self._profile_by_default)

    def _use_queue(self, profiling: bool) -> None:  # with _queue_lock held
        if profiling:
            target = self._profiling_queue
        else:
            if self._plain_queue is None:
                self._plain_queue = cl.CommandQueue(self.context, self.cl_device)
            target = self._plain_queue
        if target is self._queue:
            return
        self.flush()  # deferred launches belong to the queue in use so far
        self._queue.finish()
        self._queue = target

    def defer(self, kernel: cl.Kernel, global_size: tuple[int, ...], local_size: tuple[int, ...] | None,
              args: list) -> None:
        """Launch ``kernel`` on ``args`` after the launches deferred before it, possibly later.

        On a CPU device the driver's worker threads share the host's cores and sleep between commands;
        enqueueing one small kernel at a time wakes them every time (PoCL: 4 µs per enqueue back to back,
        9-11 µs when the host spends 10-20 µs between them). So the backend's elementwise launches wait in
        a list of up to ``launch_batch`` and are enqueued together, which keeps the workers busy. Order
        is never changed: any use of :attr:`queue` (every other enqueue, read, copy and
        :meth:`synchronize`) enqueues the waiting launches first, and ``args`` keep their buffers alive.
        A launch that fails to enqueue raises from the call that flushed it. With ``launch_batch`` 0 or
        1 the kernel is enqueued now.
        """
        if self.launch_batch <= 1:  # (through the property: launches deferred under an earlier batch go first)
            kernel(self.queue, global_size, local_size, *args)
            return
        with self._deferred_lock:
            self._deferred.append((kernel, global_size, local_size, args))
            if len(self._deferred) < self.launch_batch:
                return
            waiting, self._deferred = self._deferred, []
            self._enqueue(waiting)

    def hold(self, kernel: cl.Kernel, global_size: tuple[int, ...], local_size: tuple[int, ...] | None,
             args: list, tag: object, fused: Callable[[], cl.Kernel]) -> None:
        """Defer one launch, whatever ``launch_batch`` is, so that the op right after it may run ``fused()``
        (a kernel with the same grid and arguments that also does that op's work) instead, by
        :meth:`replace_held` with the same ``tag``. Like every deferred launch it is enqueued, in order,
        with the next use of :attr:`queue`."""
        entry = (kernel, global_size, local_size, args)
        with self._deferred_lock:
            # what waits already goes first, as defer would send it (a run of held launches never piles up)
            if self._deferred and (self.launch_batch <= 1 or len(self._deferred) >= self.launch_batch):
                self.queue   # noqa: B018 (the property enqueues the waiting launches and counts the use)
            self._deferred.append(entry)
            self._held = (tag, entry, fused)

    def replace_held(self, tag: object) -> bool:
        """Launch the fused kernel of the launch held under ``tag`` instead of it, if that is still the last
        deferred launch; False when it was enqueued already or another launch came after it."""
        with self._deferred_lock:
            held = self._held
            if held is None or held[0] != tag or not self._deferred or self._deferred[-1] is not held[1]:
                return False
            _, global_size, local_size, args = held[1]
            self._deferred[-1] = (held[2](), global_size, local_size, args)
            self._held = None
            return True

    def flush(self) -> None:
        """Enqueue every deferred launch now (in order)."""
        with self._deferred_lock:
            waiting, self._deferred = self._deferred, []
            self._enqueue(waiting)

    def _enqueue(self, waiting: list) -> None:  # with _deferred_lock held, so flushes keep their order
        self._held = None
        for index, (kernel, global_size, local_size, args) in enumerate(waiting):
            try:
                kernel(self._queue, global_size, local_size, *args)
            except cl.Error as error:
                error.add_note(f"(a deferred launch of {kernel.function_name}; the {len(waiting) - index - 1} "
                               f"deferred launches after it were dropped)")
                raise

    # -- programs and kernels ---------------------------------------------------------------------
    def build(self, source: str, options: Sequence[str] = ()) -> cl.Program:
        """Compile ``source`` with ``options`` (``-DNAME=VALUE`` ...), once per process.

        The in-process cache is keyed by (source hash, options); the device and driver are fixed per
        ``Device``. An on-disk cache spares recompiles across processes: the binaries in
        ``TUNECL_CACHE_DIR`` (pyopencl's, or for PoCL :func:`build_program`'s), or NVIDIA's driver's own
        cache; all are disposable and kept apart from tuning data.

        Raises:
            BuildError: the compiler rejected the program; the message carries the build log.
        """
        options = tuple(options) + tuple(o for o in self._default_options if o not in options)
        key = (hashlib.sha256(source.encode()).hexdigest(), options)
        with self._lock:
            program = self._programs.get(key)
            if program is not None:
                return program
        cache_dir = Path(config.get().cache_dir) / "pyopencl"
        cache_dir.mkdir(parents=True, exist_ok=True)
        try:
            with warnings.catch_warnings():
                # NVIDIA's compiler logs on every build ("Non-empty compiler output" warnings, one per
                # program, say nothing to a user); PYOPENCL_COMPILER_OUTPUT=1 shows the logs again.
                if not os.environ.get("PYOPENCL_COMPILER_OUTPUT"):
                    warnings.simplefilter("ignore", cl.CompilerWarning)
                program = build_program(self.context, self.cl_device, source, options, str(cache_dir))
        except cl.Error as error:
            raise BuildError(f"OpenCL build failed on {self.name} with options {' '.join(options)}:\n"
                             f"{error}") from None
        with self._lock:
            return self._programs.setdefault(key, program)

    def kernel(self, program: cl.Program, name: str, scalar_dtypes: Sequence[Any] | None = None) -> cl.Kernel:
        """Fetch kernel ``name`` of ``program`` once, with scalar argument dtypes set for fast launches.

        Args:
            scalar_dtypes: one entry per kernel argument: a numpy dtype for scalars, ``None`` for
                buffers and local memory. Without it pyopencl spends ~6 µs per scalar per launch.
        """
        key = (id(program), name)
        with self._lock:
            kernel = self._kernels.get(key)
            if kernel is None:
                kernel = cl.Kernel(program, name)
                if scalar_dtypes is not None:
                    kernel.set_scalar_arg_dtypes(list(scalar_dtypes))
                # (graphs make copies of a kernel with their own arguments: they need the same dtypes)
                kernel._tunecl_dtypes = None if scalar_dtypes is None else list(scalar_dtypes)
                self._kernels[key] = kernel
                # keep the program alive as long as its kernels are cached (id() must stay unique)
                kernel._tunecl_program = program
            return kernel

    def kernel_max_threads(self, kernel: cl.Kernel) -> int:
        """The most work-items per work-group ``kernel`` can launch with here: the device's limit, or
        fewer where each work-item needs many registers (CL_KERNEL_WORK_GROUP_SIZE)."""
        return int(kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.cl_device))

    def launch(self, kernel: cl.Kernel, global_size: Sequence[int], local_size: Sequence[int] | None,
               *args: Any, wait_for: Sequence[cl.Event] | None = None) -> cl.Event:
        """Enqueue ``kernel`` over ``global_size`` (rounded by the caller) without waiting."""
        return kernel(self.queue, tuple(global_size), None if local_size is None else tuple(local_size),
                      *args, wait_for=wait_for)

    # -- memory -------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> cl.Buffer:
        """A device buffer of ``nbytes`` (at least 1 byte: OpenCL forbids empty buffers)."""
        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, size=max(int(nbytes), 1))

    def upload(self, array: np.ndarray) -> cl.Buffer:
        """A new device buffer holding a copy of ``array`` (copied synchronously)."""
        array = np.ascontiguousarray(array)
        buffer = self.alloc(array.nbytes)
        if array.nbytes:
            cl.enqueue_copy(self.queue, buffer, array, is_blocking=True)
        return buffer

    def copyin(self, buffer: cl.Buffer, array: np.ndarray, offset: int = 0, wait: bool = True) -> cl.Event:
        """Copy host ``array`` into ``buffer`` at byte ``offset``."""
        array = np.ascontiguousarray(array)
        return cl.enqueue_copy(self.queue, buffer, array, dst_offset=offset, is_blocking=wait)

    def copyout(self, array: np.ndarray, buffer: cl.Buffer, offset: int = 0) -> np.ndarray:
        """Copy ``array.nbytes`` bytes of ``buffer`` from byte ``offset`` into contiguous ``array``."""
        if array.nbytes:
            cl.enqueue_copy(self.queue, array, buffer, src_offset=offset, is_blocking=True)
        return array

    def download(self, buffer: cl.Buffer, shape: Sequence[int], dtype: Any = np.float32,
                 offset: int = 0) -> np.ndarray:
        return self.copyout(np.empty(tuple(shape), dtype=dtype), buffer, offset)

    def synchronize(self) -> None:
        self.queue.finish()

    # -- timing -------------------------------------------------------------------------------------
    @staticmethod
    def elapsed(first: cl.Event, last: cl.Event | None = None) -> float:
        """Seconds of device time from the start of ``first`` to the end of ``last`` (or ``first``)."""
        last = first if last is None else last
        last.wait()
        return (last.profile.end - first.profile.start) * 1e-9
