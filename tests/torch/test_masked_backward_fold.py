"""An eager relu's or relu6's backward folded into the batch norm backward that follows it: the activation's
backward launch waits, held, and the batch norm's reduction reads the gradient through the activation's
mask and writes the masked gradient where the activation's backward would have. Training steps give bit
for bit what they give with the fold off (``pointwise.FOLD_MASKS``), with one launch fewer per pair;
where the masked gradient has another consumer, a hook, or another op comes between, the results stay
the same."""

from __future__ import annotations

import pytest
import torch

import tunecl.backend as backend
from tunecl import config
from tunecl.backend import state
from tunecl.backend.ops import pointwise

from batch_norm_parts import forced_parts

DEV = torch.device("opencl")


class Block(torch.nn.Module):
    """conv, batch norm, activation (relu or relu6, in place or not), conv, batch norm, then a relu after
    adding the block's input (the masked gradient feeds a batch norm and the identity path)."""

    def __init__(self, act: str, inplace: bool, channels: int = 6):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.act = torch.nn.ReLU(inplace) if act == "relu" else torch.nn.ReLU6(inplace)
        self.conv2 = torch.nn.Conv2d(channels, channels, 1)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(self.act(self.bn1(self.conv1(x))))) + x)


def _train(act, inplace, shape, hook=False, steps=2):
    """Parameters, gradients, running statistics and outputs after ``steps`` Adam steps, on the CPU."""
    torch.manual_seed(1)
    model = Block(act, inplace, shape[1])
    x0, g0 = torch.randn(shape) * 2, torch.randn(shape)
    model = model.to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    outputs = []
    with config.override(fallback="error"):
        for _ in range(steps):
            x = x0.to(DEV).requires_grad_()   # (its gradient reads the final relu's masked gradient too)
            h = model.bn1(model.conv1(x))
            if hook:   # another op on the batch norm's gradient before the batch norm backward
                h.register_hook(lambda grad: grad * 0.5)
            y = torch.relu(model.bn2(model.conv2(model.act(h))) + x)
            y.backward(g0.to(DEV))
            outputs += [y.detach().cpu(), x.grad.cpu()]
            opt.step()
            opt.zero_grad(set_to_none=False)
    return outputs + [t.detach().cpu() for t in model.state_dict().values()]


def _launches(run, monkeypatch) -> int:
    """How many launches that wait in the device's deferred list (every pointwise and batch-norm launch, held
    or not) ``run`` enqueues: with a batch size past any run's, each is counted as its batch is enqueued."""
    device = state.get().device
    device.flush()
    count = 0
    original = device._enqueue

    def enqueue(waiting):
        nonlocal count
        count += len(waiting)
        return original(waiting)
    monkeypatch.setattr(device, "_enqueue", enqueue)
    monkeypatch.setattr(device, "launch_batch", 1 << 30)
    try:
        run()
        device.flush()
    finally:
        monkeypatch.undo()
    return count


@pytest.fixture(params=[None, 1, 3], ids=lambda p: f"P{p}")
def parts(request):
    with forced_parts(request.param):
        yield request.param


@pytest.mark.parametrize("act", ["relu", "relu6"])
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "functional"])
@pytest.mark.parametrize("shape", [(4, 6, 7, 7), (3, 6, 8, 4)], ids=["scalar_rows", "float4_rows"])
def test_training_is_bit_identical_with_the_fold_off(monkeypatch, parts, act, inplace, shape):
    backend.reset_stats()
    folded = _train(act, inplace, shape, steps=3)
    assert backend.stats()["eager_fusions"].get("activation_backward", 0) >= 2   # (the first step builds)
    monkeypatch.setattr(pointwise, "FOLD_MASKS", False)
    backend.reset_stats()
    plain = _train(act, inplace, shape, steps=3)
    assert "activation_backward" not in backend.stats()["eager_fusions"]
    for a, b in zip(folded, plain):
        assert torch.equal(a, b)


def test_a_hook_between_keeps_the_results(monkeypatch):
    """A hook on the batch norm's output gradient replaces it: the batch norm backward gets another tensor
    and the activation's backward runs by itself."""
    folded = _train("relu6", True, (2, 6, 5, 5), hook=True)
    monkeypatch.setattr(pointwise, "FOLD_MASKS", False)
    plain = _train("relu6", True, (2, 6, 5, 5), hook=True)
    for a, b in zip(folded, plain):
        assert torch.equal(a, b)


