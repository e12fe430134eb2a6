"""float16 compute and ``torch.autocast("opencl", dtype=torch.float16)``.

Tolerances. The device computes float16 ops in float32 and rounds each result to half once
(round to nearest even: at most 2^-11 ≈ 4.9e-4 relative). The single-op tests compare with CPU
torch computing in float32 from the same half inputs, so the expected error is that one rounding
plus float32 summation-order noise: ``rtol=1e-3`` (about twice the rounding bound) and ``atol=1e-4``
(for results near zero, where cancellation leaves float32 noise of ~1e-6 of the summed terms and
half subnormals are coarser than the relative bound). Whole networks round at every layer, on the
CPU at other points than on the device (CPU autocast runs batch norm and relu in half arithmetic),
so they are compared by the relative norm error of each gradient (see the bounds in each test).
"""

from __future__ import annotations

import pytest
import torch
from opcheck import DEVICE
from torch import nn

import tunecl.backend
from tunecl import config
from tunecl.backend.amp import GradScaler


RTOL, ATOL = 1e-3, 1e-4
F = nn.functional


def _half(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).half()


def check_half(fn, *inputs: torch.Tensor, out_dtype: torch.dtype = torch.float16, grad: bool = True,
               rtol: float = RTOL, atol: float = ATOL) -> None:
    """``fn`` on float16 device tensors vs ``fn`` on the same values in float32 on the CPU, forward
    and (``grad``) the gradients of the inputs for a random upstream gradient."""
    with config.override(fallback="error"):
        cpu = [x.detach().clone().float().requires_grad_(grad) for x in inputs]
        dev = [x.detach().to(DEVICE).requires_grad_(grad) for x in inputs]
        expected, actual = fn(*cpu), fn(*dev)
        assert actual.dtype == out_dtype and actual.device.type == "opencl"
        torch.testing.assert_close(actual.cpu().float(), expected.detach(), rtol=rtol, atol=atol)
        if grad:
            # representable in half: the device's backward rounds the gradient of a half result
            upstream = torch.randn(expected.shape).half().float()
            (expected * upstream).sum().backward()
            (actual.float() * upstream.to(DEVICE)).sum().backward()
            for i, (c, d) in enumerate(zip(cpu, dev)):
                if c.grad is not None:
                    assert d.grad.dtype == d.dtype, f"grad of input {i}"
                    torch.testing.assert_close(d.grad.cpu().float(), c.grad, rtol=rtol, atol=atol * 10,
                                               msg=f"grad of input {i}")


# -- single ops in float16 ------------------------------------------------------------------------------
@pytest.mark.parametrize("stride,padding,groups", [(1, 1, 1), (2, 0, 1), (1, 1, 4)])
def test_conv2d_half(stride, padding, groups):
    check_half(lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding, groups=groups),
               _half(2, 8, 9, 9), _half(8, 8 // groups, 3, 3) * 0.3, _half(8))


def test_matmul_half():
    check_half(lambda a, b: a @ b, _half(7, 33), _half(33, 5))
    check_half(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), _half(7, 5), _half(7, 33), _half(33, 5))
    check_half(lambda x, w, b: F.linear(x, w, b), _half(4, 16), _half(10, 16), _half(10))


def test_pooling_half():
    check_half(lambda x: F.max_pool2d(x, 3, 2, 1), _half(2, 3, 9, 9))
    check_half(lambda x: F.adaptive_avg_pool2d(x, 1), _half(2, 3, 5, 5))
    check_half(lambda x: F.avg_pool2d(x, 2), _half(2, 3, 6, 6))


def test_softmax_half():
    check_half(lambda x: torch.softmax(x, 1), _half(4, 10))
    check_half(lambda x: torch.log_softmax(x, 1), _half(4, 10))
    # autocast's log_softmax(dtype=float32) of half input: one _log_softmax with half_to_float
    check_half(lambda x: torch.log_softmax(x, 1, dtype=torch.float32), _half(4, 10), out_dtype=torch.float32)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_half_input_float32_parameters(training):
    """autocast's batch norm: half activations, float32 weight, bias and running statistics."""
    mean, var = torch.randn(3) * 0.1, torch.rand(3) + 0.5
    stats = {d: (mean.clone().to(d), var.clone().to(d)) for d in ("cpu", DEVICE)}

    def bn(x, w, b):
        rm, rv = stats[x.device.type if x.device.type == "cpu" else DEVICE]
        return F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.1)

    check_half(bn, _half(4, 3, 5, 5), torch.rand(3) + 0.5, torch.randn(3))
    for cpu_stat, dev_stat in zip(stats["cpu"], stats[DEVICE]):
        torch.testing.assert_close(dev_stat.cpu(), cpu_stat, rtol=RTOL, atol=ATOL)


