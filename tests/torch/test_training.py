"""Small training runs on opencl match the same runs on the CPU, with no op on the CPU fallback."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tunecl import config, runtime


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_fused": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3,
                                                    fused=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adamw_fused_amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, amsgrad=True, fused=True),
    "adam_foreach_false": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    # a learning-rate tensor on the parameters' device (the opencl one: read by the kernel), as schedulers
    # with graphs need, and on the CPU (read on the host)
    "adam_fused_tensor_lr": lambda p: _with_tensor_lr(torch.optim.Adam, p, fused=True),
    "adamw_fused_cpu_tensor_lr": lambda p: _with_tensor_lr(torch.optim.AdamW, p, on_cpu=True, fused=True),
    "sgd_momentum_fused_tensor_lr": lambda p: _with_tensor_lr(torch.optim.SGD, p, momentum=0.9, fused=True),
}


def _with_tensor_lr(optimizer, params, on_cpu=False, **options):
    params = list(params)
    lr = torch.tensor(1e-2, device="cpu" if on_cpu else params[0].device)
    return optimizer(params, lr=lr, **options)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 32), nn.GELU(),
                         nn.BatchNorm1d(32), nn.Linear(32, 4))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mlp_training_matches_cpu(name, strict, fresh_stats):
    _train_mlp_and_compare(name, fresh_stats)


@pytest.mark.parametrize("name", sorted(n for n in OPTIMIZERS if "fused" in n))
def test_fused_steps_in_the_gpu_layout_match_cpu(name, strict, fresh_stats, monkeypatch):
    # GPUs: few work-items per tensor, each striding over many elements and computing the bias corrections
    # itself (CPU devices: one element per work-item, corrections once per work-group)
    from tunecl.backend import state

    monkeypatch.setattr(state.get().optim, "cpu_layout", False)
    monkeypatch.setattr(state.get().optim, "items", 64)
    _train_mlp_and_compare(name, fresh_stats)


@pytest.mark.parametrize("slots", [3, 16, 32])
@pytest.mark.parametrize("name", ["adam", "adam_fused", "adamw_fused_amsgrad", "sgd_momentum_fused_tensor_lr"])
def test_steps_match_cpu_at_every_slot_count(name, slots, strict, fresh_stats, monkeypatch):
    # tensors per launch (TUNECL_OPTIM_SLOTS; 32 where the device's argument bytes allow, as NVIDIA's do):
    # several partly filled launches, or one mostly empty launch, give the same steps
    from tunecl.backend import state

    monkeypatch.setattr(state.get().optim, "slots", slots)
    _train_mlp_and_compare(name, fresh_stats)


@config.override(random="host")   # the CPU's dropout masks on the device
def _train_mlp_and_compare(name, fresh_stats):
    x, y = torch.randn(16, 10), torch.randint(0, 4, (16,))
    runs = {}
    for device in ("cpu", "opencl"):
        model = _mlp().to(device)
        opt = OPTIMIZERS[name](model.parameters())
        xd, yd = x.to(device), y.to(device)
        torch.manual_seed(1)  # same dropout masks on both devices (host draws)
        losses = []
        for step in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xd), yd)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if isinstance(opt.param_groups[0]["lr"], torch.Tensor):   # as a scheduler updates it
                opt.param_groups[0]["lr"].fill_(0.02 / (step + 1))
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
    """resnet18 at 1x3x64x64, convolutions included, with ``TUNECL_FALLBACK=error``: losses match CPU
    torch; first gradients and (SGD) parameters and running stats match a float64 CPU run about as well as
    CPU torch's float32 run does.

    Batch norm over the 2x2 maps of layer4 with batch 1 amplifies float32 rounding to ~2e-4 of a
    gradient's largest entry - CPU torch's own float32 gradients are that far from float64 - so the
    gradients are compared with float64, not with another float32 run that errs its own way. Adam
    turns sign flips of near-zero gradients into 2*lr steps, so Adam's parameters are not compared
    element by element.
    """
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    cpu_model = torchvision.models.resnet18(num_classes=10)
    dev_model = torchvision.models.resnet18(num_classes=10)
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model = dev_model.to("opencl")
    x, y = torch.randn(1, 3, 64, 64), torch.tensor([3])
    exact_model = copy.deepcopy(cpu_model).double()
    runs = {"cpu": (cpu_model, torch.float32), "opencl": (dev_model, torch.float32),
            "exact": (exact_model, torch.float64)}  # the float64 CPU run the others are judged by
    losses, first_grads = {}, {}
    for key, (model, dtype) in runs.items():
        device = "opencl" if key == "opencl" else "cpu"
        opt = OPTIMIZERS[name](model.parameters())
        losses[key] = []
        for step in range(2):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x.to(device, dtype)), y.to(device))
            loss.backward()
            if step == 0:
                first_grads[key] = [p.grad.cpu().double() for p in model.parameters()]
            opt.step()
            losses[key].append(loss.item())
    assert losses["opencl"] == pytest.approx(losses["cpu"], abs=1e-4)
    names = [pname for pname, _ in exact_model.named_parameters()]
    for pname, g_exact, g_dev in zip(names, first_grads["exact"], first_grads["opencl"], strict=True):
        assert (g_dev - g_exact).abs().max() <= 1e-3 * g_exact.abs().max() + 1e-6, pname
    if name == "sgd":  # after two steps: as close to float64 as CPU torch (4x), or 1e-3 of the largest value
        states = zip(exact_model.state_dict().items(), cpu_model.state_dict().values(),
                     dev_model.state_dict().values(), strict=True)
        for (pname, p_exact), p_cpu, p_dev in states:
            if not p_exact.is_floating_point():
                assert torch.equal(p_dev.cpu(), p_cpu), pname
                continue
            cpu_error = (p_cpu.double() - p_exact).abs().max().item()
            bound = 4 * cpu_error + 1e-3 * p_exact.abs().max().item() + 1e-5
            assert (p_dev.cpu().double() - p_exact).abs().max().item() <= bound, pname
    snapshot = fresh_stats()
    assert not snapshot["fallback_ops"]
    assert snapshot["ops"].get("aten::convolution_overrideable", 0) == 2 * 20  # 20 convs per forward
    assert snapshot["ops"].get("aten::convolution_backward_overrideable", 0) == 2 * 20
    conv_plans = {key: plan for key, plan in snapshot["plans"].items() if key.startswith("conv:")}
    assert {plan["source"] for plan in conv_plans.values()} == {"default"}
    # conv1 needs no input gradient: forward and backward-weight only
    assert any("c=3,h=64" in key and "dir=bwd_weight" in key for key in conv_plans)
    assert not any("c=3,h=64" in key and "dir=bwd_data" in key for key in conv_plans)


def test_fused_steps_match_cpu_on_every_other_usable_cpu_device():
    """The fused steps' tests above, in a child process on each other CPU OpenCL device that compiles
    (the package's own PyPI PoCL, where the distribution's PoCL is the default). adam_step's work-group
    corrections once had a ``return`` ahead of a barrier, which no work-item took: PyPI's PoCL 3.0 then
    corrupted the heap and the process died later, in whatever ran next; the distribution's 3.1 did not."""
    default = runtime.resolve(None).index
    others = [e for e in runtime.list_devices() if e.usable and e.device_type == "cpu" and e.index != default]
    if not others:
        pytest.skip("no other CPU OpenCL device compiles here")
    root = Path(__file__).resolve().parents[2]
    for entry in others:
        child = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
             f"{Path(__file__).relative_to(root)}::test_mlp_training_matches_cpu", "-k", "fused"],
            cwd=root, env={**os.environ, "TUNECL_DEVICE": str(entry.index)}, capture_output=True, text=True,
            check=False, timeout=600)
        assert child.returncode == 0, (f"device {entry.index} ({entry.platform}: {entry.name}): exit code "
                                       f"{child.returncode}\n{child.stdout[-3000:]}\n{child.stderr[-2000:]}")
        assert " passed" in child.stdout, child.stdout[-2000:]
