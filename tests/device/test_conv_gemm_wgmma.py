"""conv_1x1_wgmma_tf32, conv_im2col_wgmma_tf32 and the Winograd ones: the GEMM-backed convolutions with their
products on gemm_wgmma_tf32 (Hopper's warpgroup MMA, TF32), every direction they apply to.

On a device without the "wgmma" capability (PoCL in CI) they never apply. Their plumbing is still checked
end to end there: with the capability granted to the GEMM family and its kernels built with ``emulate=True``
(``WGMMA_STUB``: plain OpenCL C that decodes the kernel's own matrix descriptors, see test_gemm_wgmma.py),
each variant's default plan, and its default with the other PRETRANS where that is valid, runs through the
tuner's harness against torch on the CPU in float64 at the TF32 tolerance (Winograd's: of its transformed
values). Where the device has the capability the real PTX runs the same checks.
"""

from __future__ import annotations

import pytest
from test_conv_gemm_mma import SHAPES, check_none_applies, check_plan, check_registered, emulate_gemm

from tunecl import kernels, runtime
from tunecl.kernels.conv import conv_gemm_wgmma
from tunecl.kernels.gemm import gemm_mma, gemm_wgmma
from tunecl.kernels.conv.conv_common import GEMM_PREFIX, gemm_space
from tunecl.precision import TF32, algorithm_precision
from tunecl.problems import DIRECTIONS, ConvProblem
from tunecl.search.harness_conv import fp32_twin

VARIANTS = {a.name: a for a in conv_gemm_wgmma.ALGORITHMS}
WINOGRAD = ("conv_winograd_wgmma_tf32", "conv_winograd_f4_wgmma_tf32")


def has_capability(device) -> bool:
    return runtime.WGMMA in device.capabilities


@pytest.fixture(scope="module")
def device():
    return runtime.select_device()


@pytest.fixture
def emulated_wgmma(monkeypatch, device):
    """gemm_wgmma_tf32 applies (capability granted) and builds its PTX-free stand-in, unless the device has
    the real thing."""
    # the tensor-core GEMMs' applies (gemm_mma.TensorCoreGemm) reads gemm_mma's capabilities
    return emulate_gemm(monkeypatch, device, gemm_mma, gemm_wgmma.GemmWgmmaTF32, runtime.WGMMA)


def test_registered_as_tf32_families_after_every_fp32_one(emulated_wgmma):
    algorithms = kernels.algorithms("conv")
    names = [a.name for a in algorithms]
    assert set(VARIANTS) == {"conv_1x1_wgmma_tf32", "conv_im2col_wgmma_tf32", *WINOGRAD}
    first_wgmma = min(names.index(name) for name in VARIANTS)
    first_tf32 = min(i for i, a in enumerate(algorithms) if algorithm_precision(a) == TF32)
    assert first_tf32 <= first_wgmma
    # so the untuned default (the first family that applies) of a float32 problem is never TF32
    for spec in SHAPES.values():
        for direction in DIRECTIONS:
            p = ConvProblem.parse(spec).with_direction(direction)
            first = next(a for a in algorithms if a.applies(p, emulated_wgmma))
            assert algorithm_precision(first) != TF32, (p.key, first.name)
    check_registered(VARIANTS, gemm_wgmma.NAME)
    assert all(fp32_twin(name) == name.removesuffix("_wgmma_tf32") for name in VARIANTS)


def test_without_the_capability_they_never_apply(device):
    if has_capability(device):
        pytest.skip("this device has the capability")
    check_none_applies(VARIANTS, device)


def test_they_apply_only_where_their_fp32_twins_do(emulated_wgmma):
    """(Not everywhere they do: gemm_wgmma_tf32 offers no config for tiny GEMMs such as the Winograd
    products of the 3x3 shapes above, 8 x 18 x 6 in 36 batches; there these variants do not apply.)"""
    for spec in SHAPES.values():
        for direction in DIRECTIONS:
            p = ConvProblem.parse(spec).with_direction(direction)
            for name, variant in VARIANTS.items():
                twin = kernels.algorithm(fp32_twin(name))
                assert twin.applies(p, emulated_wgmma) or not variant.applies(p, emulated_wgmma), (name, p.key)
    big = ConvProblem.parse(SHAPES_HERE["3x3_c64"])
    assert all(VARIANTS[name].applies(big, emulated_wgmma) for name in WINOGRAD)


# conv_1x1 takes the 1x1 shapes, conv_im2col every shape, Winograd a 3x3 stride-1 one big enough for
# gemm_wgmma_tf32 (fwd, bwd_data)
SHAPES_HERE = {**SHAPES, "3x3_c64": "n=2,c=64,h=30,w=29,k=64,r=3,s=3,pad=1"}
CASES = [(name, shape, direction) for name in sorted(VARIANTS) for shape in sorted(SHAPES_HERE)
         for direction in DIRECTIONS
         if (name == "conv_im2col_wgmma_tf32" and shape in SHAPES) or (name == "conv_1x1_wgmma_tf32" and shape.startswith("1x1"))
         or (name in WINOGRAD and shape == "3x3_c64" and direction != "bwd_weight")]


@pytest.mark.parametrize("name, shape, direction", CASES)
def test_default_plan_matches_torch_at_the_tf32_tolerance(emulated_wgmma, name, shape, direction):
    variant = VARIANTS[name]
    p = ConvProblem.parse(SHAPES_HERE[shape]).with_direction(direction)
    assert variant.applies(p, emulated_wgmma)
    config = variant.default(p, emulated_wgmma)
    # its space: the family's own parameters and gemm_wgmma_tf32's, prefixed
    sub = variant.gemm_problem(p)
    gemm_params = {GEMM_PREFIX + k for k in gemm_space(sub, emulated_wgmma, gemm_wgmma.NAME).params}
    assert gemm_params <= set(variant.space(p, emulated_wgmma).params)
    check_plan(variant, p, emulated_wgmma, config)
    # the other way of taking an MN-contiguous operand (element-wise copies or a transposed copy first)
    other = {**config, GEMM_PREFIX + "PRETRANS": 1 - config.get(GEMM_PREFIX + "PRETRANS", 0)}
    if variant.space(p, emulated_wgmma).is_valid(other):
        check_plan(variant, p, emulated_wgmma, other)
