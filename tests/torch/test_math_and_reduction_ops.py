"""Elementwise math, reductions and products that ran on the CPU fallback: trigonometric and hyperbolic
functions, log2/log10, erfc, lgamma, erfinv, digamma, polygamma, frac, fmod, hypot, copysign, logaddexp(2), nan_to_num, hard/soft shrink,
p-norms over dims (pairwise distance, triplet loss), count_nonzero, aminmax, nansum, trace, mv/addmv and
index_fill_, against CPU torch forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op, t

INF, NAN = float("inf"), float("nan")


def _x(*shape: int, scale: float = 1.0, shift: float = 0.0) -> Input:
    return Input(torch.randn(shape, dtype=torch.float64).float() * scale + shift)


@pytest.mark.parametrize("name, make", [
    ("tan", lambda: _x(4, 5)), ("atan", lambda: _x(4, 5, scale=3)), ("sinh", lambda: _x(4, 5)),
    ("cosh", lambda: _x(4, 5)), ("asinh", lambda: _x(4, 5, scale=3)), ("erfc", lambda: _x(4, 5)),
    ("asin", lambda: Input(torch.rand(4, 5) * 1.8 - 0.9)), ("acos", lambda: Input(torch.rand(4, 5) * 1.8 - 0.9)),
    ("atanh", lambda: Input(torch.rand(4, 5) * 1.8 - 0.9)), ("acosh", lambda: Input(torch.rand(4, 5) * 3 + 1.1)),
    ("log2", lambda: Input(torch.rand(4, 5) * 3 + 0.1)), ("log10", lambda: Input(torch.rand(4, 5) * 3 + 0.1)),
    ("frac", lambda: _x(4, 5, scale=4)),
])
def test_unary_math_forward_and_backward(strict, name, make):
    op = getattr(torch, name)
    check_op(op, make(), grad_atol=2e-5)
    check_op(lambda x: op(x.t()), make(), grad_atol=2e-5)   # a transposed view
    check_op(lambda x: op(x[0, 0]), make(), grad_atol=2e-5)   # 0-dim


def test_unary_math_at_special_values(strict):
    x = Input(torch.tensor([0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 1e-30]), grad=False)
    for name in ("tan", "atan", "sinh", "cosh", "asinh", "erfc", "asin", "acos", "atanh", "acosh", "log2", "log10",
                 "frac", "lgamma"):
        check_op(getattr(torch, name), x, grad=False)
    check_op(torch.lgamma, _x(4, 5, scale=3, shift=0.5), grad_atol=2e-5)   # its gradient is digamma


def test_erfinv_and_trunc_normal_init(strict):
    check_op(torch.erfinv, Input(torch.rand(6, 7, dtype=torch.float64).float() * 1.98 - 0.99), grad_atol=1e-4)
    edges = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.7, -0.7, 0.7000001, 0.99999, -0.999999, 1.5, -2.0, NAN])
    check_op(torch.erfinv, Input(edges, grad=False), grad=False, atol=1e-5, rtol=2e-6)
    check_op(torch.erfinv, Input(edges.half(), grad=False), grad=False, atol=1e-3, rtol=1e-3)
    weight = torch.empty(64, 256, device="opencl")
    torch.nn.init.trunc_normal_(weight, std=0.02, a=-0.04, b=0.04)   # (it draws through erfinv_)
    assert weight.abs().max().item() <= 0.04 and 0.012 < weight.std().item() < 0.02


def test_digamma_and_trigamma(strict):
    # where CPU torch's float kernels are accurate: compared with them, forward and backward
    generator = torch.Generator().manual_seed(0)
    positive = torch.rand(40, dtype=torch.float64, generator=generator) * 30 + 1e-3
    # negative, at least 0.05 from the poles (near them both sides differ by float32 rounding of tan(pi x)
    # in the reflection: compared with float64 below)
    negative = -(torch.randint(0, 8, (20,), generator=generator) + 0.05 + 0.9 * torch.rand(20, generator=generator))
    x = torch.cat([positive, negative.double()]).float()
    check_op(torch.digamma, Input(x[:40]), atol=2e-5, rtol=2e-6, grad_atol=1e-3)
    check_op(torch.digamma, Input(x), atol=2e-5, rtol=2e-6, grad=False)   # (CPU's float trigamma: see below)
    check_op(lambda v: torch.polygamma(1, v), Input(x[:40]), atol=2e-5, rtol=2e-6, grad=False)
    check_op(lambda v: torch.polygamma(0, v.t()), Input(x.view(6, 10)), atol=2e-5, rtol=2e-6, grad=False)
    special = Input(torch.tensor([0.0, -0.0, -1.0, -7.0, 10.0, 1e-8, 1e20, INF, -INF, NAN]), grad=False)
    check_op(torch.digamma, special, grad=False, rtol=2e-6)
    # at the negative integers, trigamma's poles, CPU torch gives a large finite number (1.3e15 in float32,
    # 6.6e32 in float64: sin(pi x) of a rounded pi x); the device reduces x exactly and gives +inf
    check_op(lambda v: torch.polygamma(1, v[[0, 1, 4, 5, 6, 7, 8, 9]]), special, grad=False, rtol=2e-6)
    poles = torch.polygamma(1, torch.tensor([-1.0, -7.0], device="opencl")).cpu()
    assert torch.equal(poles, torch.full((2,), float("inf")))


def test_digamma_and_trigamma_near_their_poles_against_float64(strict):
    # just off the negative integers, where the reflection's tan and sin lose the most: both within a few
    # float32 ulps of float64 (CPU torch's float trigamma is off by up to 20% there)
    x = torch.cat([-torch.arange(1, 30.0) + 1e-3, -torch.arange(1, 30.0) - 1e-3, torch.randn(500) * 5])
    for op in (torch.digamma, lambda v: torch.polygamma(1, v)):
        exact = op(x.double())
        actual = op(x.to("opencl")).cpu().double()
        assert ((actual - exact).abs() / exact.abs().clamp(min=1)).max() < 3e-6


def test_polygamma_of_higher_orders_runs_on_the_counted_cpu_fallback(fresh_stats):
    from tunecl import config
    x = torch.rand(5) + 0.5
    with config.override(fallback="silent"):   # (warn mode warns once per process: another test may have)
        actual = torch.polygamma(2, x.to("opencl"))
    torch.testing.assert_close(actual.cpu(), torch.polygamma(2, x))
    assert fresh_stats()["fallback_ops"] == {"aten::polygamma.out": 1}
    for device in ("cpu", "opencl"):
        with pytest.raises(RuntimeError, match="negative n"):
            torch.polygamma(-1, x.to(device))


@pytest.mark.parametrize("name", ["hypot", "copysign", "logaddexp", "logaddexp2", "fmod"])
def test_binary_math_forward_and_backward(strict, name):
    op = getattr(torch, name)
    check_op(op, _x(3, 4, scale=3), _x(3, 4, scale=2))
    check_op(op, _x(3, 4, scale=3), _x(4, scale=2))   # broadcast
    special = Input(torch.tensor([INF, -INF, INF, NAN, 0.0, -0.0, 5.0]), grad=False)
    other = Input(torch.tensor([INF, -INF, -INF, 1.0, -1.0, 2.0, -0.0]), grad=False)
    check_op(op, special, other, grad=False)


def test_fmod_by_a_number_and_logaddexp_of_equal_infinities(strict):
    check_op(lambda x: torch.fmod(x, 0.7), _x(3, 4, scale=3))
    check_op(lambda x: torch.fmod(x, -1.5), _x(3, 4, scale=3))
    check_op(lambda x: torch.logaddexp(x, x), Input(torch.tensor([INF, -INF, 1.0]), grad=False), grad=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_nan_to_num(strict, dtype):
    x = Input(torch.tensor([NAN, INF, -INF, 1.5, -2.0]).to(dtype) if dtype.is_floating_point
              else torch.arange(-2, 3), grad=False)
    check_op(torch.nan_to_num, x, grad=False)
    check_op(lambda x: torch.nan_to_num(x, 1.0, 2.0, -3.0), x, grad=False)
    check_op(lambda x: torch.nan_to_num(x, posinf=7.0), x, grad=False)


def test_shrinks(strict):
    x = Input(torch.tensor([-1.0, -0.5, -0.2, 0.0, 0.2, 0.5, 1.0, 3.0]))
    for lambd in (0.5, 0.2, 0.0):
        check_op(lambda x: F.hardshrink(x, lambd), x)
        check_op(lambda x: F.softshrink(x, lambd), x)


def test_norms_over_dims_distances_and_triplet_losses(strict):
    a, b = _x(5, 6), _x(5, 6)
    check_op(F.pairwise_distance, a, b)
    check_op(lambda a, b: F.pairwise_distance(a, b, p=1.0, keepdim=True), a, b)
    check_op(lambda a, b: F.triplet_margin_loss(a, b, b * 2), a, b)
    for p in (1, 2, 3, 0.5):
        check_op(lambda x: torch.norm(x, p=p, dim=1), a, grad_atol=2e-5)
        check_op(lambda x: torch.norm(x.t(), p=p, dim=(0, 1), keepdim=True), a, grad_atol=2e-5)


def test_count_nonzero_aminmax_nansum_and_trace(strict):
    x = torch.randn(4, 6)
    x[0, 1] = NAN
    relu = Input(torch.randn(4, 6).relu(), grad=False)
    check_op(torch.count_nonzero, relu, grad=False)
    check_op(lambda x: torch.count_nonzero(x, dim=1), relu, grad=False)
    check_op(lambda x: torch.count_nonzero(x, dim=(0, 1)), relu, grad=False)
    plain = Input(torch.randn(4, 6), grad=False)
    for kwargs in ({}, {"keepdim": True}, {"dim": 1}, {"dim": 0, "keepdim": True}):
        check_op(lambda x: torch.aminmax(x, **kwargs), plain, grad=False)
    for device in ("cpu", "opencl"):   # (torch raises an IndexError)
        with pytest.raises(IndexError, match="non-zero size"):
            torch.aminmax(torch.empty(0, 3, device=device), dim=0)
    check_op(torch.nansum, Input(x))
    check_op(lambda x: torch.nansum(x, 1, keepdim=True), Input(x))
    check_op(torch.nansum, Input(torch.arange(6), grad=False), grad=False)
    check_op(torch.trace, _x(4, 4))
    check_op(lambda x: torch.trace(x.t()), _x(3, 5))
    check_op(torch.trace, Input(torch.arange(9).view(3, 3), grad=False), grad=False)
    with pytest.raises(RuntimeError, match="expected a matrix"):
        torch.trace(torch.ones(3, device="opencl"))


def test_mv_and_addmv(strict):
    mat, vec, bias = _x(5, 7), _x(7), _x(5)
    check_op(torch.mv, mat, vec)
    check_op(lambda m, v: torch.mv(m.t(), v), _x(7, 5), vec)
    check_op(lambda b, m, v: torch.addmv(b, m, v, beta=0.5, alpha=2.0), bias, mat, vec)
    check_op(lambda m, v: torch.addmv(torch.tensor(1.5, device=m.device), m, v), mat, vec)
    nan = Input(torch.full((5,), NAN), grad=False)
    check_op(lambda b, m, v: torch.addmv(b, m, v, beta=0), nan, mat, vec)   # beta 0 ignores self, NaN included
    with pytest.raises(RuntimeError, match="size mismatch"):
        torch.mv(torch.ones(2, 3, device="opencl"), torch.ones(2, device="opencl"))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_fill(strict, dim):
    index = torch.tensor([2, 0, 2])
    check_op(lambda x: x.clone().index_fill_(dim, index.to(x.device), -1.5), _x(3, 4))
    check_op(lambda x: x.index_fill(dim, index.to(x.device), torch.tensor(2.0, device=x.device)), _x(3, 4))
    check_op(lambda x: x.clone().index_fill_(dim, torch.tensor(1, device=x.device), 0.5), t(torch.randn(4, 3)))
    with pytest.raises(IndexError, match="int64"):
        torch.zeros(3, 4, device="opencl").index_fill_(dim, torch.tensor([1], dtype=torch.int32, device="opencl"), 1.0)


LOWEST = torch.iinfo(torch.int64).min


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_division_and_remainder_round_as_torch_does(strict, dtype):
    """Floor division and remainder take the divisor's sign, trunc division and fmod the dividend's; the lowest
    int64 divided by -1 as on the CPU."""
    a = torch.tensor([7, -7, 7, -7, 0, 5, 9, -9, 13]).to(dtype)
    b = torch.tensor([3, 3, -3, -3, 2, 1, -1, -1, 5]).to(dtype)
    if dtype == torch.int64:
        a, b = torch.cat([a, torch.tensor([LOWEST, LOWEST])]), torch.cat([b, torch.tensor([-1, 2])])
    A, B = Input(a, grad=False), Input(b, grad=False)
    for op in (lambda a, b: a % b, lambda a, b: a // b, lambda a, b: torch.fmod(a, b),
               lambda a, b: torch.div(a, b, rounding_mode="floor"),
               lambda a, b: a % 4, lambda a, b: a % -4, lambda a, b: a // -3, lambda a, b: torch.fmod(a, -3),
               lambda a, b: 17 % b, lambda a, b: a.clone().floor_divide_(b), lambda a, b: a.clone().remainder_(b)):
        check_op(op, A, B, grad=False)
    # trunc division: CPU torch's scalar kernel divides the lowest int64 by -1 with the processor's division,
    # which traps (SIGFPE) on some hosts, so that pair is checked on the device alone (it wraps to itself)
    keep = ~((a == LOWEST) & (b == -1))
    check_op(lambda a, b: torch.div(a, b, rounding_mode="trunc"), Input(a[keep], grad=False),
             Input(b[keep], grad=False), grad=False)
    if dtype == torch.int64:
        lowest = torch.tensor([LOWEST], device="opencl")
        assert torch.div(lowest, torch.tensor([-1], device="opencl"), rounding_mode="trunc").cpu().item() == LOWEST


@pytest.mark.parametrize("op", [lambda a, b: a % b, lambda a, b: a // b, lambda a, b: torch.fmod(a, b),
                                lambda a, b: torch.div(a, b, rounding_mode="trunc"), lambda a, b: a % 0,
                                lambda a, b: torch.fmod(a, 0), lambda a, b: 5 % b])
def test_integer_division_by_zero_is_torch_s_error(strict, op):
    for device in ("cpu", "opencl"):
        a, b = torch.tensor([1, 2], device=device), torch.tensor([1, 0], device=device)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            op(a, b)
    check_op(lambda a: a % 0.0, Input(torch.tensor([1.0, -2.0]), grad=False), grad=False)   # floats: NaN


def test_cross_products(strict):
    check_op(torch.linalg.cross, _x(5, 3), _x(5, 3))
    check_op(lambda a, b: torch.linalg.cross(a, b, dim=0), _x(3, 4), _x(3, 1))   # broadcast
    check_op(lambda a, b: torch.cross(a.t(), b.t(), dim=1), _x(3, 6), _x(3, 6))
    for device in ("cpu", "opencl"):
        with pytest.raises(RuntimeError, match="must have length 3"):
            torch.linalg.cross(torch.randn(2, 4, device=device), torch.randn(2, 4, device=device))


@pytest.mark.parametrize("which", ["tril_indices", "triu_indices"])
@pytest.mark.parametrize("row, col, offset", [(3, 3, 0), (4, 5, 1), (5, 3, -2), (0, 3, 0), (3, 4, 9)])
def test_triangle_indices(strict, which, row, col, offset):
    got = getattr(torch, which)(row, col, offset, device="opencl")
    assert got.device.type == "opencl" and torch.equal(got.cpu(), getattr(torch, which)(row, col, offset))
    assert getattr(torch, which)(row, col, offset, device="opencl", dtype=torch.int32).dtype == torch.int32
