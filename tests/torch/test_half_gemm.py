"""float16 matrix products: a float16 plan where an algorithm computes float16 GEMMs on the device
(gemm_mma_f16 where the probe granted "mma_f16"), else the float32 plan on converted operands.

PoCL has no tensor cores: the float16 route is tested with gemm_mma_f16 made to apply here and built
with its plain-C stand-in of the PTX (``emulate=True``), registered where the real one is.

Reference: the product of the same half values in float64, rounded once to half (both routes sum in
fp32 and round once): within one half ulp of it plus the fp32 accumulation error.
"""

from __future__ import annotations


import pytest
import torch
from emulated_mma import emulated
from opcheck import DEVICE

from tunecl import kernels
from tunecl.backend import plans
from tunecl.kernels.gemm.gemm_mma import GemmMmaF16
from tunecl.problems import GemmProblem


EmulatedF16 = emulated(GemmMmaF16, GemmProblem)


@pytest.fixture
def emulated_f16(monkeypatch, fresh_plans, fresh_stats):
    real = kernels.algorithms
    # (the real float16 families, where the device has them, step aside: the emulation is what is tested)
    replaced = lambda kind: [a for a in real(kind) if a.name not in ("gemm_mma_f16", "gemm_wgmma_f16")] + (
        [EmulatedF16()] if kind == "gemm" else [])
    monkeypatch.setattr(kernels, "algorithms", replaced)
    return fresh_stats


def _check(name: str, result: torch.Tensor, expected64: torch.Tensor, scale64: torch.Tensor, k: int) -> None:
    """Within one rounding to half of the float64 reference plus the fp32 tolerance of test_gemm.py
    (8·eps32·sqrt(K) times the sum of magnitudes ``scale64``)."""
    assert result.dtype == torch.float16, name
    got = result.cpu().double()
    fp32 = 8 * 2.0**-24 * k**0.5 * scale64
    tolerance = fp32 + 2.0**-11 * (expected64.abs() + fp32) + 2.0**-25
    assert ((got - expected64).abs() <= tolerance).all(), (name, (got - expected64).abs().max())


def _products(a, b, bias):
    """mm, mm of a transposed view, addmm with alpha/beta, bmm of half CPU inputs:
    (name, device result, float64 reference, float64 sum of magnitudes)."""
    da, db, dbias = a.to(DEVICE), b.to(DEVICE), bias.to(DEVICE)
    a64, b64, bias64 = a.double(), b.double(), bias.double()
    a3, b3 = a.reshape(2, a.shape[0] // 2, -1), torch.stack([b, b.flip(0)])
    at = da.t().contiguous().t()  # a transposed view: the plan reads it with trans_b
    return [
        ("mm", da @ db, a64 @ b64, a64.abs() @ b64.abs()),
        ("mm of a transposed view", db @ at, b64 @ a64, b64.abs() @ a64.abs()),
        ("addmm", torch.addmm(dbias, da, db, beta=0.5, alpha=-2.0), 0.5 * bias64 - 2.0 * (a64 @ b64),
         0.5 * bias64.abs() + 2.0 * (a64.abs() @ b64.abs())),
        ("bmm", torch.bmm(a3.to(DEVICE), b3.to(DEVICE)), a3.double() @ b3.double(),
         a3.double().abs() @ b3.double().abs()),
    ]


def test_float16_products_run_the_float16_plan_where_an_algorithm_applies(emulated_f16, strict):
    a = torch.randn(10, 12).half()
    b = torch.randn(12, 10).half()
    bias = torch.randn(10).half()
    for product in _products(a, b, bias):
        _check(*product, 12)
    used = emulated_f16()["plans"]
    assert used and all(key.endswith("dtype=float16") for key in used), used
    assert {entry["algorithm"] for entry in used.values()} == {"gemm_mma_f16"}
    assert {entry["precision"] for entry in used.values()} == {"fp32"}
    assert any(",tb=1," in key for key in used)  # the transposed view was read in place


def test_without_such_an_algorithm_float16_products_convert(fresh_plans, fresh_stats, strict):
    device = plans.state.get().device
    if any(a.applies(GemmProblem(10, 10, 12, dtype="float16"), device) for a in plans.gemm_algorithms()):
        pytest.skip("this device computes float16 GEMMs")
    a, b, bias = torch.randn(10, 12).half(), torch.randn(12, 10).half(), torch.randn(10).half()
    for product in _products(a, b, bias):
        _check(*product, 12)
    used = fresh_stats()["plans"]
    assert used and all(key.endswith("dtype=float32") for key in used), used
