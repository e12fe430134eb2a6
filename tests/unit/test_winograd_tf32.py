"""The TF32 error bound of Winograd convolution (``harness_conv.winograd_spread``), in numpy.

The harness's float64 Winograd model is checked against torch's convolution, its matrices against the
kernels' ``.cl`` constants, and the bound against a simulation: U and V rounded to TF32 as the tensor cores
read them, every output's error within ``tf32_tolerance(winograd_spread)``, where the direct convolution's
spread would be exceeded by F(4×4).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tunecl.kernels.conv.conv_winograd import MATRICES
from tunecl.problems import ConvProblem
from tunecl.search.harness import tf32_tolerance
from tunecl.search.harness_conv import operand_shapes, reference, winograd, winograd_spread, winograd_value

pytest.importorskip("torch")

SHAPES = ["n=2,c=6,h=9,w=10,k=8,r=3,s=3,pad=1", "n=1,c=8,h=7,w=5,k=4,r=3,s=3,pad=2,groups=2",
          "n=2,c=4,h=6,w=11,k=6,r=3,s=3,pad=0", "n=1,c=1,h=3,w=3,k=1,r=3,s=3,pad=1",
          "n=3,c=32,h=14,w=14,k=16,r=3,s=3,pad=1"]
CASES = [(spec, direction, m) for spec in SHAPES for direction in ("fwd", "bwd_data") for m in (2, 4)]


def _operands(spec: str, direction: str, seed: int = 0):
    p = ConvProblem.parse(spec).with_direction(direction)
    rng = np.random.default_rng(seed)
    a_shape, b_shape, _ = operand_shapes(p)
    return p, rng.uniform(-1, 1, a_shape), rng.uniform(-1, 1, b_shape)


def _tf32(x: np.ndarray) -> np.ndarray:
    """x rounded to TF32 as the kernels' cvt.rna (to nearest, ties away): from its float32 value."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("spec, direction, m", CASES)
def test_the_winograd_model_computes_torchs_convolution(spec, direction, m):
    p, a, b = _operands(spec, direction)
    np.testing.assert_allclose(winograd(p, a, b, m), reference(p, a, b, None), rtol=0, atol=1e-12)


def test_the_matrices_are_the_kernels():
    source = (Path(__file__).resolve().parents[2] / "tunecl/kernels/conv/conv_winograd.cl").read_text()
    for m, matrices in MATRICES.items():
        block = source.split(f"WINO_M == {m}", 1)[1].split("#e", 1)[0]
        for name, matrix in zip(("G_acm", "BT_acm", "AT_acm"), matrices, strict=True):
            body = block.split(name, 1)[1].split(";", 1)[0].split("=", 1)[1]
            numbers = [eval(x.replace("f", "")) for x in re.findall(r"-?[\d.]+f(?:\s*/\s*[\d.]+f)?", body)]
            assert numbers == pytest.approx(np.ravel(matrix).tolist(), abs=1e-7), (m, name)


@pytest.mark.parametrize("spec, direction, m", CASES)
def test_tf32_rounding_of_u_and_v_stays_within_the_winograd_bound(spec, direction, m):
    p, a, b = _operands(spec, direction, seed=1)
    exact = reference(p, a, b, None)
    error = np.abs(winograd(p, a, b, m, rounding=_tf32) - exact)
    bound = tf32_tolerance(winograd_spread(p, a, b, m))
    assert (error <= bound).all()
    # not vacuous: errors reach a good fraction of the bound's standard-deviation scale (bound / 8 / 0.82)
    assert (error / (bound / 8 / 0.82)).max() > 0.5


def test_f4_needs_it_where_the_direct_convolutions_bound_is_exceeded():
    p, a, b = _operands(SHAPES[-1], "fwd", seed=2)
    exact = reference(p, a, b, None)
    error = np.abs(winograd(p, a, b, 4, rounding=_tf32) - exact)
    direct = tf32_tolerance(np.sqrt(reference(p, a * a, b * b, None)))
    assert (error > direct).any()


@pytest.mark.parametrize("m, low, high", [(2, 1.3, 2.2), (4, 3.0, 6.0)])
def test_winograd_spreads_are_a_few_times_the_direct_ones(m, low, high):
    """The factor the module docstrings state (median over outputs, the harness's uniform inputs)."""
    for direction in ("fwd", "bwd_data"):
        p, a, b = _operands(SHAPES[-1], direction)
        ratio = winograd_spread(p, a, b, m) / np.sqrt(reference(p, a * a, b * b, None))
        assert low < np.median(ratio) < high


def _tf32_truncated(x: np.ndarray) -> np.ndarray:
    """x as the wgmma kernels' tensor cores read it: its float32 bits with the 13 low mantissa bits ignored."""
    bits = x.astype(np.float32).view(np.uint32)
    return (bits & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("m", [2, 4])
def test_tf32_truncation_of_u_and_v_stays_within_the_bound_with_the_winograd_value(m):
    """Inputs in [0, 1]: the sums grow with the channels and the truncation bias with them."""
    p = ConvProblem.parse("n=2,c=256,h=8,w=8,k=4,r=3,s=3,pad=1")
    rng = np.random.default_rng(4)
    a_shape, b_shape, _ = operand_shapes(p)
    a, b = rng.uniform(0, 1, a_shape), rng.uniform(0, 1, b_shape)
    exact = reference(p, a, b, None)
    error = np.abs(winograd(p, a, b, m, rounding=_tf32_truncated) - exact)
    spread = winograd_spread(p, a, b, m)
    assert (error <= tf32_tolerance(spread, winograd_value(p, a, b, m))).all()
    assert (error > tf32_tolerance(spread)).any()   # the bias needs its own term
