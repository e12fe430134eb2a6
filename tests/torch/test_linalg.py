"""Matrix products through the GEMM family's plans (the plan cache and its stats included)."""

from __future__ import annotations

import torch
from opcheck import Input, check_op, t

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