def test_matches_cpu_float64():
    torch.manual_seed(2)
    model = Block("relu6", True)
    x, g = torch.randn(3, 6, 6, 6) * 3, torch.randn(3, 6, 6, 6)
    reference = [t.clone() for t in (x, g)]
    model64 = Block("relu6", True).double()
    model64.load_state_dict(model.state_dict())
    x64 = reference[0].double().requires_grad_()
    model64(x64).backward(reference[1].double())
    device_model = model.to(DEV)
    xd = x.to(DEV).requires_grad_()
    with config.override(fallback="error"):
        device_model(xd).backward(g.to(DEV))
    torch.testing.assert_close(xd.grad.cpu(), x64.grad.float(), atol=1e-4, rtol=1e-4)
    for (name, p), p64 in zip(device_model.named_parameters(), model64.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p64.grad.float(), atol=1e-4, rtol=1e-4, msg=name)


def test_one_launch_fewer_per_activation(monkeypatch):
    """The two activations whose gradient reaches a batch norm first (bn1's relu6; the final relu's, which
    the add passes to bn2 before the identity path) lose their launch. (A signature's first call builds
    its launch and runs it by itself: a first step makes every signature seen.)"""
    _train("relu6", True, (2, 6, 5, 5), steps=1)
    folded = _launches(lambda: _train("relu6", True, (2, 6, 5, 5), steps=1), monkeypatch)
    with monkeypatch.context() as off:
        off.setattr(pointwise, "FOLD_MASKS", False)
        plain = _launches(lambda: _train("relu6", True, (2, 6, 5, 5), steps=1), monkeypatch)
    assert plain - folded == 2


def test_a_retained_masked_gradient_holds_its_values():
    """The masked gradient, kept (retain_grad: torch copies it, so the relu's backward launches by itself)
    and read after the backward, is what threshold_backward gives."""
    torch.manual_seed(3)
    bn = torch.nn.BatchNorm2d(4).to(DEV)
    x = torch.randn(2, 4, 5, 5).to(DEV).requires_grad_()
    with config.override(fallback="error"):
        for _ in range(2):   # (the first call of a signature builds its launches)
            h = bn(x)
            h.retain_grad()
            y = torch.relu(h)
            g = torch.randn(y.shape).to(DEV)
            y.backward(g)
            expected = torch.where(y > 0, g, torch.zeros_like(g))
    assert torch.equal(h.grad.cpu(), expected.cpu())


def test_evaluation_mode_backward_is_bit_identical(monkeypatch):
    """A batch norm in evaluation mode under autograd (fine-tuning with frozen statistics): its backward's
    reduction (the weight and bias gradients) takes the activation's backward too."""
    def run():
        torch.manual_seed(4)
        model = Block("relu6", True).to(DEV).eval()
        x = torch.randn(2, 6, 5, 5).to(DEV).requires_grad_()
        with config.override(fallback="error"):
            for _ in range(2):   # (the first call of a signature builds its launches)
                model.zero_grad(set_to_none=True)
                x.grad = None
                model(x).backward(torch.ones(2, 6, 5, 5, device=DEV))
        return [x.grad.cpu()] + [p.grad.cpu() for p in model.parameters()]
    backend.reset_stats()
    folded = run()
    assert backend.stats()["eager_fusions"].get("activation_backward", 0) >= 2
    monkeypatch.setattr(pointwise, "FOLD_MASKS", False)
    for a, b in zip(folded, run()):
        assert torch.equal(a, b)


def test_a_captured_step_replays_as_the_unfolded_eager_step(monkeypatch):
    """A graph captured after warm-up steps records the folded launches; its replay gives what an eager
    step with the fold off gives, bit for bit."""
    def model_and_data():
        torch.manual_seed(5)
        return (Block("relu", True).to(DEV), torch.randn(3, 6, 6, 6).to(DEV), torch.randn(3, 6, 6, 6).to(DEV))

    model, x, g = model_and_data()
    with config.override(fallback="error"):
        for _ in range(2):
            model(x).backward(g)
        model.zero_grad(set_to_none=True)
        backend.reset_stats()
        graph = torch.opencl.Graph()
        with torch.opencl.graph(graph):
            model(x).backward(g)
        assert backend.stats()["eager_fusions"].get("activation_backward", 0) == 2
        graph.replay()
        replayed = [p.grad.cpu().clone() for p in model.parameters()]
        graph.reset()
    monkeypatch.setattr(pointwise, "FOLD_MASKS", False)
    model, x, g = model_and_data()
    with config.override(fallback="error"):   # (training-mode gradients read the batch's statistics)
        model(x).backward(g)
    for a, b in zip(replayed, [p.grad.cpu() for p in model.parameters()]):
        assert torch.equal(a, b)
