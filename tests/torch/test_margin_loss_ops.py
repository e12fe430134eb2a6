"""``F.multi_margin_loss`` / ``nn.MultiMarginLoss`` on the device against CPU torch, forward and backward: p 1 and
2, margins, class weights, every reduction, a single sample (1-d input), ties at the margin, an empty batch, and
torch's errors (an out-of-range target at the next read from the device)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("options", [{}, {"p": 2}, {"margin": 0.5}, {"p": 2, "margin": 2.0}])
def test_multi_margin_loss(strict, reduction, options):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64, generator=generator).float()
    target = torch.randint(0, 5, (6,), generator=generator)
    weight = torch.rand(5, generator=generator)
    check_op(lambda x, y: F.multi_margin_loss(x, y, reduction=reduction, **options), Input(x), Input(target))
    check_op(lambda x, y, w: F.multi_margin_loss(x, y, weight=w, reduction=reduction, **options), Input(x),
             Input(target), Input(weight, grad=False))
    check_op(lambda x, y: F.multi_margin_loss(x, y, reduction=reduction, **options), Input(x[0]), Input(target[0]))


def test_ties_at_the_margin_modules_and_an_empty_batch(strict):
    x = torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.5, -0.5]])   # hinges of exactly 0: no gradient there
    check_op(lambda x, y: F.multi_margin_loss(x, y), Input(x), Input(torch.tensor([0, 2])))
    check_op(lambda x, y: torch.nn.MultiMarginLoss(p=2)(x, y), Input(torch.randn(3, 4)), Input(torch.tensor([3, 0, 1])))
    check_op(lambda x, y: F.multi_margin_loss(x, y, reduction="none"), Input(torch.empty(0, 3)),
             Input(torch.empty(0, dtype=torch.long)))


@pytest.mark.parametrize("call, error, message", [
    (lambda d: F.multi_margin_loss(torch.randn(2, 3, device=d), torch.tensor([0, 1], device=d), p=3), ValueError,
     "only p == 1 and p == 2"),   # (F.multi_margin_loss checks p before the op)
    (lambda d: F.multi_margin_loss(torch.randn(2, 3, device=d), torch.tensor([0, 1, 2], device=d)), RuntimeError,
     "target tensor should be 1-D|inconsistent target size"),   # (torch 2.14's message | earlier torch's)
    (lambda d: F.multi_margin_loss(torch.randn(2, 3, device=d), torch.tensor([0, 1], device=d),
                                   weight=torch.rand(4, device=d)), RuntimeError, "inconsistent weight size"),
    (lambda d: F.multi_margin_loss(torch.randn(2, 3, device=d), torch.tensor([0, 5], device=d)).item(),
     (RuntimeError, IndexError), "out of range|out of bounds"),
])
def test_bad_calls_raise_torch_errors(strict, call, error, message):
    for device in ("cpu", "opencl"):
        with pytest.raises(error, match=message):
            call(device)
