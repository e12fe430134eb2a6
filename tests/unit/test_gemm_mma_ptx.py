"""The PTX of gemm_mma.cl (both variants: gemm_mma_tf32 and, with MMA_F16, gemm_mma_f16) and of the
capability probes assembles for sm_90 (an H200), where the tools exist.

No GPU is needed: clang compiles the OpenCL C for NVPTX (``nvptx_shim.cl`` maps the work-item functions)
and NVIDIA's ``ptxas`` assembles the result for sm_90, which checks the inline PTX (operand counts,
constraints, types) and shows register use and spills. NVIDIA's OpenCL compiler is not clang, so this
is a check of the PTX, not a prediction of the driver's code; the GPU run is the real test.
Skipped unless ``clang`` (15+) and ``ptxas`` are on the PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import types
from importlib import resources
from pathlib import Path

import draws
import pytest

from tunecl.kernels.gemm import gemm_mma
from tunecl.kernels.base import build_options, kernel_folders
from tunecl.problems import GemmProblem

HERE = Path(__file__).resolve().parent
CLANG = next(
    (
        shutil.which(name)
        for name in ("clang-15", "clang-16", "clang-17", "clang-18", "clang")
        if shutil.which(name)
    ),
    None,
)
PTXAS = shutil.which("ptxas")
pytestmark = pytest.mark.skipif(not (CLANG and PTXAS), reason="needs clang with NVPTX and ptxas")

# configs drawn per random test with the day's seed, the transposes and variants rotating over them; 8 with
# TUNECL_RANDOM_CONFIGS=full (tests/draws.py)
RANDOM_CONFIGS = draws.count(per_run=2, full=8)
H200 = types.SimpleNamespace(
    local_mem_size=48 * 1024,
    max_work_group_size=1024,
    capabilities={"mma_tf32", "cp_async", "mma_f16"},
    fingerprint=types.SimpleNamespace(vendor="NVIDIA", device_type="gpu", compute_units=132),
)


def assemble(source: Path, options: list[str], tmp_path: Path) -> tuple[str, str]:
    """(PTX, ptxas -v report) of ``source`` compiled with ``options``."""
    ptx = tmp_path / "kernel.ptx"
    clang = [
        CLANG,
        "-x",
        "cl",
        "-cl-std=CL1.2",
        "-target",
        "nvptx64-nvidia-nvcl",
        "-Xclang",
        "-finclude-default-header",
        "-Xclang",
        "-target-cpu",
        "-Xclang",
        "sm_80",
        "-Xclang",
        "-target-feature",
        "-Xclang",
        "+ptx75",
        "-O3",
        "-mllvm",
        "-inline-threshold=100000",
        "-S",
        "-o",
        str(ptx),
        f'-DSOURCE="{source}"',
        # clang looks for an include next to the including file, then here: read_source's order
        *(f"-I{folder}" for folder in kernel_folders()),
        *options,
        str(HERE / "nvptx_shim.cl"),
    ]
    done = subprocess.run(clang, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = subprocess.run(
        [PTXAS, "-arch=sm_90", "-v", str(ptx), "-o", str(tmp_path / "kernel.cubin")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    return ptx.read_text(), report.stdout + report.stderr


def kernel_options(problem: GemmProblem, config: dict[str, int], variant=(True, True, True)) -> list[str]:
    """The -D options GemmMmaTF32.build (GemmMmaF16.build for float16 problems) passes for ``variant``
    (aligned A, B, C)."""
    plan_options = {k: v for k, v in config.items() if k not in ("VW", "MAXRREG")}
    plan_options.update(
        VWA=config["VW"] if variant[0] else 1,
        VWB=config["VW"] if variant[1] else 1,
        CSCALAR=int(not variant[2]),
    )
    layout = [f"-DTRANS_A={int(problem.trans_a)}", f"-DTRANS_B={int(problem.trans_b)}"]
    if problem.dtype == "float16":
        layout.append("-DMMA_F16=1")
    return build_options(plan_options, layout)


def test_the_probes_assemble(tmp_path):
    source = Path(str(resources.files("tunecl.runtime").joinpath("capabilities.cl")))
    ptx, _ = assemble(source, ["-DPROBE_MMA_TF32"], tmp_path)
    assert ptx.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") == 1
    assert ptx.count("cvt.rna.tf32.f32") >= 6 and "cp.async" not in ptx
    ptx, _ = assemble(source, ["-DPROBE_MMA_F16"], tmp_path)
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 1
    assert "tf32" not in ptx and "cp.async" not in ptx
    ptx, _ = assemble(source, ["-DPROBE_CP_ASYNC"], tmp_path)
    assert [ptx.count(f"cp.async.{kind}.shared.global") for kind in ("cg", "ca")] == [1, 2]
    assert "cp.async.wait_group 0" in ptx and "mma" not in ptx


@pytest.mark.parametrize(
    "transposes", [(False, False), (False, True), (True, False), (True, True)], ids=["nn", "nt", "tn", "tt"]
)
def test_the_default_assembles_without_spills(transposes, tmp_path):
    p = GemmProblem(4096, 4096, 4096, *transposes)
    config = gemm_mma.GemmMmaTF32().default(p, H200)
    source = Path(str(resources.files("tunecl.kernels.gemm").joinpath("gemm_mma.cl")))
    ptx, report = assemble(source, kernel_options(p, config), tmp_path)
    # 4 x 4 mma tiles per 8-deep step, 2 steps per KWG = 16 tile: at least 32 mma in the main loop
    assert ptx.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") >= 32
    assert "cvt.rna.tf32.f32" in ptx
    if not p.trans_a or p.trans_b:  # a K-contiguous local tile: KPAIR reads pairs
        assert "ld.shared.v2.u32" in ptx
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    print(f"{transposes}: {registers} registers; {report.strip().splitlines()[-2]}")
    assert " 0 bytes spill stores" in report, report


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_cp_async_pipelines_assemble_without_spills(stages, tmp_path):
    p = GemmProblem(4096, 4096, 4096)
    config = {
        **gemm_mma.GemmMmaTF32().default(p, H200),
        "ASYNC": 1,
        "STAGES": stages,
        "KWG": 16 if stages == 2 else 8,
    }  # 48 KiB of local memory
    source = Path(str(resources.files("tunecl.kernels.gemm").joinpath("gemm_mma.cl")))
    ptx, report = assemble(source, kernel_options(p, config), tmp_path)
    assert "cp.async.cg.shared.global" in ptx and f"cp.async.wait_group {stages - 2}" in ptx
    print(f"STAGES={stages}: {report.strip().splitlines()[-2]}")
    assert " 0 bytes spill stores" in report, report


def test_random_configs_and_scalar_variants_assemble(tmp_path):
    source = Path(str(resources.files("tunecl.kernels.gemm").joinpath("gemm_mma.cl")))
    pick = draws.rng("gemm_mma_ptx/tf32")
    first = pick.randrange(12)   # where in the 12-long cycle of transposes and variants the draws start
    for index in range(first, first + RANDOM_CONFIGS):
        transposes = [(False, False), (False, True), (True, False), (True, True)][index % 4]
        p = GemmProblem(2048, 512, 256, *transposes)
        config = pick.choice(gemm_mma.GemmMmaTF32().space(p, H200).configs())
        variant = (index % 2 == 0, index % 3 == 0, index % 2 == 1)
        ptx, _ = assemble(source, kernel_options(p, config, variant), tmp_path)
        assert "mma.sync.aligned.m16n8k8" in ptx, config


# ---- gemm_mma_f16 -------------------------------------------------------------------------------------

F16_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"


@pytest.mark.parametrize(
    "transposes", [(False, False), (False, True), (True, False), (True, True)], ids=["nn", "nt", "tn", "tt"]
)
def test_the_f16_default_assembles_without_spills(transposes, tmp_path):
    p = GemmProblem(4096, 4096, 4096, *transposes, dtype="float16")
    config = gemm_mma.GemmMmaF16().default(p, H200)
    source = Path(str(resources.files("tunecl.kernels.gemm").joinpath("gemm_mma.cl")))
    ptx, report = assemble(source, kernel_options(p, config), tmp_path)
    # 4 x 4 mma tiles per 16-deep step, 2 steps per KWG = 32 tile: at least 32 mma in the main loop
    assert ptx.count(F16_MMA) >= 32
    assert "tf32" not in ptx  # no TF32 conversion or mma in the f16 variant
    assert "ld.global.v4.u32" in ptx or "ld.global.nc.v4.u32" in ptx  # 8 halves per global load
    if not p.trans_a or p.trans_b:  # a K-contiguous local tile: KPAIR reads 4 halves at once
        assert "ld.shared.v2.u32" in ptx
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    print(f"f16 {transposes}: {registers} registers; {report.strip().splitlines()[-2]}")
    assert " 0 bytes spill stores" in report, report


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_f16_cp_async_pipelines_assemble_without_spills(stages, tmp_path):
    p = GemmProblem(4096, 4096, 4096, dtype="float16")
    config = {
        **gemm_mma.GemmMmaF16().default(p, H200),
        "ASYNC": 1,
        "STAGES": stages,
        "KWG": 32 if stages == 2 else 16,
    }
    source = Path(str(resources.files("tunecl.kernels.gemm").joinpath("gemm_mma.cl")))
    ptx, report = assemble(source, kernel_options(p, config), tmp_path)
    assert "cp.async.cg.shared.global" in ptx and f"cp.async.wait_group {stages - 2}" in ptx
    assert ptx.count(F16_MMA) >= 16
    print(f"f16 STAGES={stages}: {report.strip().splitlines()[-2]}")
    assert " 0 bytes spill stores" in report, report


def test_random_f16_configs_and_scalar_variants_assemble(tmp_path):
    """Seeded configs with aligned and scalar (VWA/VWB = 1, CSCALAR) variants; a scalar operand with
    cp.async copies single halves without cp.async (it copies 4 bytes at least)."""
    source = Path(str(resources.files("tunecl.kernels.gemm").joinpath("gemm_mma.cl")))
    pick = draws.rng("gemm_mma_ptx/f16")
    first = pick.randrange(12)   # where in the 12-long cycle of transposes and variants the draws start
    for index in range(first, first + RANDOM_CONFIGS):
        transposes = [(False, False), (False, True), (True, False), (True, True)][index % 4]
        p = GemmProblem(2048, 512, 256, *transposes, dtype="float16")
        config = pick.choice(gemm_mma.GemmMmaF16().space(p, H200).configs())
        variant = (index % 2 == 0, index % 3 == 0, index % 2 == 1)
        ptx, _ = assemble(source, kernel_options(p, config, variant), tmp_path)
        assert F16_MMA in ptx, config
