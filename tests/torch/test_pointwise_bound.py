"""Pre-built pointwise launches (Pointwise.launch at offsets 0, tunecl.kernels.launches.Bound): a plan's
kernel copy with its meta set once, buffers bound and scalars packed per launch; results equal, bit for
bit, pyopencl's own launch of the plan's kernel, under what can change between launches."""

from __future__ import annotations

import pytest
import torch

from tunecl.backend import state
from tunecl.kernels.ops import pointwise as pointwise_kernels
from tunecl.profiling import KernelProfile

DEV = "opencl"


@pytest.fixture
def general(monkeypatch):
    """Call ``fn`` with the pre-built launches off (every plan launched through its kernel)."""
    def run(fn, *args):
        with monkeypatch.context() as m:
            m.setattr(pointwise_kernels.Pointwise, "_bound", lambda self, plan: None)
            m.setattr(pointwise_kernels._Plan, "bound", property(lambda self: []))
            return fn(*args)
    return run


def _same(a, b):
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _bound_plans():
    return [p for p in state.get().pointwise._plans.values() if p.bound and p.bound[0] is not None]


CASES = {
    "add": lambda a, b: a + b,
    "add alpha": lambda a, b: torch.add(a, b, alpha=0.3),
    "add_ alpha": lambda a, b: a.clone().add_(b, alpha=1e-6),
    "mul scalar": lambda a, b: a * 2.5,
    "relu": lambda a, b: torch.relu(a),
    "add relu_": lambda a, b: (a + b).relu_(),
    "clamp": lambda a, b: a.clamp(-0.5, 0.25),
    "int mul": lambda a, b: (a * 100).long() * 3 + 7,
    "half": lambda a, b: a.half() + b.half(),
    "offsets": lambda a, b: a[3:] + b[3:],
    "huge scalar": lambda a, b: a * 1e300,
    "big int scalar": lambda a, b: (a * 100).long() + 2**40,
}


@pytest.mark.parametrize("name", CASES)
def test_repeated_launches_match_the_kernels_own_launch(name, general, strict):
    a, b = torch.randn(1003, device=DEV), torch.randn(1003, device=DEV)
    op = CASES[name]
    for _ in range(3):
        _same(op(a, b), general(op, a, b))
    cpu = op(a.cpu(), b.cpu())
    if name != "half":
        _same(op(a, b), cpu)


def test_launches_are_pre_built_once_per_plan(strict):
    a, b = torch.randn(77, device=DEV), torch.randn(77, device=DEV)
    for _ in range(3):
        a + b
    (plan,) = [p for p in _bound_plans() if p.signature[0] == "add" and p.signature[1] == a.shape]
    first = plan.bound[0]
    a + b
    assert plan.bound[0] is first


def test_an_in_place_relu_still_folds_into_an_add(strict, monkeypatch):
    device = state.get().device
    folded, replace = [], device.replace_held
    monkeypatch.setattr(device, "replace_held", lambda tag, op="relu": folded.append(replace(tag, op)) or folded[-1])
    a, b = torch.randn(64, device=DEV), torch.randn(64, device=DEV)
    outs = [(a + b).relu_() for _ in range(3)]
    assert folded == [True, True, True]
    for out in outs:
        _same(out, torch.relu(a.cpu() + b.cpu()))


def test_graph_capture_and_kernel_profile_see_the_kernels_launches(strict, general):
    a, b = torch.randn(256, device=DEV), torch.randn(256, device=DEV)
    step = lambda: torch.relu(a * 2.0 + b).add_(b, alpha=0.5)
    step()
    step()
    graphs_made, outs = [], []
    for route in (lambda f: f(), lambda f: general(f)):
        g = torch.opencl.Graph()
        with torch.opencl.graph(g):
            outs.append(route(step))
        graphs_made.append(g)
    assert graphs_made[0].commands == graphs_made[1].commands > 0
    b.mul_(3.0)
    for g in graphs_made:
        g.replay()
    _same(outs[0], outs[1])
    for g in graphs_made:
        g.reset()
    with KernelProfile() as fast:
        step()
        torch.opencl.synchronize()
    with KernelProfile() as slow:
        general(step)
        torch.opencl.synchronize()
    assert fast.commands == slow.commands == 4


def test_a_new_state_has_its_own_launches(strict, monkeypatch):
    a, b = torch.randn(33, device=DEV), torch.randn(33, device=DEV)
    (a + b).cpu()
    (a + b).cpu()
    monkeypatch.setattr(state, "_state", state.State(state.get().device))
    assert not _bound_plans()
    _same(a + b, a.cpu() + b.cpu())
    assert _bound_plans()


def test_packed_scalars_are_kept_per_value_and_a_zero_keeps_its_sign(strict):
    """The packed scalars of a pre-built launch are kept by their values: alternating numbers each get their
    own, an int and the float equal to it pack alike, and 0, 0.0 and -0.0 (equal, different bits) each their
    own."""
    x = torch.tensor([1.0, -2.0, 0.0, 3.5], device=DEV)
    cpu = x.cpu()
    for value in [2.0, -3.0, 2, 0, 0.0, -0.0, 0, -0.0, 0.0, -0.0, 1e-6, 2.0]:
        for _ in range(2):
            _same(x * value, cpu * value)
            _same(torch.add(x, x, alpha=value), torch.add(cpu, cpu, alpha=value))
    negative_zeros = torch.full((4,), -0.0)
    for value in (0, -0.0, 0.0, 0, -0.0):   # (an int zero is kept: a float zero must not find it)
        assert torch.equal(torch.signbit((x * value).cpu()), torch.signbit(cpu * value))
        added = torch.add(negative_zeros.to(DEV), x, alpha=value).cpu()   # -0 + alpha * x: alpha's sign shows
        assert torch.equal(torch.signbit(added), torch.signbit(torch.add(negative_zeros, cpu, alpha=value)))
    plans = _bound_plans()
    assert plans and all(len(p.bound[0].packed) <= 16 for p in plans)
    for _ in range(3):   # more values than are kept
        for k in range(40):
            _same(x * float(k + 1), cpu * float(k + 1))
    assert all(len(p.bound[0].packed) <= 16 for p in _bound_plans())
