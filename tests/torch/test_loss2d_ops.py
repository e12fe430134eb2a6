"""nll_loss2d (cross-entropy over (N, C, H, W) scores) on opencl vs CPU, forward and backward, every
reduction, class weights, ignore_index, odd and empty shapes and strided inputs; every call under
``TUNECL_FALLBACK=error``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op

SHAPES = [(2, 3, 4, 5), (1, 1, 1, 1), (3, 7, 2, 9), (1, 4, 33, 17), (2, 5, 1, 6)]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", SHAPES)
def test_nll_loss2d(shape, reduction):
    n, c, h, w = shape
    target = torch.randint(0, c, (n, h, w))
    check_op(lambda x, t: F.nll_loss(x.log_softmax(1), t, reduction=reduction), torch.randn(shape), target,
             atol=2e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss2d_weights_ignore_index_and_cross_entropy(reduction, strict):
    target = torch.randint(0, 4, (2, 5, 6))
    target[0, :2] = -100
    target[1, 1, 1] = 2
    weight = torch.rand(4) + 0.5
    check_op(lambda x, t, wt: F.nll_loss(x, t, wt, reduction=reduction), torch.randn(2, 4, 5, 6), target,
             Input(weight, grad=False), atol=2e-5)
    check_op(lambda x, t: F.nll_loss(x, t, reduction=reduction, ignore_index=2), torch.randn(2, 4, 5, 6),
             target.clamp(min=0), atol=2e-5)
    check_op(lambda x, t: F.cross_entropy(x, t, reduction=reduction), torch.randn(2, 4, 5, 6),
             target.clamp(min=0), atol=2e-5)
    # a channels-last input (torch's CPU backward refuses one: the gradient is checked against a copy)
    x = torch.randn(2, 5, 6, 4)
    check_op(lambda x, t: F.nll_loss(x, t, reduction=reduction),
             Input(x, lambda v: v.permute(0, 3, 1, 2), grad=False), target.clamp(min=0), atol=2e-5)
    leaf = x.to("opencl").requires_grad_()
    loss = F.nll_loss(leaf.permute(0, 3, 1, 2), target.clamp(min=0).to("opencl"), reduction=reduction)
    upstream = torch.randn(loss.shape)
    loss.backward(upstream.to("opencl"))
    reference = x.permute(0, 3, 1, 2).contiguous().requires_grad_()
    F.nll_loss(reference, target.clamp(min=0), reduction=reduction).backward(upstream)
    torch.testing.assert_close(leaf.grad.cpu(), reference.grad.permute(0, 2, 3, 1))


def test_nll_loss2d_of_an_empty_batch():
    for reduction in ("sum", "none"):
        check_op(lambda x, t: F.nll_loss(x, t, reduction=reduction), torch.randn(0, 3, 4, 5),
                 torch.zeros(0, 4, 5, dtype=torch.int64))


def test_nll_loss2d_ops_directly_and_bad_input(strict):
    x, t = torch.randn(2, 3, 4, 5).log_softmax(1), torch.randint(0, 3, (2, 4, 5))
    dx, dt = x.to("opencl"), t.to("opencl")
    out, total = torch.empty(0, device="opencl"), torch.empty(0, device="opencl")
    torch.ops.aten.nll_loss2d_forward.output(dx, dt, None, 1, -100, output=out, total_weight=total)
    expected, expected_total = torch.ops.aten.nll_loss2d_forward(x, t, None, 1, -100)
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(total.cpu(), expected_total)
    grad = torch.empty(0, device="opencl")
    torch.ops.aten.nll_loss2d_backward.grad_input(torch.tensor(1.5, device="opencl"), dx, dt, None, 1, -100, total,
                                                  grad_input=grad)
    torch.testing.assert_close(grad.cpu(), torch.ops.aten.nll_loss2d_backward(torch.tensor(1.5), x, t, None, 1, -100,
                                                                              expected_total))
    with pytest.raises(RuntimeError, match="spatial targets"):
        torch.ops.aten.nll_loss2d_forward(dx, dt[0], None, 1, -100)
    with pytest.raises(RuntimeError, match="do not match"):
        torch.ops.aten.nll_loss2d_forward(dx, dt[:, :3], None, 1, -100)
