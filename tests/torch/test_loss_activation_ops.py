"""Losses and activations that ran on the CPU fallback: smooth L1, Huber, binary cross-entropy (with and
without logits, weights, pos_weight), KL divergence (through ``xlogy``), ``logsigmoid``, ``mish``, ``glu``,
``prelu`` and ``rrelu``, forward and backward against CPU torch, every reduction, odd shapes, and torch's errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opcheck import Input, check_op

REDUCTIONS = ["none", "mean", "sum"]


def _x(*shape: int, scale: float = 1.0) -> Input:
    return Input(torch.randn(shape, dtype=torch.float64).float() * scale)


def _t(*shape: int) -> Input:
    return Input(torch.rand(shape), grad=False)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(4, 6), (3,), (2, 3, 5), ()])
def test_regression_losses(strict, reduction, shape):
    x, t = _x(*shape, scale=2.0), _t(*shape)
    check_op(lambda x, t: F.smooth_l1_loss(x, t, reduction=reduction), x, t)
    check_op(lambda x, t: F.smooth_l1_loss(x, t, reduction=reduction, beta=0.25), x, t)
    check_op(lambda x, t: F.huber_loss(x, t, reduction=reduction), x, t)
    check_op(lambda x, t: F.huber_loss(x, t, reduction=reduction, delta=0.3), x, t)


def test_regression_losses_at_their_kinks_and_with_a_broadcast_target(strict):
    """x - target exactly at +-beta and +-delta, and 0 (beta = 0: L1 through the aten op itself)."""
    x = Input(torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0]))
    t = Input(torch.zeros(6), grad=False)
    check_op(lambda x, t: torch.ops.aten.smooth_l1_loss(x, t, 0, 0.5), x, t)
    check_op(lambda x, t: torch.ops.aten.smooth_l1_loss(x, t, 1, 0.0), x, t)
    check_op(lambda x, t: torch.ops.aten.huber_loss(x, t, 2, 1.0), x, t)
    check_op(lambda x, t: F.smooth_l1_loss(x.view(2, 3), t[:3].expand(2, 3)), x, t)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(strict, reduction):
    logits, target = _x(5, 7, scale=3.0), _t(5, 7)
    weight = Input(torch.rand(7), grad=False)
    check_op(lambda x, t: F.binary_cross_entropy(torch.sigmoid(x), t, reduction=reduction), logits, target)
    check_op(lambda x, t, w: F.binary_cross_entropy(torch.sigmoid(x), t, weight=w, reduction=reduction),
             logits, target, weight)
    check_op(lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction), logits, target)
    check_op(lambda x, t, w: F.binary_cross_entropy_with_logits(x, t, weight=w, reduction=reduction),
             logits, target, weight)
    check_op(lambda x, t, w: F.binary_cross_entropy_with_logits(x, t, pos_weight=w * 3, reduction=reduction),
             logits, target, weight)


def test_binary_cross_entropy_clamps_its_logs_and_refuses_input_outside_0_1(strict):
    """Inputs of exactly 0 and 1 give torch's clamped -100 logs; outside [0, 1] is torch's error."""
    p = Input(torch.tensor([0.0, 1.0, 0.5, 1e-30, 1.0 - 1e-7]), grad=False)
    t = Input(torch.tensor([1.0, 0.0, 0.3, 1.0, 0.0]), grad=False)
    check_op(lambda p, t: F.binary_cross_entropy(p, t, reduction="none"), p, t, grad=False)
    for bad in (torch.tensor([0.5, 1.5]), torch.tensor([-0.1, 0.5])):
        with pytest.raises(RuntimeError, match="between 0 and 1"):
            F.binary_cross_entropy(bad, torch.ones(2))
        with pytest.raises(RuntimeError, match="between 0 and 1"):
            F.binary_cross_entropy(bad.to("opencl"), torch.ones(2, device="opencl"))


def test_kl_divergence_with_and_without_log_targets(strict):
    x, t = _x(4, 5), Input(torch.rand(4, 5).softmax(-1), grad=False)
    for reduction in ("batchmean", "sum", "none"):
        check_op(lambda x, t: F.kl_div(x.log_softmax(-1), t, reduction=reduction), x, t)
        check_op(lambda x, t: F.kl_div(x.log_softmax(-1), t.log(), reduction=reduction, log_target=True), x, t)
    zero = Input(torch.tensor([0.0, 0.5, 0.0, 2.0]), grad=False)
    y = Input(torch.tensor([0.0, 0.25, float("nan"), 3.0]), grad=False)
    check_op(lambda a, b: torch.xlogy(a, b), zero, y, grad=False)   # 0 * log(0) = 0, NaN stays NaN
    check_op(lambda a: torch.xlogy(2.0, a), _t(3, 2), grad=False)
    check_op(lambda a: torch.xlogy(a, 3.0), _t(3, 2), grad=False)


@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 4, 5), (7,), ()])
def test_logsigmoid_and_mish(strict, shape):
    x = _x(*shape, scale=6.0)
    check_op(F.logsigmoid, x)
    check_op(F.mish, x, grad_atol=2e-5)
    check_op(lambda x: F.logsigmoid(x.t() if x.dim() == 2 else x), x)


def test_logsigmoid_and_mish_at_extremes(strict):
    x = Input(torch.tensor([-100.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 100.0]))
    check_op(F.logsigmoid, x)
    check_op(F.mish, x)


@pytest.mark.parametrize("shape, dim", [((4, 6), -1), ((4, 6), 0), ((2, 6, 3), 1), ((2, 3, 4, 8), 3), ((2,), 0)])
def test_glu(strict, shape, dim):
    check_op(lambda x: F.glu(x, dim), _x(*shape, scale=2.0))
    check_op(lambda x: F.glu(x.transpose(0, -1), dim), _x(*shape, scale=2.0))


def test_glu_refuses_an_odd_dim_and_a_scalar(strict):
    for make, message in ((lambda d: torch.randn(3, 5, device=d), "must be even"),
                          (lambda d: torch.tensor(1.0, device=d), "scalars")):
        with pytest.raises(RuntimeError, match=message):
            F.glu(make("cpu"))
        with pytest.raises(RuntimeError, match=message):
            F.glu(make("opencl"))


@pytest.mark.parametrize("shape, channels", [((4, 6), 6), ((4, 6), 1), ((2, 3, 5, 5), 3), ((2, 3, 5, 5), 1),
                                             ((5,), 1), ((), 1)])
def test_prelu_and_its_weight_gradient(strict, shape, channels):
    weight = Input(torch.rand(channels) * 0.5)
    check_op(F.prelu, _x(*shape), weight)
    module = torch.nn.PReLU(channels)
    x = torch.randn(shape)
    device = torch.nn.PReLU(channels).to("opencl")
    device.load_state_dict(module.state_dict())
    module(x).sum().backward()
    device(x.to("opencl")).sum().backward()
    torch.testing.assert_close(device.weight.grad.cpu(), module.weight.grad, atol=1e-5, rtol=1e-5)


def test_logit_with_and_without_eps(strict):
    """logit (binary cross-entropy's gradient with respect to its target), its clamp and its backward at and
    outside [0, 1]."""
    x = Input(torch.tensor([-0.5, 0.0, 0.05, 0.3, 0.95, 1.0, 1.5]))
    check_op(torch.logit, x, grad=False)
    check_op(lambda x: torch.logit(x, 0.1), x, grad=False)
    check_op(lambda x: torch.logit(x, 0.6), x, grad=False)   # bounds reversed
    g = Input(torch.ones(7), grad=False)
    check_op(lambda g, x: torch.ops.aten.logit_backward(g, x), g, x, grad=False)
    check_op(lambda g, x: torch.ops.aten.logit_backward(g, x, 0.1), g, x, grad=False)
    check_op(lambda x: torch.logit(x, 1e-3), _t(4, 5))
    inplace = torch.tensor([0.2, 0.7], device="opencl")
    assert inplace.logit_() is not None and torch.allclose(inplace.cpu(), torch.tensor([0.2, 0.7]).logit())
    p, t = Input(torch.rand(3, 4).clamp(0.05, 0.95)), Input(torch.rand(3, 4))
    check_op(lambda p, t: F.binary_cross_entropy(p, t), p, t)   # the target's gradient too


@pytest.mark.parametrize("shape", [(4, 6), (7,), (), (0, 3)])
def test_rrelu_in_evaluation_is_leaky_relu_with_the_mean_slope(strict, shape):
    x = _x(*shape)
    check_op(lambda x: F.rrelu(x, 0.1, 0.3, training=False), x)
    check_op(lambda x: F.rrelu(x, training=False), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_rrelu_in_training_draws_the_cpu_slopes(strict, dtype, layout):
    """Under one seed, each non-positive element (exactly 0 and -0 included; NaN is not) gets the slope CPU
    torch draws for it: output, ``noise`` (1 elsewhere), the gradient (the noise), the in-place form and
    ``nn.RReLU``, for a contiguous and a transposed input. CPU torch has no float16 kernel: float16 is compared
    with its float32 results (its opmath type) rounded to float16."""
    lower, upper = 0.1, 0.3
    host = torch.randn(33, 64, dtype=torch.float64).to(dtype)
    host[0, :3] = torch.tensor([0.0, float("nan"), -0.0])
    if layout == "transposed":
        host = host.t()

    def rrelu(device):
        dtype = torch.float32 if device == "cpu" else host.dtype
        x = host.to(device, dtype, copy=True).requires_grad_()
        torch.manual_seed(5)
        y = F.rrelu(x, lower, upper, training=True)
        y.backward(torch.ones_like(y))
        noise = torch.empty(host.shape, dtype=dtype, device=device)
        inplace = host.to(device, dtype, copy=True)
        torch.manual_seed(6)
        assert torch.ops.aten.rrelu_with_noise_(inplace, noise, lower, upper, True) is inplace
        torch.manual_seed(7)
        module = torch.nn.RReLU(lower, upper).train()(host.to(device, dtype))
        return [t.detach().cpu().to(host.dtype) for t in (y, x.grad, inplace, noise, module)]

    for what, cpu, device in zip(("output", "gradient", "in place", "noise", "module"), rrelu("cpu"), rrelu("opencl")):
        torch.testing.assert_close(device, cpu, atol=0, rtol=0, equal_nan=True, msg=what)
    assert (rrelu("cpu")[3] < 1).sum() > 1000                     # (the slopes were drawn)


@pytest.mark.parametrize("shape", [(), (0, 3), (1,), (3, 1, 5)])
def test_rrelu_in_training_on_odd_shapes(strict, shape):
    """0-dim, empty and size-1 inputs in training: CPU torch's values under one seed, and its gradient."""
    host = torch.randn(shape)
    results = []
    for device in ("cpu", "opencl"):
        x = host.to(device, copy=True).requires_grad_()
        torch.manual_seed(11)
        y = F.rrelu(x, 0.2, 0.4, training=True)
        y.sum().backward()
        results.append((y.detach().cpu(), x.grad.cpu()))
    for cpu, device in zip(*results):
        assert device.shape == cpu.shape
        torch.testing.assert_close(device, cpu, atol=0, rtol=0)


def test_rrelu_errors_as_torch(strict):
    x, noise = torch.randn(4, device="opencl"), torch.empty(3, device="opencl")
    with pytest.raises(RuntimeError, match="noise tensor shape must match self tensor shape"):
        torch.ops.aten.rrelu_with_noise(x, noise, 0.1, 0.3, True)
    with pytest.raises(RuntimeError, match="expected scalar type Float but found Half"):
        torch.ops.aten.rrelu_with_noise(x, torch.empty(4, dtype=torch.float16, device="opencl"), 0.1, 0.3, True)
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch.ops.aten.rrelu_with_noise(x.long(), noise.long().resize_(4), 0.1, 0.3, True)
    with pytest.raises(RuntimeError, match="Lower bound should be less than or equal to the upper bound"):
        F.rrelu(x, 0.5, 0.3, training=True)
