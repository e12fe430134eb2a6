"""torch.opencl.make_graphed_callables: a module's or function's forward and backward replayed from graphs,
the rest of the step eager. Replayed training equals eager training bit for bit; misuse is a clear error."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tunecl.backend



def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))


def _train(model, batches, graphed_model=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = F.cross_entropy((graphed_model or model)(x.to("opencl")), y.to("opencl"))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_a_graphed_module_trains_exactly_as_the_eager_one(fresh_stats):
    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))) for _ in range(3)]
    eager, graphed = _net().to("opencl"), _net().to("opencl")
    graphed = torch.opencl.make_graphed_callables(graphed, (torch.randn(4, 3, 8, 8, device="opencl"),),
                                                  num_warmup_iters=1)
    eager[1].running_mean.copy_(graphed[1].running_mean)   # (the warm-up and capture passes updated them)
    eager[1].running_var.copy_(graphed[1].running_var)
    eager[1].num_batches_tracked.copy_(graphed[1].num_batches_tracked)
    assert _train(eager, batches) == _train(graphed, batches)
    for (name, a), b in zip(eager.state_dict().items(), graphed.state_dict().values()):
        assert torch.equal(a.cpu(), b.cpu()), name   # parameters, and batch norm's buffers
    x = torch.randn(4, 3, 8, 8, device="opencl")
    tunecl.backend.reset_stats()
    graphed(x).sum().backward()
    ops = fresh_stats()["ops"]   # forward and backward were replays: no convolution or batch norm op ran
    assert not [op for op in ops if "convolution" in op or "batch_norm" in op], ops
    eager(x)   # (the same running-statistics update)
    graphed.eval()   # another mode: the original forward runs
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(graphed(x.to("opencl")).cpu(), eager.eval()(x.to("opencl")).cpu())


def test_a_graphed_function_gives_the_eager_gradients():
    def f(x, w):
        return torch.tanh(x @ w).sum(1), (x * 2).detach()   # a tuple, one output without grad

    sample = (torch.randn(6, 4, device="opencl", requires_grad=True),
              torch.randn(4, 3, device="opencl", requires_grad=True))
    graphed = torch.opencl.make_graphed_callables(f, sample)
    for _ in range(2):
        x, w = torch.randn(6, 4), torch.randn(4, 3)
        runs = []
        for fn in (f, graphed):
            xd, wd = x.to("opencl").requires_grad_(), w.to("opencl").requires_grad_()
            out, doubled = fn(xd, wd)
            (out * torch.arange(6.0, device="opencl")).sum().backward()
            runs.append([t.detach().cpu() for t in (out, doubled, xd.grad, wd.grad)])
        for a, b in zip(*runs):
            assert torch.equal(a, b)


def test_a_tuple_of_modules_chained():
    torch.manual_seed(1)
    first, second = nn.Linear(5, 7).to("opencl"), nn.Linear(7, 2).to("opencl")
    reference = copy.deepcopy(nn.Sequential(first, second))
    a_sample = torch.randn(3, 5, device="opencl")
    b_sample = torch.randn(3, 7, device="opencl", requires_grad=True)
    first, second = torch.opencl.make_graphed_callables((first, second), ((a_sample,), (b_sample,)))
    x = torch.randn(3, 5, device="opencl")
    second(first(x)).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    for a, b in zip(reference.parameters(), [*first.parameters(), *second.parameters()]):
        assert torch.equal(a.grad.cpu(), b.grad.cpu())


def test_misuse_is_a_clear_error():
    model = torch.opencl.make_graphed_callables(nn.Linear(4, 2).to("opencl"), (torch.randn(3, 4, device="opencl"),))
    with pytest.raises(ValueError, match="like its sample argument"):
        model(torch.randn(5, 4, device="opencl"))
    with pytest.raises(ValueError, match="like its sample argument"):
        model(torch.randn(4, 3, device="opencl").t())   # other strides
    with pytest.raises(TypeError, match="positional"):
        torch.opencl.make_graphed_callables(lambda x: x * 2, (torch.randn(2, device="opencl"),))(x=1)
    with pytest.raises(TypeError, match="opencl tensors"):
        torch.opencl.make_graphed_callables(nn.Linear(4, 2), (torch.randn(3, 4),))
    hooked = nn.Linear(4, 2).to("opencl")
    hooked.register_forward_hook(lambda *args: None)
    with pytest.raises(ValueError, match="hooks"):
        torch.opencl.make_graphed_callables(hooked, (torch.randn(3, 4, device="opencl"),))
    with pytest.raises(ValueError, match="2 callables but 1"):
        torch.opencl.make_graphed_callables((hooked, hooked), ((torch.randn(3, 4, device="opencl"),),))
