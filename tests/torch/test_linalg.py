"""Matrix products through the GEMM family's plans (the plan cache and its stats included)."""

from __future__ import annotations

import torch
from opcheck import Input, check_op, t

import tunecl.backend
from tunecl.backend import plans



def test_mm_with_transposed_and_offset_operands():
    check_op(torch.mm, torch.randn(7, 5), torch.randn(5, 9), atol=2e-5)
    check_op(torch.mm, t(torch.randn(5, 7)), t(torch.randn(9, 5)), atol=2e-5)
    check_op(torch.mm, Input(torch.randn(9, 5), lambda v: v[2:]), Input(torch.randn(5, 12), lambda v: v[:, 3:]),
             atol=2e-5)
    check_op(torch.mm, Input(torch.randn(6, 10), lambda v: v[:, ::2]), torch.randn(5, 3), atol=2e-5)  # gaps: copied


def test_addmm_beta_alpha_and_bias_broadcast():
    check_op(lambda b, x, w: torch.addmm(b, x, w), torch.randn(6), torch.randn(4, 5), torch.randn(5, 6), atol=2e-5)
    check_op(lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=-2.0), torch.randn(4, 6), torch.randn(4, 5),
             t(torch.randn(6, 5)), atol=3e-5)
    check_op(lambda b, x, w: torch.addmm(b, x, w, beta=0.0), torch.full((4, 6), float("nan")), torch.randn(4, 5),
             torch.randn(5, 6), atol=2e-5, grad=False)  # beta=0 ignores self, even NaN


def test_bmm_baddbmm_and_matmul():
    check_op(torch.bmm, torch.randn(3, 4, 5), torch.randn(3, 5, 2), atol=2e-5)
    check_op(torch.bmm, Input(torch.randn(3, 5, 4), lambda v: v.transpose(1, 2)), torch.randn(3, 5, 2), atol=2e-5)
    check_op(lambda s, a, b: torch.baddbmm(s, a, b, beta=2.0, alpha=0.5), torch.randn(2, 1, 3), torch.randn(2, 4, 5),
             torch.randn(2, 5, 3), atol=2e-5)
    check_op(torch.matmul, torch.randn(2, 3, 4, 5), torch.randn(5, 6), atol=2e-5)
    check_op(torch.matmul, torch.randn(5), torch.randn(5, 3), atol=2e-5)
    check_op(torch.nn.functional.linear, torch.randn(2, 3, 8), torch.randn(4, 8), torch.randn(4), atol=2e-5)


def test_empty_and_degenerate_products():
    check_op(torch.mm, torch.randn(0, 4), torch.randn(4, 3))
    check_op(torch.mm, torch.randn(3, 0), torch.randn(0, 4))  # K = 0: zeros
    check_op(lambda b, x, w: torch.addmm(b, x, w, beta=3.0), torch.randn(3, 4), torch.randn(3, 0), torch.randn(0, 4))
    check_op(torch.mm, torch.randn(1, 1), torch.randn(1, 1))


def test_plans_are_cached_per_problem_and_reported(fresh_stats, strict):
    plans.clear()
    a, b = torch.randn(8, 16, device="opencl"), torch.randn(16, 4, device="opencl")
    for _ in range(3):
        a @ b
    snapshot = fresh_stats()
    assert snapshot["plan_sources"] == {"default": 3}
    (key,) = [k for k in snapshot["plans"] if "m=8,n=4,k=16" in k]
    assert snapshot["plans"][key]["source"] == "default"
    assert snapshot["plans"][key]["algorithm"] in {a.name for a in plans.gemm_algorithms()}


