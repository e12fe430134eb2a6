"""The PTX of conv_implicit_gemm_mma.cl (conv_implicit_gemm_mma_tf32 and, with MMA_F16,
conv_implicit_gemm_mma_f16) assembles for sm_90 (an H200), in all three directions, where the tools exist.

The same mechanism as test_gemm_mma_ptx.py (clang compiles the OpenCL C for NVPTX through
``nvptx_shim.cl``, NVIDIA's ``ptxas`` assembles it for sm_90, checking the inline PTX and reporting
registers and spills); a check of the PTX, not of the driver's code. Skipped unless ``clang`` (15+) and
``ptxas`` are on the PATH.
"""

from __future__ import annotations

import random
import re
from importlib import resources
from pathlib import Path

import pytest
from test_gemm_mma_ptx import CLANG, H200, PTXAS, assemble

from tunecl.kernels.conv import conv_implicit_gemm_mma as conv_mma
from tunecl.kernels.base import build_options
from tunecl.kernels.conv.conv_common import geometry_options
from tunecl.problems import DIRECTIONS, ConvProblem

pytestmark = pytest.mark.skipif(not (CLANG and PTXAS), reason="needs clang with NVPTX and ptxas")

SOURCE = Path(str(resources.files("tunecl.kernels.conv").joinpath("conv_implicit_gemm_mma.cl")))
TF32_MMA = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
F16_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
RESNET_3X3 = "n=16,c=64,h=56,w=56,k=64,r=3,s=3,pad=1"


def kernel_options(problem: ConvProblem, config: dict[str, int]) -> list[str]:
    """The -D options ConvImplicitGemmMma{TF32,F16}.build passes (without MMA_STUB)."""
    extra = ["-DMMA_F16=1"] if problem.dtype == "float16" else []
    return build_options(config, [*geometry_options(problem), *extra])


def algorithm_for(problem: ConvProblem):
    return next(a for a in conv_mma.ALGORITHMS if a.variant.dtype == problem.dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_the_default_assembles_without_spills(direction, dtype, tmp_path):
    p = ConvProblem.parse(f"{RESNET_3X3},dtype={dtype}").with_direction(direction)
    config = algorithm_for(p).default(p, H200)
    ptx, report = assemble(SOURCE, kernel_options(p, config), tmp_path)
    mma, other = (F16_MMA, "tf32") if dtype == "float16" else (TF32_MMA, "f16.f16")
    # MT x NT mma tiles per step, KWG / depth steps per tile
    depth = 16 if dtype == "float16" else 8
    tiles = (config["MWG"] // config["WARPS_M"] // 16) * (config["NWG"] // config["WARPS_N"] // 8)
    assert ptx.count(mma) >= tiles * config["KWG"] // depth, config
    assert other not in ptx
    if dtype == "float16" and config["SPLIT"] == 1:   # (a split writes fp32 partial sums)
        assert "cvt.rn.f16.f32" in ptx   # the output rounded to half
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    print(f"{dtype} {direction} {config}: {registers} registers; {report.strip().splitlines()[-2]}")
    assert " 0 bytes spill stores" in report, report
    assert "stack size" not in report, report   # no per-thread arrays left in local memory


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_random_configs_assemble(dtype, tmp_path):
    """Seeded configs of the H200's space in every direction (KPAIR, PAD, STAGES, SPLIT variants)."""
    pick = random.Random(f"conv_mma_ptx/{dtype}")
    for index in range(6):
        direction = DIRECTIONS[index % 3]
        p = ConvProblem.parse(f"n=2,c=40,h=12,w=12,k=72,r=3,s=3,pad=1,groups=2,dtype={dtype}").with_direction(
            direction)
        config = pick.choice(algorithm_for(p).space(p, H200).configs())
        ptx, _ = assemble(SOURCE, kernel_options(p, config), tmp_path)
        assert (F16_MMA if dtype == "float16" else TF32_MMA) in ptx, (direction, config)
