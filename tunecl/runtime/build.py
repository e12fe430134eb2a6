"""Program builds: the options every program gets, the binaries kept on disk for PoCL, the architecture-
specific PTX route of NVIDIA's compiler (:func:`retarget_ptx`), and a failed build's log in one line."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import pyopencl as cl

from tunecl.errors import BuildError

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
    keeps binaries itself.) Asking PoCL for a program's binary costs a code generation of every kernel in
    it (about 200 ms a program, as much as the build), so a binary is kept only when a program is built a
    second time, not in the first process that builds it (:func:`build_program`)."""
    from pyopencl.characterize import has_src_build_cache, nv_compute_capability

    return bool(has_src_build_cache(cl_device)) and nv_compute_capability(cl_device) is None


# True in a process whose builds are made for another one (tunecl tune --jobs's build workers,
# tunecl.search.prebuild): build_program keeps every binary at its first build
KEEP_AT_FIRST_BUILD = False


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
    before: pyopencl's, the driver's, or where :func:`keeps_binaries`, the binary kept there. A program
    built from source there is marked as seen; its binary is kept when it is built from source again (in
    another process: the programs a process builds once, such as a test's, never pay for their binaries),
    or at once under :data:`KEEP_AT_FIRST_BUILD`. A kept binary the driver refuses is built again from
    source and kept anew. Raises cl.Error as the compiler does."""
    kept = None
    if cache_dir is not None and ARCH_PTX_OPTION not in options and keeps_binaries(cl_device):
        kept = _binary_path(cache_dir, cl_device, source, options)
        with contextlib.suppress(OSError, cl.Error):
            return cl.Program(context, [cl_device], [kept.read_bytes()]).build(options=list(options))
    program = cl.Program(context, source).build(options=list(options), cache_dir=cache_dir)
    if kept is not None:
        seen = kept.with_suffix(".seen")
        if KEEP_AT_FIRST_BUILD or kept.exists() or seen.exists():
            _keep_binary(program, cl_device, kept)
            with contextlib.suppress(OSError):
                seen.unlink(missing_ok=True)
        else:
            with contextlib.suppress(OSError):
                seen.parent.mkdir(parents=True, exist_ok=True)
                seen.touch()
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


def compile_error(error: cl.Error) -> str:
    """What a failed build log says, in one line of at most 600 characters: its first three lines that
    mention an error, leaving out summaries such as ptxas's "Ptx assembly aborted due to errors" when a
    line says what the error is; the first line of the log when none mentions one."""
    lines = [ln.strip() for ln in str(error).splitlines() if "error" in ln.lower() and ln.strip()]
    specific = [ln for ln in lines if "aborted due to errors" not in ln.lower()]
    text = " | ".join((specific or lines)[:3]) or (str(error).splitlines()[0] if str(error) else "")
    return text[:600] or "build failed"
