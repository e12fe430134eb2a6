"""float16 convolutions: a float16 plan per direction where an algorithm computes the float16 problem on
the device (conv_implicit_gemm_mma_f16 where the probe granted "mma_f16"), else the float32 plans on
converted operands.

PoCL has no tensor cores: the float16 route is tested with conv_implicit_gemm_mma_f16 made to apply here
and built with its plain-C stand-in of the PTX (``emulate=True``), registered where the real one is.

Reference: CPU ``conv2d`` (and its autograd) of the same half values in float64. Both routes sum in
fp32 and round once to half: within the fp32 tolerance of the reduction (8·eps32·sqrt(K) times the sum
of magnitudes, as test_half_gemm.py) plus one rounding to half.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F
from emulated_mma import emulated
from opcheck import DEVICE

import tunecl.backend
from tunecl import kernels
from tunecl.backend import plans
from tunecl.kernels.conv.conv_implicit_gemm_mma import ConvImplicitGemmMmaF16
from tunecl.problems import ConvProblem

pytestmark = pytest.mark.skipif(not plans.conv_algorithms(), reason="no convolution algorithm is registered")

F16 = "conv_implicit_gemm_mma_f16"
EmulatedF16 = emulated(ConvImplicitGemmMmaF16, ConvProblem)


@pytest.fixture
def emulated_f16(monkeypatch, fresh_plans, fresh_stats):
    real = kernels.algorithms
    replaced = lambda kind: [a for a in real(kind) if a.name != F16] + ([EmulatedF16()] if kind == "conv" else [])
    monkeypatch.setattr(kernels, "algorithms", replaced)
    return fresh_stats


# (name, input shape, weight shape, bias?, conv2d keywords)
CASES = [
    ("3x3 pad 1, odd sizes", (2, 8, 9, 11), (12, 8, 3, 3), True, {"padding": 1}),
    ("stride 2, dilation 2, groups 2", (2, 8, 13, 12), (6, 4, 3, 3), True,
     {"stride": 2, "padding": 2, "dilation": 2, "groups": 2}),
    ("1x1 stride 2, no bias", (1, 16, 7, 9), (12, 16, 1, 1), False, {"stride": 2}),
]


def _reference(x, w, b, g, kw, conv=F.conv2d):
    """(y, dx, dw, db) in float64 of the given (half) values, for the upstream gradient ``g``."""
    x, w = x.double().requires_grad_(), w.double().requires_grad_()
    b = None if b is None else b.double().requires_grad_()
    y = conv(x, w, b, **kw)
    y.backward(g.double())
    return y.detach(), x.grad, w.grad, None if b is None else b.grad


def _check(name, got, expected, scale, k):
    """Within one rounding to half of the float64 reference plus the fp32 tolerance of a K-term sum."""
    assert got.dtype == torch.float16, name
    got = got.cpu().double()
    fp32 = 8 * 2.0**-24 * (k**0.5 + 1) * scale
    tolerance = fp32 + 2.0**-11 * (expected.abs() + fp32) + 2.0**-25
    assert ((got - expected).abs() <= tolerance).all(), (name, (got - expected).abs().max())


def _run_case(x, w, b, kw, conv=F.conv2d):
    """The convolution and its three gradients on the device (upstream gradient: random half), checked
    against the float64 reference; magnitudes from the same computation on absolute values."""
    leaves = [t.to(DEVICE).requires_grad_() for t in (x, w)] + ([b.to(DEVICE).requires_grad_()] if b is not None else [])
    y = conv(leaves[0], leaves[1], leaves[2] if b is not None else None, **kw)
    g = torch.randn(y.shape).half()
    y.backward(g.to(DEVICE))
    expected = _reference(x, w, b, g, kw, conv)
    scale = _reference(x.abs(), w.abs(), None if b is None else b.abs(), g.abs(), kw, conv)
    k = max(x.shape[0] * y.shape[2] * y.shape[3], x.shape[1] * w.shape[2] * w.shape[3],
            y.shape[1] * w.shape[2] * w.shape[3])
    got = [y, leaves[0].grad, leaves[1].grad, leaves[2].grad if b is not None else None]
    for name, value, ref, mag in zip(("y", "dx", "dw", "db"), got, expected, scale):
        if ref is not None:
            _check(name, value, ref, mag, k)


@pytest.mark.parametrize("name, x_shape, w_shape, bias, kw", CASES, ids=[c[0] for c in CASES])
def test_float16_convolutions_run_float16_plans_where_an_algorithm_applies(emulated_f16, strict, name, x_shape,
                                                                            w_shape, bias, kw):
    x, w = torch.randn(x_shape).half(), torch.randn(w_shape).half()
    b = torch.randn(w_shape[0]).half() if bias else None
    _run_case(x, w, b, kw)
    used = emulated_f16()["plans"]
    assert used and all(key.endswith("dtype=float16") for key in used), used
    assert {entry["algorithm"] for entry in used.values()} == {F16}
    assert {entry["precision"] for entry in used.values()} == {"fp32"}
    assert {key.split(",dir=")[1].split(",")[0] for key in used} == {"fwd", "bwd_data", "bwd_weight"}


def test_strided_half_inputs_are_made_contiguous_for_the_float16_plan(emulated_f16, strict):
    x = torch.randn(2, 8, 9, 22).half()[..., ::2]   # a strided view of its leaf
    w = torch.randn(4, 8, 3, 3).half()
    got = F.conv2d(x.to(DEVICE), w.to(DEVICE), padding=1)
    expected = F.conv2d(x.double(), w.double(), padding=1)
    _check("y", got, expected, F.conv2d(x.double().abs(), w.double().abs(), padding=1), 72)
    assert all(key.endswith("dtype=float16") for key in emulated_f16()["plans"])


def test_a_transposed_float16_convolution_runs_float16_plans_except_for_a_biased_output(emulated_f16, strict):
    kw = {"stride": 2, "padding": 1, "output_padding": 1}
    x, w, b = torch.randn(2, 6, 5, 4).half(), torch.randn(6, 4, 3, 3).half(), torch.randn(4).half()
    _run_case(x, w, None, kw, F.conv_transpose2d)
    used = emulated_f16()["plans"]
    assert used and all(key.endswith("dtype=float16") for key in used), used
    plans.clear()
    tunecl.backend.reset_stats()
    _run_case(x, w, b, kw, F.conv_transpose2d)
    used = emulated_f16()["plans"]
    by_dtype = {(key.split(",dir=")[1].split(",")[0], key.rsplit("=", 1)[1]) for key in used}
    # the output (bwd_data of the regular convolution) converts; both gradients run float16 plans
    assert by_dtype == {("bwd_data", "float32"), ("fwd", "float16"), ("bwd_weight", "float16")}, by_dtype


@pytest.mark.parametrize("name, x_shape, w_shape, bias, kw", CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_without_such_an_algorithm_float16_convolutions_convert(fresh_plans, fresh_stats, strict, name, x_shape,
                                                               w_shape, bias, kw):
    device = plans.state.get().device
    probe = ConvProblem(1, 8, 9, 9, 8, 3, 3, padding=1, dtype="float16")
    if any(a.applies(probe, device) for a in plans.conv_algorithms()):
        pytest.skip("this device computes float16 convolutions")
    x, w = torch.randn(x_shape).half(), torch.randn(w_shape).half()
    b = torch.randn(w_shape[0]).half() if bias else None
    _run_case(x, w, b, kw)
    used = fresh_stats()["plans"]
    assert used and all(key.endswith("dtype=float32") for key in used), used