def test_functional_products_allocate_their_result_and_keep_torchs_checks(fresh_stats, strict):
    """``mm``/``addmm``/``bmm``/``baddbmm`` without ``out=`` allocate their result themselves (no ``aten::empty``
    through the dispatcher), equal the ``out=`` forms bit for bit, and give torch's errors for operands that
    do not fit: those calls go through torch's structured wrapper."""
    import pytest

    from tunecl import config

    dev = "opencl"
    a, b = torch.randn(4, 5, device=dev), torch.randn(5, 6, device=dev)
    bias, bias2d = torch.randn(6, device=dev), torch.randn(1, 6, device=dev)
    ba, bb = torch.randn(3, 4, 5, device=dev), torch.randn(3, 5, 2, device=dev)
    bbias = torch.randn(4, 1, device=dev)
    cases = [
        (lambda: torch.mm(a, b), lambda out: torch.mm(a, b, out=out), (4, 6)),
        (lambda: torch.addmm(bias, a, b, beta=0.5, alpha=2), lambda out: torch.addmm(bias, a, b, beta=0.5, alpha=2,
                                                                                    out=out), (4, 6)),
        (lambda: torch.addmm(bias2d, a, b), lambda out: torch.addmm(bias2d, a, b, out=out), (4, 6)),
        (lambda: torch.bmm(ba, bb), lambda out: torch.bmm(ba, bb, out=out), (3, 4, 2)),
        (lambda: torch.baddbmm(bbias, ba, bb, alpha=-1), lambda out: torch.baddbmm(bbias, ba, bb, alpha=-1,
                                                                                   out=out), (3, 4, 2)),
    ]
    for functional, with_out, shape in cases:
        tunecl.backend.reset_stats()
        got = functional()
        assert "aten::empty.memory_format" not in fresh_stats()["ops"]
        want = with_out(torch.empty(shape, device=dev))
        assert got.shape == shape and got.is_contiguous()
        assert torch.equal(got.cpu(), want.cpu())
    nan_bias = torch.full((6,), float("nan"), device=dev)
    assert not torch.addmm(nan_bias, a, b, beta=0).isnan().any()   # beta=0 ignores self, even NaN
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(a, a)
    with config.override(fallback="silent"), pytest.raises(RuntimeError, match="same dtype"):
        torch.mm(a, b.half())   # (the wrapper checks no dtypes: the CPU's kernel does, through the fallback)
    with pytest.raises(RuntimeError, match="batch1 and batch2 must have same number of batches|Expected size"):
        torch.bmm(ba, bb[:2])
    for out in (None, torch.empty(4, 6, device=dev)):   # a bias that does not broadcast, the other operand on the CPU
        with pytest.raises(RuntimeError, match="expanded size"):
            torch.addmm(torch.randn(5, device=dev), a, b, out=out)
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            torch.mm(a, b.cpu(), out=out)
    half = torch.mm(a.half(), b.half())
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float().cpu(), (a.half().float() @ b.half().float()).cpu(), atol=2e-2, rtol=2e-2)


def test_functional_gelu_and_its_backward(strict):
    """``gelu``/``gelu_backward`` without ``out=``: the result allocated like the input; the results as the
    CPU's; other layouts and dtypes through torch's wrapper."""
    import pytest
    import torch.nn.functional as F

    x = torch.randn(7, 9)
    for approximate in ("none", "tanh"):
        for view in (lambda v: v, lambda v: v.t()):
            dev = view(x.to("opencl").requires_grad_())
            cpu = view(x.clone().requires_grad_())
            dev.retain_grad()
            cpu.retain_grad()
            got, want = F.gelu(dev, approximate=approximate), F.gelu(cpu, approximate=approximate)
            torch.testing.assert_close(got.detach().cpu(), want.detach())
            assert got.stride() == want.stride()
            grad = torch.randn(got.shape)
            got.backward(grad.to("opencl"))
            want.backward(grad)
            torch.testing.assert_close(dev.grad.cpu(), cpu.grad)
    for bad in (lambda v: F.gelu(v, approximate="fast"),
                lambda v: torch.ops.aten.gelu_backward(v, v, approximate="fast"),
                lambda v: torch._C._nn.gelu(v, approximate="fast", out=torch.empty_like(v))):
        with pytest.raises(RuntimeError, match="approximate argument must be either none or tanh"):
            bad(x.to("opencl"))
