"""conv_1x1_mma_tf32, conv_im2col_mma_tf32 and the Winograd ones: the GEMM-backed convolutions with their
products on gemm_mma_tf32 (tensor cores, TF32), all directions they apply to.

On a device without the "mma_tf32" capability (PoCL in CI) they never apply. Their plumbing is still checked
end to end there: with the capability granted to the GEMM family and its kernels built with ``emulate=True``
(plain OpenCL C computing the PTX's TF32 fragments, see test_conv_mma.py), each variant's default plan runs
through the tuner's harness (beta 0 on a NaN output; beta 0.5 with a bias in fwd) against torch on the CPU in
float64, at the TF32 tolerance. Where the device has the capability the real PTX runs the same checks.
"""

from __future__ import annotations

import pytest

from tunecl import kernels, runtime
from tunecl.kernels.conv import conv_gemm_mma
from tunecl.kernels.gemm import gemm_mma
from tunecl.kernels.conv.conv_common import GEMM_PREFIX, gemm_space
from tunecl.precision import TF32, algorithm_precision
from tunecl.problems import DIRECTIONS, ConvProblem
from tunecl.search.harness_conv import ConvHarness

VARIANTS = {a.name: a for a in conv_gemm_mma.ALGORITHMS}
SHAPES = {
    "1x1": "n=2,c=16,h=7,w=9,k=12,r=1,s=1",
    "1x1_s2": "n=2,c=16,h=7,w=9,k=12,r=1,s=1,stride=2",
    "1x1_groups2": "n=3,c=8,h=5,w=6,k=6,r=1,s=1,groups=2",
    "3x3_s2": "n=2,c=6,h=10,w=9,k=8,r=3,s=3,stride=2,pad=1",
    "c3_7x7_s2_b1": "n=1,c=3,h=15,w=13,k=8,r=7,s=7,stride=2,pad=3",
    "k1000": "n=1,c=8,h=3,w=3,k=1000,r=3,s=3,pad=1",
    "3x3": "n=2,c=6,h=9,w=10,k=8,r=3,s=3,pad=1",
    "3x3_pad2_groups2": "n=1,c=8,h=7,w=5,k=4,r=3,s=3,pad=2,groups=2",
}
WINOGRAD = ("conv_winograd_mma_tf32", "conv_winograd_f4_mma_tf32")


def has_capability(device) -> bool:
    return runtime.MMA_TF32 in device.capabilities


@pytest.fixture(scope="module")
def device():
    return runtime.select_device()


def emulate_gemm(monkeypatch, device, module, family, capability):
    """GEMM ``family`` applies (``capability`` granted through the ``capabilities`` of kernel ``module``,
    which its ``applies`` reads) and builds its PTX-free stand-in, unless the device has the real
    thing; returns ``device``."""
    if capability not in device.capabilities:
        real_build = family.build
        monkeypatch.setattr(module, "capabilities", lambda d: frozenset({capability}))
        monkeypatch.setattr(family, "build",
                            lambda self, problem, dev, config, emulate=False: real_build(self, problem, dev, config,
                                                                                         emulate=True))
    return device


def check_plan(variant, p, device, config) -> None:
    """``variant``'s plan of ``config`` is a TF32 one and passes the tuner's harness against torch."""
    plan = variant.build(p, device, config)
    assert (plan.algorithm, plan.precision, plan.gemm_plan.precision) == (variant.name, TF32, TF32)
    binding = ConvHarness(p, device, seed=3).bind(plan)
    try:
        message = binding.check()
    finally:
        binding.release()
    assert message is None, f"{variant.name} {p.key} {config}: {message}"


@pytest.fixture
def emulated_mma(monkeypatch, device):
    """gemm_mma_tf32 applies (capability granted) and builds its PTX-free stand-in, unless the device has
    the real thing."""
    return emulate_gemm(monkeypatch, device, gemm_mma, gemm_mma.GemmMmaTF32, runtime.MMA_TF32)


def test_registered_as_tf32_families_after_every_fp32_one():
    algorithms = kernels.algorithms("conv")
    names = [a.name for a in algorithms]
    assert set(VARIANTS) == {"conv_1x1_mma_tf32", "conv_im2col_mma_tf32", *WINOGRAD}
    first_tf32 = min(names.index(name) for name in VARIANTS)
    assert all(algorithm_precision(a) != TF32 for a in algorithms[:first_tf32])
    check_registered(VARIANTS, gemm_mma.NAME)


def check_registered(variants, gemm_name: str) -> None:
    """Each variant is the registered algorithm of its name, on ``gemm_name`` at TF32; the fp32 originals keep
    gemm_tiled and fp32."""
    for name, variant in variants.items():
        assert kernels.algorithm(name) is variant
        assert (variant.gemm_name, algorithm_precision(variant)) == (gemm_name, TF32)
    for name in ("conv_1x1", "conv_im2col", "conv_winograd", "conv_winograd_f4"):
        assert (kernels.algorithm(name).gemm_name, algorithm_precision(kernels.algorithm(name))) == ("gemm_tiled",
                                                                                                       "fp32")


def check_none_applies(variants, device) -> None:
    """No variant applies to any shape and direction here (a device without their GEMM's capability)."""
    for spec in SHAPES.values():
        for direction in DIRECTIONS:
            p = ConvProblem.parse(spec).with_direction(direction)
            assert not any(v.applies(p, device) for v in variants.values())


def test_without_the_capability_they_never_apply(device):
    if has_capability(device):
        pytest.skip("this device has the capability")
    check_none_applies(VARIANTS, device)


# conv_1x1 takes the 1x1 shapes, conv_im2col every shape, Winograd the 3x3 stride-1 ones (fwd, bwd_data)
CASES = [(name, shape, direction) for name in sorted(VARIANTS) for shape in sorted(SHAPES) for direction in DIRECTIONS
         if name == "conv_im2col_mma_tf32" or (name == "conv_1x1_mma_tf32" and shape.startswith("1x1"))
         or (name in WINOGRAD and shape in ("3x3", "3x3_pad2_groups2", "k1000") and direction != "bwd_weight")]


def test_winograd_variants_apply_where_their_fp32_twins_do(emulated_mma):
    for spec in SHAPES.values():
        for direction in DIRECTIONS:
            p = ConvProblem.parse(spec).with_direction(direction)
            for name in WINOGRAD:
                twin = kernels.algorithm(name.removesuffix("_mma_tf32"))
                assert VARIANTS[name].applies(p, emulated_mma) == twin.applies(p, emulated_mma)


@pytest.mark.parametrize("name, shape, direction", CASES)
def test_default_plan_matches_torch_at_the_tf32_tolerance(emulated_mma, name, shape, direction):
    variant, twin = VARIANTS[name], kernels.algorithm(name.removesuffix("_mma_tf32"))
    p = ConvProblem.parse(SHAPES[shape]).with_direction(direction)
    assert variant.applies(p, emulated_mma) and twin.applies(p, emulated_mma)
    config = variant.default(p, emulated_mma)
    # its space: the family's own parameters and gemm_mma_tf32's, prefixed
    sub = variant.gemm_problem(p)
    gemm_params = {GEMM_PREFIX + k for k in gemm_space(sub, emulated_mma, gemm_mma.NAME).params}
    assert gemm_params <= set(variant.space(p, emulated_mma).params)
    check_plan(variant, p, emulated_mma, config)
