"""Small training runs on opencl match the same runs on the CPU, with no op on the CPU fallback."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tunecl.backend import plans

pytestmark = pytest.mark.skipif(not plans.gemm_algorithms(), reason="no GEMM algorithm is registered")

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_fused": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3,
                                                    fused=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adamw_fused_amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, amsgrad=True, fused=True),
    "adam_foreach_false": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 32), nn.GELU(),
                         nn.BatchNorm1d(32), nn.Linear(32, 4))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mlp_training_matches_cpu(name, strict, fresh_stats):
    x, y = torch.randn(16, 10), torch.randint(0, 4, (16,))
    runs = {}
    for device in ("cpu", "opencl"):
        model = _mlp().to(device)
        opt = OPTIMIZERS[name](model.parameters())
        xd, yd = x.to(device), y.to(device)
        torch.manual_seed(1)  # same dropout masks on both devices
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xd), yd)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs[device] = (model, losses)
    (cpu_model, cpu_losses), (dev_model, dev_losses) = runs["cpu"], runs["opencl"]
    assert dev_losses == pytest.approx(cpu_losses, abs=1e-5)
    for (pname, p_cpu), p_dev in zip(cpu_model.state_dict().items(), dev_model.state_dict().values()):
        torch.testing.assert_close(p_dev.cpu(), p_cpu, atol=2e-5, rtol=1e-4, msg=pname)
    ops = fresh_stats()["ops"]
    assert not fresh_stats()["fallback_ops"]
    if "fused" in name:
        assert any(op.startswith("aten::_fused_") for op in ops)


@pytest.mark.parametrize("name", ["sgd", "adam_fused"])
def test_resnet18_train_steps_match_cpu_with_everything_on_the_device(name, strict, fresh_stats):
    """resnet18 at 1x3x64x64, convolutions included, with ``TUNECL_FALLBACK=error``: losses, first
    gradients and (SGD) parameters match CPU torch.

    Batch norm over the 2x2 maps of layer4 with batch 1 amplifies float32 rounding differences to
    ~3e-4 of a gradient's largest entry, and Adam turns sign flips of near-zero gradients into
    2*lr steps, so Adam's parameters are not compared element by element.
    """
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    cpu_model = torchvision.models.resnet18(num_classes=10)
    dev_model = torchvision.models.resnet18(num_classes=10)
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model = dev_model.to("opencl")
    x, y = torch.randn(1, 3, 64, 64), torch.tensor([3])
    losses, first_grads = {}, {}
    for device, model in (("cpu", cpu_model), ("opencl", dev_model)):
        opt = OPTIMIZERS[name](model.parameters())
        losses[device] = []
        for step in range(2):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            if step == 0:
                first_grads[device] = [p.grad.cpu() for p in model.parameters()]
            opt.step()
            losses[device].append(loss.item())
    assert losses["opencl"] == pytest.approx(losses["cpu"], abs=1e-4)
    for g_cpu, g_dev in zip(first_grads["cpu"], first_grads["opencl"]):
        assert (g_dev - g_cpu).abs().max() <= 1e-3 * g_cpu.abs().max() + 1e-6
    if name == "sgd":
        for (pname, p_cpu), p_dev in zip(cpu_model.state_dict().items(), dev_model.state_dict().values()):
            torch.testing.assert_close(p_dev.cpu(), p_cpu, atol=1e-4, rtol=1e-3, msg=pname)
    snapshot = fresh_stats()
    assert not snapshot["fallback_ops"]
    assert snapshot["ops"].get("aten::convolution_overrideable", 0) == 2 * 20  # 20 convs per forward
    assert snapshot["ops"].get("aten::convolution_backward_overrideable", 0) == 2 * 20
    conv_plans = {key: plan for key, plan in snapshot["plans"].items() if key.startswith("conv:")}
    assert {plan["source"] for plan in conv_plans.values()} == {"default"}
    # conv1 needs no input gradient: forward and backward-weight only
    assert any("c=3,h=64" in key and "dir=bwd_weight" in key for key in conv_plans)
    assert not any("c=3,h=64" in key and "dir=bwd_data" in key for key in conv_plans)
