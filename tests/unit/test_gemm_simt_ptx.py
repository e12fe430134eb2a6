"""gemm_simt.cl compiles for sm_90 (an H200) without register spills, with the 128-bit local and
global accesses its design is about.

The only performance signal available without a GPU: clang compiles the OpenCL C for NVPTX (through
``nvptx_shim.cl``, as test_gemm_mma_ptx.py does) and NVIDIA's ``ptxas`` allocates registers for sm_90.
NVIDIA's OpenCL compiler is not clang, so the counts are a proxy, not the driver's numbers. The
NVIDIA default caps registers at 128 (``-cl-nv-maxrregcount=128``: two 256-thread work-groups per SM);
the test reports the uncapped count and the spills under that cap. Skipped unless ``clang`` (15+) and
``ptxas`` are on the PATH.
"""

from __future__ import annotations

import random
import re
import subprocess
from importlib import resources
from pathlib import Path

import pytest
from test_gemm_mma_ptx import CLANG, H200, PTXAS, assemble

from tunecl.kernels.gemm import gemm_simt
from tunecl.kernels.base import build_options
from tunecl.problems import GemmProblem

pytestmark = pytest.mark.skipif(not (CLANG and PTXAS), reason="needs clang with NVPTX and ptxas")
SOURCE = Path(str(resources.files("tunecl.kernels.gemm").joinpath("gemm_simt.cl")))
SIMT = gemm_simt.GemmSimt()
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


def kernel_options(problem: GemmProblem, config: dict[str, int], variant=(True, True, True)) -> list[str]:
    """The -D options GemmSimt.build passes for ``variant`` (aligned A, B, C); the register cap is a
    driver option, applied here by :func:`spills_under_cap`."""
    options = {k: v for k, v in config.items() if k != "MAXRREG"}
    options.update(VWA=config["VWA"] if variant[0] else 1, VWB=config["VWB"] if variant[1] else 1,
                   CSCALAR=int(not variant[2]))
    return build_options(options, [f"-DTRANS_A={int(problem.trans_a)}", f"-DTRANS_B={int(problem.trans_b)}"])


def spills_under_cap(tmp_path: Path, cap: int) -> tuple[int, int]:
    """(registers, spill-store bytes) of the last assembled PTX with ``-maxrregcount=cap``."""
    done = subprocess.run([PTXAS, "-arch=sm_90", "-v", f"-maxrregcount={cap}", str(tmp_path / "kernel.ptx"),
                           "-o", str(tmp_path / "capped.cubin")], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = done.stdout + done.stderr
    return (int(re.search(r"Used (\d+) registers", report).group(1)),
            int(re.search(r"(\d+) bytes spill stores", report).group(1)))


@pytest.mark.parametrize("transposes", TRANSPOSES, ids=["nn", "nt", "tn", "tt"])
def test_the_default_assembles_without_spills(transposes, tmp_path):
    p = GemmProblem(4096, 4096, 4096, *transposes)
    config = SIMT.default(p, H200)
    assert (config["MWG"], config["NWG"], config["KWG"], gemm_simt.threads(config)) == (128, 128, 8, 256)
    ptx, report = assemble(SOURCE, kernel_options(p, config), tmp_path)
    # 8 k steps of an 8x8 outer product per K tile: 512 FMAs in the main loop (more in the copy that
    # the compiler may peel, none of them scalar-by-scalar from local memory)
    assert ptx.count("fma.rn.f32") >= 512
    assert "ld.shared.v4.f32" in ptx  # fragments: 128-bit local reads
    assert "ld.global.nc.v4.f32" in ptx or "ld.global.v4.f32" in ptx  # float4 tile loads
    assert ptx.count("bar.sync") == 2  # the prologue's and one per K tile (double-buffered)
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert " 0 bytes spill stores" in report, report
    capped, spilled = spills_under_cap(tmp_path, config["MAXRREG"])
    print(f"{transposes}: {registers} registers uncapped; at -maxrregcount={config['MAXRREG']}: "
          f"{capped} registers, {spilled} bytes of spill stores")
    assert spilled <= 16, f"{spilled} bytes spilled at the default's register cap"


def test_random_configs_and_scalar_variants_assemble(tmp_path):
    pick = random.Random(17)
    for index in range(6):
        transposes = TRANSPOSES[index % 4]
        p = GemmProblem(2048, 512, 256, *transposes)
        config = pick.choice(SIMT.space(p, H200).configs())
        variant = (index % 2 == 0, index % 3 == 0, index % 2 == 1)
        ptx, _ = assemble(SOURCE, kernel_options(p, config, variant), tmp_path)
        assert "fma.rn.f32" in ptx and "bar.sync" in ptx, config