def test_bfloat16_convolution_still_takes_the_counted_fallback(fresh_stats):
    x, w = torch.randn(1, 2, 5, 5, dtype=torch.bfloat16), torch.randn(3, 2, 3, 3, dtype=torch.bfloat16)
    with config.override(fallback="error"), pytest.raises(tunecl.backend.FallbackError):
        F.conv2d(x.to(DEVICE), w.to(DEVICE))
    with config.override(fallback="silent"):
        got = F.conv2d(x.to(DEVICE), w.to(DEVICE)).cpu()
    torch.testing.assert_close(got, F.conv2d(x, w))
    assert "aten::convolution_overrideable" in fresh_stats()["fallback_ops"]


# -- autocast policies ----------------------------------------------------------------------------------
def test_autocast_casts_like_cuda(strict):
    x, w = torch.randn(2, 3, 8, 8, device=DEVICE), torch.randn(4, 3, 3, 3, device=DEVICE)
    a, b = torch.randn(4, 5, device=DEVICE), torch.randn(5, 6, device=DEVICE)
    with torch.autocast("opencl", dtype=torch.float16):
        assert F.conv2d(x, w).dtype == torch.float16            # lower precision
        assert (a @ b).dtype == torch.float16
        h = (a @ b)
        assert torch.log_softmax(h, 1).dtype == torch.float32    # float32 with dtype set
        assert torch.exp(h).dtype == torch.float32               # float32
        assert torch.addcmul(a, h[:, :5], a).dtype == torch.float32  # promote to the widest
        assert (h + 1).dtype == torch.float16                    # no policy: falls through
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(torch.rand(3, device=DEVICE), torch.rand(3, device=DEVICE))
    assert F.conv2d(x, w).dtype == torch.float32                  # outside autocast: float32


# -- networks -------------------------------------------------------------------------------------------
def _rel_errors(cpu_model: nn.Module, dev_model: nn.Module) -> dict[str, float]:
    return {n: ((pd.grad.cpu() - pc.grad).norm() / pc.grad.norm().clamp_min(1e-12)).item()
            for (n, pc), pd in zip(cpu_model.named_parameters(), dev_model.parameters())}


def _autocast_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: str) -> float:
    with torch.autocast(device, dtype=torch.float16):
        out = model(x.to(device))
        loss = F.cross_entropy(out, y.to(device))
    assert out.dtype == torch.float16 and loss.dtype == torch.float32
    loss.backward()
    return loss.item()


def _small_cnn() -> nn.Module:
    torch.manual_seed(0)
    # no bias in front of a batch norm: its gradient is zero up to rounding noise
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))


def test_small_cnn_autocast_matches_cpu_autocast(strict, fresh_stats):
    """Loss within 2e-3 relative and every gradient within 1e-2 relative norm error of CPU autocast:
    a handful of half roundings (2^-11 each) per layer, compounded over 4 layers and the backward."""
    x, y = torch.randn(4, 3, 12, 12), torch.randint(0, 5, (4,))
    cpu_model, dev_model = _small_cnn(), _small_cnn().to(DEVICE)
    cpu_loss = _autocast_step(cpu_model, x, y, "cpu")
    dev_loss = _autocast_step(dev_model, x, y, "opencl")
    assert dev_loss == pytest.approx(cpu_loss, rel=2e-3)
    errors = _rel_errors(cpu_model, dev_model)
    assert max(errors.values()) < 1e-2, errors
    assert all(p.grad.dtype == torch.float32 for p in dev_model.parameters())
    assert not fresh_stats()["fallback_ops"]
    for (name, p_cpu), p_dev in zip(cpu_model.state_dict().items(), dev_model.state_dict().values()):
        if "running" in name:
            torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=2e-3, atol=2e-3, msg=name)


