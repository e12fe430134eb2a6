"""Eager runs of ``_foreach_*`` calls as one multi-tensor kernel (:mod:`tunecl.backend.foreach_runs`): optimizer
steps equal the call-by-call results bit for bit, the run is launched before anything can read or write what
it touches, and the calls it must not take run by themselves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tunecl import config
from tunecl.backend import foreach_runs, graphs, state
from tunecl.errors import BuildError, Unsupported
from tunecl.kernels.ops.fused import Chain, Step
from training_checks import assert_same_parameters_and_state

OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adam amsgrad maximize": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, maximize=True),
    "sgd nesterov": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, centered=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
    "nadam": lambda p: torch.optim.NAdam(p, lr=1e-2),
    "radam": lambda p: torch.optim.RAdam(p, lr=1e-2),
    "adamax": lambda p: torch.optim.Adamax(p, lr=1e-2),
    "adadelta": lambda p: torch.optim.Adadelta(p),
}


def _model() -> nn.Module:
    # odd sizes, a 1-element bias, and more tensors than a launch's slots on PoCL (8)
    return nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 1),
                         *[nn.Linear(1, 1) for _ in range(4)], nn.Flatten(0))


def _train(name: str, device: str, steps: int = 4) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = _model().to(device)
    optimizer = OPTIMIZERS[name](model.parameters())
    torch.manual_seed(1)
    for _ in range(steps):
        model(torch.randn(4, 7).to(device)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    foreach_runs.flush()
    return model, optimizer


@pytest.fixture(params=["by address", "by pointer arguments"])
def binding(request, monkeypatch):
    """A run's pre-built launches reach their tensors by address (where the device allows it, as PoCL does) or
    through a pointer argument per tensor (``TUNECL_ADDRESSES=off``)."""
    optim = state.get().optim
    assert optim.by_address()   # (the probe passes on the test device)
    monkeypatch.setattr(optim, "_by_address", request.param == "by address")
    monkeypatch.setattr(optim, "_chains", {})
    return request.param == "by address"


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_an_eager_foreach_step_runs_as_one_kernel_bit_for_bit(name, binding):
    before = foreach_runs.stats()
    model, optimizer = _train(name, "opencl")
    after = foreach_runs.stats()
    # one run a step at least (the forward's first op launches it), several calls each
    assert after["runs"] - before["runs"] >= 4 and after["calls"] - before["calls"] >= 3 * 4, (before, after)
    # a step's run is launched from pre-built copies from its second step on
    built = [c for c in state.get().optim._chains.values() if c.presets]
    assert built and all((c.address_kernel is not None) == binding for c in built)
    with config.override(foreach_runs="off"):
        reference = _train(name, "opencl")
        assert foreach_runs.stats() == after
    assert_same_parameters_and_state(model, optimizer, *reference)
    cpu_model, _ = _train(name, "cpu")
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def _lists(*sizes: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(n, generator=g) + 0.5 for n in sizes]


def _device(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [x.to("opencl") for x in xs]


def _pending_calls() -> int:
    run = foreach_runs.pending
    return 0 if run is None else run.calls


def test_functional_results_read_after_in_place_calls_and_every_read_sees_the_run():
    a, b = _lists(3, 40, 1, 9), _lists(3, 40, 1, 9, seed=1)
    da, db = _device(a), _device(b)
    with torch.no_grad():
        torch._foreach_mul_(da, 3.0)
        s = torch._foreach_sqrt(da)
        torch._foreach_add_(s, db, alpha=0.5)
        torch._foreach_addcdiv_(db, da, s, value=-2.0)
        assert _pending_calls() == 4
        first = s[0].cpu()   # a copy: the run goes first
        assert foreach_runs.pending is None
    ea = [x * 3.0 for x in a]
    es = [x.sqrt() + 0.5 * y for x, y in zip(ea, b)]
    eb = [y + -2.0 * x / z for x, y, z in zip(ea, b, es)]
    torch.testing.assert_close(first, es[0], rtol=1e-6, atol=1e-6)
    for got, want in zip([*da, *s, *db], [*ea, *es, *eb]):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("read", ["item", "sum", "synchronize", "event", "clone", "index"])
def test_the_pending_run_is_launched_before_the_next_op_or_wait(read):
    xs = _device(_lists(5, 6))
    with torch.no_grad():
        torch._foreach_mul_(xs, 2.0)
        torch._foreach_add_(xs, 1.0)
    assert foreach_runs.pending is not None
    if read == "item":
        value = xs[0][2].item()
    elif read == "sum":
        value = xs[0].sum().cpu()[()].item() - xs[0][[0, 1, 3, 4]].sum().cpu().item()
    elif read == "synchronize":
        torch.opencl.synchronize()
        assert foreach_runs.pending is None
        value = xs[0][2].item()
    elif read == "event":
        event = torch.Event(device="opencl")
        event.record()
        assert foreach_runs.pending is None
        event.synchronize()
        value = xs[0][2].item()
    elif read == "clone":
        value = xs[0].clone().cpu()[2].item()
    else:
        value = xs[0][torch.tensor([2], device="opencl")].cpu().item()
    assert foreach_runs.pending is None
    want = _lists(5, 6)[0][2].item() * 2.0 + 1.0
    assert value == pytest.approx(want, rel=1e-6, abs=1e-5)


def test_grad_mode_calls_and_off_setting_do_not_wait():
    xs = _device(_lists(4, 4))
    torch._foreach_mul_(xs, 2.0)   # grad mode on
    assert foreach_runs.pending is None
    with torch.no_grad(), config.override(foreach_runs="off"):
        torch._foreach_mul_(xs, 2.0)
        assert foreach_runs.pending is None
    torch.testing.assert_close(xs[1].cpu(), _lists(4, 4)[1] * 4.0)


def test_the_setting_is_checked():
    with pytest.raises(ValueError, match="TUNECL_FOREACH_RUNS must be one of on, off"):
        config.Config.from_env({"TUNECL_FOREACH_RUNS": "sometimes"})


def test_calls_over_shared_storages_run_in_order():
    # xs and ys are views of one storage, crossed: a run holding both would read stale values
    base = torch.arange(10, dtype=torch.float32)
    device_base = base.to("opencl")
    xs, ys = [device_base[:5], device_base[5:]], [device_base[5:], device_base[:5]]
    cx, cy = [base[:5], base[5:]], [base[5:], base[:5]]
    with torch.no_grad():
        for x_list, y_list in ((xs, ys), (cx, cy)):
            torch._foreach_mul_(x_list, 2.0)
            torch._foreach_add_(y_list, x_list, alpha=0.25)
            torch._foreach_mul_(x_list, 3.0)
    torch.testing.assert_close(device_base.cpu(), base)


def test_a_list_holding_one_storage_twice_is_not_written_by_a_run():
    base = torch.ones(8).to("opencl")
    twice = [base[:4], base[4:]]
    with torch.no_grad():
        torch._foreach_mul_(twice, 2.0)
        torch._foreach_add_(twice, 1.0)
    torch.testing.assert_close(base.cpu(), torch.full((8,), 3.0))


def test_numbers_that_differ_per_tensor_and_other_lists_split_the_run_correctly():
    a, b = _lists(3, 7, seed=2), _lists(3, 7, seed=3)
    da, db = _device(a), _device(b)
    with torch.no_grad():
        torch._foreach_mul_(da, [2.0, 5.0])          # a number per tensor: runs by itself
        torch._foreach_add_(da, 1.0)
        torch._foreach_mul_(db, 0.5)
        other = _device(_lists(2, 2, seed=4))
        torch._foreach_add_(other, 1.0)             # other numels: a new run
        torch._foreach_maximum_(da, db)
    torch.testing.assert_close(da[0].cpu(), torch.maximum(a[0] * 2.0 + 1.0, b[0] * 0.5))
    torch.testing.assert_close(da[1].cpu(), torch.maximum(a[1] * 5.0 + 1.0, b[1] * 0.5))
    torch.testing.assert_close(other[1].cpu(), _lists(2, 2, seed=4)[1] + 1.0)


def test_a_run_beyond_the_kernels_columns_and_steps_is_split():
    lists = [_lists(3, 5, seed=s) for s in range(12)]
    device_lists = [_device(x) for x in lists]
    with torch.no_grad():
        for step in range(40):   # 40 calls over 12 lists: more steps and columns than one kernel takes
            torch._foreach_add_(device_lists[step % 12], device_lists[(step + 5) % 12], alpha=0.5)
        for step in range(40):
            torch._foreach_add_(lists[step % 12], lists[(step + 5) % 12], alpha=0.5)
    for got, want in zip(device_lists, lists):
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-6, atol=1e-6)


def test_a_storage_swapped_after_a_pending_write_gets_the_write():
    p = torch.zeros(6).to("opencl")
    old = p.detach()   # the same storage
    with torch.no_grad():
        torch._foreach_add_([p], 2.0)
        torch._foreach_mul_([p], 3.0)
        p.data = torch.ones(6).to("opencl")
    torch.testing.assert_close(old.cpu(), torch.full((6,), 6.0))
    torch.testing.assert_close(p.cpu(), torch.ones(6))


def test_a_graph_captured_after_a_pending_run_does_not_hold_it():
    xs = _device(_lists(4, 4))
    y = torch.ones(4).to("opencl")
    with torch.no_grad():
        torch._foreach_mul_(xs, 2.0)
        torch._foreach_add_(xs, 1.0)
        graph = graphs.Graph()
        with graphs.graph(graph):
            z = y * 2.0
        graph.replay()
        graph.replay()
    want = _lists(4, 4)[0] * 2.0 + 1.0
    torch.testing.assert_close(xs[0].cpu(), want)
    torch.testing.assert_close(z.cpu(), torch.full((4,), 2.0))


def test_a_pending_run_is_launched_before_a_compiled_graph_reads_its_tensors():
    pytest.importorskip("tunecl.backend.compile")
    torch._dynamo.reset()
    w = torch.ones(3).to("opencl")
    compiled = torch.compile(lambda x: (x * w).sum(), backend="tunecl")
    x = torch.ones(3).to("opencl")
    results = []
    for step in range(4):
        with torch.no_grad():
            torch._foreach_add_([w], 1.0)
            torch._foreach_mul_([w], 1.0)
        results.append(compiled(x).item())
    torch._dynamo.reset()
    assert results == [6.0, 9.0, 12.0, 15.0]


def test_chains_check_their_numbers():
    Chain(1, (Step("add", ("v0", "K(0)"), ("K(1)",)),)).check(constants=2)
    with pytest.raises(Unsupported, match="reads K\\(2\\)"):
        Chain(1, (Step("add", ("v0", "K(2)"), (1.0,)),)).check(constants=2)
    with pytest.raises(Unsupported, match="takes K\\(0\\) as a parameter"):
        Chain(1, (Step("add", ("v0", 1.0), ("K(0)",)),)).check()


def test_numbers_travel_by_value_so_one_kernel_serves_every_step():
    xs = _device(_lists(3, 3))
    cpu = _lists(3, 3)
    with torch.no_grad():
        for k in range(6):
            torch._foreach_mul_(xs, 1.0 + k / 8)
            torch._foreach_add_(xs, float(k))
            xs[0].sum()   # launches the run
            torch._foreach_mul_(cpu, 1.0 + k / 8)
            torch._foreach_add_(cpu, float(k))
    for got, want in zip(xs, cpu):
        np.testing.assert_array_equal(got.cpu().numpy(), want.numpy())


def test_a_run_the_device_cannot_build_launches_its_calls_one_by_one(monkeypatch):
    def cannot(*args, **kwargs):
        raise BuildError("foreach_chain: the compiler refused it")

    monkeypatch.setattr(state.get().optim, "chain_chunks", cannot)
    a, b = _lists(3, 40, 1, 9), _lists(3, 40, 1, 9, seed=1)
    da, db = _device(a), _device(b)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="launched one by one"):
        torch._foreach_mul_(da, 3.0)
        s = torch._foreach_sqrt(da)
        torch._foreach_add_(s, db, alpha=0.5)
        torch._foreach_addcdiv_(db, da, s, value=-2.0)
        torch.opencl.synchronize()
    ea = [x * 3.0 for x in a]
    es = [x.sqrt() + 0.5 * y for x, y in zip(ea, b)]
    eb = [y + -2.0 * x / z for x, y, z in zip(ea, b, es)]
    for got, want in zip([*da, *s, *db], [*ea, *es, *eb]):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)


def test_gradient_clipping_and_a_grad_scaler_around_a_run_give_the_call_by_call_results():
    def train():
        torch.manual_seed(0)
        model = _model().to("opencl")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("opencl", init_scale=1024.0)
        torch.manual_seed(1)
        for _ in range(4):
            scaler.scale(model(torch.randn(4, 7).to("opencl")).square().sum()).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        foreach_runs.flush()
        return model, optimizer

    before = foreach_runs.stats()["runs"]
    model, optimizer = train()
    assert foreach_runs.stats()["runs"] - before >= 4
    with config.override(foreach_runs="off"):
        reference = train()
    assert_same_parameters_and_state(model, optimizer, *reference)


def test_the_backends_statistics_count_runs_and_their_calls():
    import tunecl.backend

    tunecl.backend.reset_stats()
    xs = _device(_lists(3, 3))
    with torch.no_grad():
        torch._foreach_mul_(xs, 2.0)
        torch._foreach_add_(xs, 1.0)
    torch.opencl.synchronize()
    assert tunecl.backend.stats()["foreach_runs"] == {"runs": 1, "calls": 2}
    tunecl.backend.reset_stats()
    assert tunecl.backend.stats()["foreach_runs"] == {"runs": 0, "calls": 0}


def test_each_optimizer_step_is_launched_as_it_returns():
    model = _model().to("opencl")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(4, 7).to("opencl")).sum().backward()
    before = foreach_runs.stats()
    for _ in range(3):   # steps back to back: a run each, of the same calls
        optimizer.step()
        assert foreach_runs.pending is None
    after = foreach_runs.stats()
    assert after["runs"] - before["runs"] == 3 and (after["calls"] - before["calls"]) % 3 == 0
