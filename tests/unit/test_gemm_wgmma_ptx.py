"""The PTX of gemm_wgmma.cl (gemm_wgmma_tf32 and gemm_wgmma_f16) and of the wgmma probe assembles for
sm_90a (an H200), where the tools exist.

As ``test_gemm_mma_ptx.py``: clang compiles the OpenCL C for NVPTX (``nvptx_shim.cl``); its PTX header
names an older target, which is rewritten to ``.version 8.0`` / ``.target sm_90a`` (wgmma exists only
there) before NVIDIA's ``ptxas -arch=sm_90a`` assembles it. Sources are compiled as the runtime builds
them (``runtime.ARCH_PTX_OPTION``: the sm_90a instructions hidden in PTX comments), and the PTX goes
through ``runtime.retarget_ptx``, which must restore every one of them. That checks the inline PTX (wgmma shapes,
operand counts, descriptor and predicate operands, transpose immediates, fences) and shows registers
and spills; it is not NVIDIA's OpenCL compiler, so the GPU run remains the real test.
Skipped unless ``clang`` (15+) and ``ptxas`` (CUDA 12+) are on the PATH.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import types
from importlib import resources
from pathlib import Path

import pytest

from tunecl import runtime
from tunecl.kernels.gemm import gemm_wgmma
from tunecl.kernels.base import build_options
from tunecl.problems import GemmProblem

HERE = Path(__file__).resolve().parent
CLANG = next((shutil.which(n) for n in ("clang-15", "clang-16", "clang-17", "clang-18", "clang") if shutil.which(n)), None)
PTXAS = shutil.which("ptxas")
pytestmark = pytest.mark.skipif(not (CLANG and PTXAS), reason="needs clang with NVPTX and ptxas")

H200 = types.SimpleNamespace(
    local_mem_size=48 * 1024,
    max_work_group_size=1024,
    capabilities={"mma_tf32", "cp_async", "mma_f16", "wgmma"},
    fingerprint=types.SimpleNamespace(vendor="NVIDIA", device_type="gpu", compute_units=132),
)
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]
SOURCE = Path(str(resources.files("tunecl.kernels.gemm").joinpath("gemm_wgmma.cl")))


def assemble(source: Path, options: list[str], tmp_path: Path) -> tuple[str, str]:
    """(PTX, ptxas -v report) of ``source`` compiled with ``options`` for sm_90a."""
    ptx = tmp_path / "kernel.ptx"
    clang = [
        CLANG, "-x", "cl", "-cl-std=CL1.2", "-target", "nvptx64-nvidia-nvcl",
        "-Xclang", "-finclude-default-header", "-Xclang", "-target-cpu", "-Xclang", "sm_80",
        "-Xclang", "-target-feature", "-Xclang", "+ptx75", "-O3", "-mllvm", "-inline-threshold=100000",
        "-S", "-o", str(ptx), f'-DSOURCE="{source}"', *options, str(HERE / "nvptx_shim.cl"),
    ]
    done = subprocess.run(clang, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    text = ptx.read_text()
    if runtime.ARCH_PTX_OPTION in options:  # the route NVIDIA's OpenCL compiler takes: wgmma hidden, restored
        assert not re.search(r"^\s*wgmma\.", text, flags=re.MULTILINE), "an sm_90a instruction not hidden"
        text = runtime.retarget_ptx(text)
    text = re.sub(r"^\.version .*$", ".version 8.0", text, count=1, flags=re.MULTILINE)
    text = re.sub(r"^\.target .*$", ".target sm_90a", text, count=1, flags=re.MULTILINE)
    ptx.write_text(text)
    report = subprocess.run(
        [PTXAS, "-arch=sm_90a", "-v", str(ptx), "-o", str(tmp_path / "kernel.cubin")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    return text, report.stdout + report.stderr


def kernel_options(problem: GemmProblem, config: dict[str, int], variant=(True, True, True)) -> list[str]:
    """The -D options GemmWgmmaTF32.build passes for ``variant`` (aligned A, B, C): with PRETRANS, those
    of the K-major kernel it runs behind the transposes."""
    problem = gemm_wgmma.kernel_problem(problem, config)
    options = {k: v for k, v in config.items() if k not in ("VW", "PRETRANS")}
    options.update(VWA=config["VW"] if variant[0] else 1, VWB=config["VW"] if variant[1] else 1,
                   CSCALAR=int(not variant[2]))
    layout = [f"-DTRANS_A={int(problem.trans_a)}", f"-DTRANS_B={int(problem.trans_b)}", runtime.ARCH_PTX_OPTION]
    if problem.dtype == "float16":
        layout.append("-DWGMMA_F16=1")
    return build_options(options, layout)


def instruction(problem: GemmProblem, nwg: int) -> str:
    if problem.dtype == "float16":
        return f"wgmma.mma_async.sync.aligned.m64n{nwg}k16.f32.f16.f16"
    return f"wgmma.mma_async.sync.aligned.m64n{nwg}k8.f32.tf32.tf32"


def test_the_probe_assembles(tmp_path):
    source = Path(str(resources.files("tunecl.runtime").joinpath("capabilities.cl")))
    ptx, report = assemble(source, ["-DPROBE_WGMMA", runtime.ARCH_PTX_OPTION], tmp_path)
    # 4 wgmma (128 bytes of k) per layout, the loop unrolled so that the accumulators stay in registers
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32") == 4
    flags = re.findall(r"m64n64k16\.f32\.f16\.f16 \{[^}]*\}, %rd\d+, %rd\d+, p, 1, 1, (\d), (\d);", ptx)
    assert sorted(set(flags)) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")] and len(flags) == 16
    assert "wgmma.fence.sync.aligned" in ptx and "wgmma.wait_group.sync.aligned 0" in ptx
    assert "fence.proxy.async.shared::cta" in ptx and ".align 1024" in ptx
    assert " 0 bytes stack frame" in report, report  # accumulators in registers, not local memory


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=["nn", "nt", "tn", "tt"])
def test_the_default_assembles_without_spills(dtype, transposes, tmp_path):
    p = GemmProblem(4096, 4096, 4096, *transposes, dtype=dtype)
    alg = gemm_wgmma.GemmWgmmaF16() if dtype == "float16" else gemm_wgmma.GemmWgmmaTF32()
    config = alg.default(p, H200)
    ptx, report = assemble(SOURCE, kernel_options(p, config), tmp_path)
    steps = config["KWG"] // (16 if dtype == "float16" else 8)
    assert ptx.count(instruction(p, config["NWG"])) >= steps  # the K step's wgmma, at least once
    if dtype == "float16":  # the transpose immediates: A MN-major with TRANS_A, B without TRANS_B
        a_mn, b_mn = int(transposes[0]), int(not transposes[1])
        assert f"p, 1, 1, {a_mn}, {b_mn};" in ptx
    else:
        assert "p, 1, 1;" in ptx and "cvt.rna.tf32" not in ptx
    assert "cp.async" in ptx and "wgmma.commit_group.sync.aligned" in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    print(f"{dtype} {transposes}: {registers} registers; {report.strip().splitlines()[-2]}")
    assert " 0 bytes spill stores" in report and " 0 bytes stack frame" in report, report
    assert "wgmma" not in report.lower() or "serializ" not in report.lower(), report  # no C7510 warning


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_random_configs_and_scalar_variants_assemble(dtype, tmp_path):
    """Seeded configs with aligned and scalar (VWA/VWB = 1, CSCALAR) variants assemble."""
    alg = gemm_wgmma.GemmWgmmaF16() if dtype == "float16" else gemm_wgmma.GemmWgmmaTF32()
    pick = random.Random(17 if dtype == "float16" else 19)
    for index in range(8):
        transposes = TRANSPOSES[index % 4]
        p = GemmProblem(2048, 512, 256, *transposes, dtype=dtype)
        config = pick.choice(alg.space(p, H200).configs())
        variant = (index % 2 == 0, index % 3 == 0, index % 2 == 1)
        ptx, report = assemble(SOURCE, kernel_options(p, config, variant), tmp_path)
        assert instruction(p, config["NWG"]) in ptx, config
        # (spills are allowed here: a 128-accumulator tile with scalar copies, VW = 1, may spill)
        print(config, variant, report.strip().splitlines()[-3].strip())


def test_the_largest_wgmma_assembles(tmp_path):
    """m64n256: 128 accumulator operands in one inline asm (two warpgroups of 64 x 256)."""
    p = GemmProblem(4096, 4096, 4096, False, True)
    config = {"MWG": 128, "NWG": 256, "KWG": 16, "WARPGROUPS": 2, "STAGES": 2, "SWIZZLE": 64, "VW": 4, "GM": 8}
    assert gemm_wgmma.GemmWgmmaTF32().space(p, H200).is_valid(config)
    ptx, report = assemble(SOURCE, kernel_options(p, config), tmp_path)
    assert instruction(p, 256) in ptx
    print(report.strip().splitlines()[-2])
    assert " 0 bytes spill stores" in report, report