def test_resnet18_autocast_forward_backward_on_the_device(strict, fresh_stats):
    """resnet18, batch 2, 3x32x32, ``TUNECL_FALLBACK=error``.

    In train mode layer4's batch norms normalise 2 values per channel (1x1 maps), which turns any
    rounding difference into an O(1) output difference: CPU autocast itself differs from CPU float32
    by ~0.3 there. So the train step is checked for running entirely on the device with finite
    results and the right dtypes, and the numbers are compared in eval mode (batch norm with running
    statistics, still forward and backward) against a float32 reference.
    """
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    cpu_model = torchvision.models.resnet18(num_classes=10)
    dev_model = torchvision.models.resnet18(num_classes=10)
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model = dev_model.to(DEVICE)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([3, 7])

    trained = torchvision.models.resnet18(num_classes=10).to(DEVICE)  # its running stats change
    trained.load_state_dict(cpu_model.state_dict())
    loss = _autocast_step(trained, x, y, "opencl")
    assert torch.isfinite(torch.tensor(loss))
    assert all(torch.isfinite(p.grad.cpu()).all() and p.grad.dtype == torch.float32 for p in trained.parameters())
    assert not fresh_stats()["fallback_ops"]
    assert fresh_stats()["ops"].get("aten::convolution_backward_overrideable")

    # eval mode: device autocast must be as close to float32 as CPU autocast is. In this small random
    # network fp16 rounding alone moves some gradients by ~7% (relative norm) on either device.
    reference = torchvision.models.resnet18(num_classes=10)
    reference.load_state_dict(cpu_model.state_dict())
    for model in (reference, cpu_model, dev_model):
        model.eval()
    ref_loss = F.cross_entropy(reference(x), y)
    ref_loss.backward()
    cpu_loss = _autocast_step(cpu_model, x, y, "cpu")
    dev_loss = _autocast_step(dev_model, x, y, "opencl")
    assert dev_loss == pytest.approx(ref_loss.item(), rel=2e-3)
    assert cpu_loss == pytest.approx(ref_loss.item(), rel=2e-3)
    cpu_error = max(_rel_errors(reference, cpu_model).values())
    dev_errors = _rel_errors(reference, dev_model)
    worst = sorted(dev_errors.items(), key=lambda e: -e[1])[:5]
    assert max(dev_errors.values()) < 1.5 * cpu_error + 1e-2, (cpu_error, worst)
    assert not fresh_stats()["fallback_ops"]


# -- GradScaler -----------------------------------------------------------------------------------------
def test_amp_unscale_and_update_scale_match_cpu(strict):
    grads = [torch.randn(5, 3) * 1e3, torch.randn(7).half()]
    for poison in (None, float("inf"), float("nan")):
        if poison is not None:
            grads[1][2] = poison
        results = {}
        for device in ("cpu", DEVICE):
            gs = [g.clone().to(device) for g in grads]
            found_inf = torch.zeros((), device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(gs, found_inf, torch.tensor(2.0**-10, device=device))
            scale, tracker = torch.tensor(2.0**16, device=device), torch.tensor(1, dtype=torch.int32, device=device)
            torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2)
            results[device] = [t.cpu() for t in (*gs, found_inf, scale, tracker)]
        for c, d in zip(results["cpu"], results[DEVICE]):
            torch.testing.assert_close(d, c, equal_nan=True)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    # fused steps take the scale and found_inf themselves: grads unscaled in the kernel, a skipped step
    # decided on the device
    "sgd_momentum_fused": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
    "adam_fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_grad_scaler_steps_match_cpu(name, strict, fresh_stats):
    """Three optimizer steps with GradScaler under autocast; the second step's gradients are poisoned with
    inf, so it is skipped and the scale backs off, exactly as on the CPU."""
    x, y = torch.randn(4, 3, 12, 12), torch.randint(0, 5, (4,))
    runs = {}
    for device, scaler in (("cpu", torch.amp.GradScaler("cpu", growth_interval=2)),
                           ("opencl", GradScaler(growth_interval=2))):
        model = _small_cnn().to(device)
        opt = OPTIMIZERS[name](model.parameters())
        scales = []
        for step in range(3):
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.float16):
                loss = F.cross_entropy(model(x.to(device)), y.to(device))
            scaler.scale(loss).backward()
            if step == 1:
                next(model.parameters()).grad[0] = float("inf")
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        runs[device] = (model, scales, opt)
    (cpu_model, cpu_scales, cpu_opt), (dev_model, dev_scales, dev_opt) = runs["cpu"], runs["opencl"]
    assert dev_scales == cpu_scales == [65536.0, 32768.0, 32768.0]
    for (key, p_cpu), p_dev in zip(cpu_model.state_dict().items(), dev_model.state_dict().values()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-2, atol=2e-3, msg=key)
    for p_cpu, p_dev in zip(cpu_model.parameters(), dev_model.parameters()):
        # the gradients are unscaled (fused steps write them back so); the skipped step did not count
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=1e-2, atol=2e-3)
        if "step" in cpu_opt.state[p_cpu]:
            assert dev_opt.state[p_dev]["step"].item() == cpu_opt.state[p_cpu]["step"].item() == 2
    assert not fresh_stats()["fallback_ops"]
    if "fused" in name:
        assert any(op.startswith("aten::_fused_") for op in fresh_stats()["ops"])
