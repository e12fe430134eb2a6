"""Capability probes: optional device features (tensor-core mma, cp.async, wgmma through inline PTX), each
granted only where its probe kernel (``capabilities.cl``, next to this module) ran exactly on the device.
:func:`capability_probes` runs them once per device model, driver and probe version, and caches the
verdicts on disk."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Protocol

import numpy as np
import pyopencl as cl

from tunecl import config
from tunecl.errors import BuildError
from tunecl.fingerprint import Fingerprint
from tunecl.precision import tf32_round
from tunecl.runtime.build import ARCH_PTX_OPTION, build_program, compile_error

MMA_TF32 = "mma_tf32"  # mma.sync m16n8k8 with TF32 operands and fp32 accumulation, via inline PTX
MMA_F16 = "mma_f16"    # mma.sync m16n8k16 with f16 operands and fp32 accumulation, via inline PTX
CP_ASYNC = "cp_async"  # cp.async global -> local copies (with zero fill) from a __local pointer, via PTX
WGMMA = "wgmma"        # wgmma.mma_async (sm_90a), TF32 and f16, operands in local memory, via PTX
CAPABILITY_PROBE_VERSION = 3  # bump when a probe changes: cached verdicts of other versions are ignored

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
        source = resources.files("tunecl.runtime").joinpath("capabilities.cl").read_text()
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
        return f"build failed: {compile_error(error)}"
    except BuildError as error:
        return f"build failed: {error}"
    try:
        return check(run)
    except cl.Error as error:
        return f"launch failed: {type(error).__name__}: {str(error).strip()[:200]}"


def _probe_mma(cl_device: cl.Device, define: str, data: Callable[[], tuple[np.ndarray, ...]],
               operand: Callable[[np.ndarray], np.ndarray]) -> str:
    """One mma on one warp (kernel ``define`` in lower case) of ``data()``'s A, B and C: "" when
    D = operand(A) @ operand(B) + C exactly, else why not."""
    def check(run: _ProbeRun) -> str:
        a, b, c = data()
        d_buf = run.buffer(c)
        kernel = getattr(run.program, define.lower())
        kernel(run.queue, (32,), (32,), run.buffer(a), run.buffer(b), d_buf).wait()
        expected = operand(a).astype(np.float64) @ operand(b).astype(np.float64) + c
        return _mismatch(run.read(d_buf, c), expected)

    return _probe(cl_device, define, check)


def _probe_mma_tf32(cl_device: cl.Device) -> str:
    """One m16n8k8 TF32 mma on one warp: "" when D = tf32(A) @ tf32(B) + C exactly, else why not."""
    return _probe_mma(cl_device, "PROBE_MMA_TF32", _mma_probe_data, tf32_round)


def _probe_mma_f16(cl_device: cl.Device) -> str:
    """One m16n8k16 f16 mma on one warp: "" when D = A @ B + C exactly (fp32), else why not."""
    return _probe_mma(cl_device, "PROBE_MMA_F16", _mma_f16_probe_data, np.asarray)


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


class ProbedDevice(Protocol):
    """What :func:`capability_probes` reads of a :class:`tunecl.runtime.Device`."""

    @property
    def fingerprint(self) -> Fingerprint: ...

    @property
    def cl_device(self) -> cl.Device: ...


# capability -> its probe (given the cl.Device); each returns "" when present, else the reason it is not
_PROBES: dict[str, Callable[[cl.Device], str]] = {MMA_TF32: _probe_mma_tf32, CP_ASYNC: _probe_cp_async,
                                                   MMA_F16: _probe_mma_f16, WGMMA: _probe_wgmma}


def capability_probes(device: ProbedDevice, *, force: bool = False) -> dict[str, str]:
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
