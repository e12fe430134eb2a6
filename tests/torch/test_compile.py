"""``torch.compile(model, backend="tunecl")``: forward, backward and optimizer steps replayed from device
graphs equal eager execution; what cannot be captured runs eagerly; replays see weights written between
them."""

from __future__ import annotations

import copy
import importlib.metadata
import itertools
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tunecl import config

compile_backend = pytest.importorskip("tunecl.backend.compile")

STEPS = 4   # warm-up, capture, then replays


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _conv_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 6, 1), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 5))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(7, 16), nn.Tanh(), nn.Linear(16, 3))


def _train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], compiled: bool,
           device: str) -> tuple[list[float], nn.Module]:
    model = copy.deepcopy(model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run = torch.compile(model, backend="tunecl") if compiled else model
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(run(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model


def _assert_same_training(model: nn.Module, batches, atol: float = 1e-5) -> None:
    expected, eager = _train(model, batches, compiled=False, device="opencl")
    got, compiled = _train(model, batches, compiled=True, device="opencl")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=atol, rtol=1e-5)
    for (name, a), b in zip(compiled.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b.cpu(), atol=atol, rtol=1e-5, msg=name)


def test_a_conv_net_trains_as_it_does_eagerly_and_its_steps_replay():
    batches = [(torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))) for _ in range(STEPS)]
    _assert_same_training(_conv_net(), batches)
    stats = compile_backend.stats()
    assert stats["captures"] == 2 and stats["replays"] == 2 * (STEPS - 2), stats   # forward and backward
    assert not any(key.startswith("eager") for key in stats), stats


def test_an_mlp_in_inference_replays_and_its_results_are_not_overwritten():
    model = _mlp().to("opencl").eval()
    run = torch.compile(model, backend="tunecl")
    inputs = [torch.randn(4, 7) for _ in range(STEPS)]
    with torch.no_grad():
        outputs = [run(x.to("opencl")) for x in inputs]   # all kept: none may be rewritten by a later call
        expected = [model(x.to("opencl")).cpu() for x in inputs]
    for got, want in zip(outputs, expected):
        torch.testing.assert_close(got.cpu(), want)
    assert compile_backend.stats()["replays"] == STEPS - 2


def test_a_graph_break_and_a_recompile_for_a_new_shape():
    class Breaking(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.a(x))
            torch._dynamo.graph_break()
            return self.b(x)

    batches = [(torch.randn(3, 6), torch.randint(0, 4, (3,))) for _ in range(STEPS)]
    batches += [(torch.randn(5, 6), torch.randint(0, 4, (5,))) for _ in range(STEPS)]   # a new batch size
    torch._dynamo.config.automatic_dynamic_shapes = False   # a recompile per shape, as a static graph needs
    try:
        _assert_same_training(Breaking(), batches)
    finally:
        torch._dynamo.config.automatic_dynamic_shapes = True
    assert compile_backend.stats()["captures"] == 8   # two subgraphs x (forward, backward) x two shapes


def test_replays_see_weights_written_between_them():
    model = _mlp().to("opencl").eval()
    run = torch.compile(model, backend="tunecl")
    x = torch.randn(2, 7, device="opencl")
    with torch.no_grad():
        for _ in range(3):
            run(x)
        model[0].weight.mul_(2)                                  # an in-place write
        torch.testing.assert_close(run(x).cpu(), model(x).cpu())
        other = _mlp()
        model.load_state_dict(other.state_dict())                # load_state_dict copies in place
        torch.testing.assert_close(run(x).cpu(), other(x.cpu()), atol=1e-5, rtol=1e-5)
    assert compile_backend.stats()["replays"] >= 2


def test_an_op_on_the_cpu_fallback_runs_that_graph_eagerly():
    def uses_a_fallback(x: torch.Tensor) -> torch.Tensor:
        return torch.special.bessel_j0(x * 2) + 1   # no device kernel: the CPU fallback serves it

    x = torch.randn(5, device="opencl")
    with config.override(fallback="warn"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = torch.compile(uses_a_fallback, backend="tunecl")
        results = [run(x) for _ in range(STEPS)]
    for got in results:
        torch.testing.assert_close(got.cpu(), uses_a_fallback(x.cpu()))
    assert any("runs eagerly" in str(w.message) for w in seen)
    assert compile_backend.stats().get("eager_graphs") == 1
    torch._dynamo.reset()
    with config.override(fallback="error"), pytest.raises(RuntimeError, match="bessel_j0"):
        torch.compile(uses_a_fallback, backend="tunecl")(x)


def test_two_forwards_before_one_backward_keep_their_saved_tensors():
    model = _mlp().to("opencl")
    reference = copy.deepcopy(model)
    run = torch.compile(model, backend="tunecl")
    xs = [torch.randn(3, 7, device="opencl") for _ in range(2)]
    for _ in range(STEPS):   # the graphs are captured and replay
        (run(xs[0]).square().sum() + run(xs[1]).sum()).backward()
        (reference(xs[0]).square().sum() + reference(xs[1]).sum()).backward()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad.cpu(), atol=1e-4, rtol=1e-5)


@pytest.mark.skipif("tunecl" not in importlib.metadata.entry_points(group="torch_dynamo_backends").names,
                    reason="the package is not installed (its torch_dynamo_backends entry point is absent)")
def test_the_backend_is_found_by_name_in_a_fresh_process():
    code = ("import torch; f = torch.compile(lambda x: x * 2 + 1, backend='tunecl'); "
            "import tunecl.backend; x = torch.ones(3, device='opencl'); print(f(x).cpu().tolist())")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[3.0, 3.0, 3.0]" in done.stdout


def test_the_default_backend_compiles_opencl_graphs_with_tunecls_and_says_so(monkeypatch):
    """``torch.compile(model)`` without a backend: Inductor has no OpenCL code generator, so an opencl graph
    compiles with backend="tunecl", trains as eagerly and replays, with one warning naming the choice."""
    from tunecl.backend import default_compile

    monkeypatch.setattr(default_compile, "_warned", False)
    batches = [(torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))) for _ in range(STEPS)]
    reference = _conv_net()
    model = copy.deepcopy(reference).to("opencl")
    eager_model = copy.deepcopy(reference).to("opencl")
    run = torch.compile(model, mode="max-autotune")   # (an Inductor mode: named in the warning, not used)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, eager_model)]
    def train() -> None:
        for x, y in batches:
            for forward, optimizer in zip((run, eager_model), optimizers):
                F.cross_entropy(forward(x.to("opencl")), y.to("opencl")).backward()
                optimizer.step()
                optimizer.zero_grad()

    with pytest.warns(UserWarning, match="compile with backend='tunecl' instead") as caught:
        train()
    messages = [str(w.message) for w in caught if "Inductor" in str(w.message)]
    assert len(messages) == 1 and "max_autotune" in messages[0], messages
    for (name, a), b in zip(model.state_dict().items(), eager_model.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b.cpu(), atol=1e-5, rtol=1e-5, msg=name)
    stats = compile_backend.stats()
    assert stats["captures"] == 2 and stats["replays"] == 2 * (STEPS - 2), stats


def test_the_default_backend_still_compiles_cpu_graphs_with_inductor(monkeypatch):
    import torch._inductor.compile_fx as inductor

    from tunecl.backend import default_compile

    monkeypatch.setattr(default_compile, "_warned", False)
    seen = []
    monkeypatch.setattr(inductor, "compile_fx", lambda model, inputs, **kwargs: seen.append(inputs) or model)
    wrapper = torch._TorchCompileInductorWrapper("default", None, False)
    graph = torch.fx.symbolic_trace(lambda x: x * 2)
    assert wrapper(graph, [torch.ones(3)]) is graph and len(seen) == 1
    ours = []
    monkeypatch.setattr(default_compile, "_tunecl_backend",
                        lambda: lambda model, inputs: ours.append(inputs) or model)
    with pytest.warns(UserWarning, match="backend='tunecl'"):
        assert wrapper(graph, [torch.ones(3, device="opencl")]) is graph
    assert len(seen) == 1 and len(ours) == 1


def test_the_default_backend_says_what_to_do_where_tunecls_is_not_registered(monkeypatch):
    from torch._dynamo.backends import registry

    from tunecl.backend import default_compile

    def missing(name):
        raise registry.InvalidBackend(name)

    monkeypatch.setattr(registry, "lookup_backend", missing)
    monkeypatch.setattr(default_compile, "_warned", False)
    wrapper = torch._TorchCompileInductorWrapper("default", None, False)
    graph = torch.fx.symbolic_trace(lambda x: x * 2)
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="import tunecl.backend.compile"):
        wrapper(graph, [torch.ones(3, device="opencl")])


def test_captures_count_in_memory_stats_and_are_freed_by_a_dynamo_reset():
    import gc

    import tunecl.backend

    gc.collect()   # (graphs of earlier tests that wait for a collection)
    before = torch.opencl.memory_stats()["graph_bytes"]
    run = torch.compile(_mlp().to("opencl"), backend="tunecl")
    x = torch.randn(4, 7, device="opencl")
    for _ in range(3):
        run(x).sum().backward()
    assert torch.opencl.memory_stats()["graph_bytes"] > before
    assert tunecl.backend.stats()["compile"]["captures"] == 2
    del run
    torch._dynamo.reset()
    gc.collect()
    assert torch.opencl.memory_stats()["graph_bytes"] == before


@pytest.mark.parametrize("same_tensor", [False, True], ids=["new tensors", "one tensor"])
def test_an_input_the_compiled_code_writes_holds_the_result_after_every_call(same_tensor):
    """A replay writes the graph's static copy of an input: the caller's tensor gets the result copied
    back (it used to stay as it was from the capture on, silently)."""
    def update(x, y):
        x.add_(y)
        return (x * 2).sum()

    run = torch.compile(update, backend="tunecl")
    kept = torch.zeros(5, device="opencl")
    expected = torch.zeros(5)
    for k in range(STEPS + 1):
        x = kept if same_tensor else torch.full((5,), float(k), device="opencl")
        y = torch.arange(5.0, device="opencl") * (k + 1)
        reference = expected if same_tensor else torch.full((5,), float(k))
        reference += torch.arange(5.0) * (k + 1)
        out = run(x, y)
        torch.testing.assert_close(x.cpu(), reference)
        torch.testing.assert_close(out.cpu(), (reference * 2).sum())
    stats = compile_backend.stats()
    assert stats["replays"] >= STEPS - 2, stats
    assert stats["input_write_backs"] >= stats["replays"], stats   # (x is copied in: it is not a parameter)


@pytest.mark.parametrize("options", [{"capturable": True}, {"foreach": True}], ids=["capturable", "foreach"])
def test_a_compiled_optimizer_step_equals_the_eager_one(options):
    """A capturable Adam keeps its step count on the device: its compiled step replays. A plain one counts
    on the host, which a replay would freeze: that graph runs eagerly."""
    torch.manual_seed(0)
    model = _mlp().to("opencl")
    reference = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, **options)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2, **options)
    step = torch.compile(optimizer.step, backend="tunecl")
    for _ in range(STEPS + 1):
        x = torch.randn(4, 7, device="opencl")
        model(x).square().sum().backward()
        reference(x).square().sum().backward()
        step()
        reference_optimizer.step()
        optimizer.zero_grad()
        reference_optimizer.zero_grad()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=1e-6, rtol=1e-5)
    stats = compile_backend.stats()
    if options.get("capturable"):
        assert stats["replays"] >= STEPS - 2, stats
        assert stats["reinplaced_ops"] >= 5, stats   # parameters, moments and step counts updated in place
    else:
        assert stats.get("eager_graphs", 0) >= 1 and not stats.get("replays"), stats



def _compiled_adam_training(model: nn.Module, batches, compiled: bool, set_to_none: bool) -> nn.Module:
    model = copy.deepcopy(model).to("opencl")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)
    run = torch.compile(model, backend="tunecl") if compiled else model
    step = torch.compile(optimizer.step, backend="tunecl") if compiled else optimizer.step
    for x, y in batches:
        optimizer.zero_grad(set_to_none=set_to_none)
        F.cross_entropy(run(x.to("opencl")), y.to("opencl")).backward()
        step()
    return model


@pytest.mark.parametrize("set_to_none", [True, False], ids=["grads-set-to-none", "grads-zeroed"])
def test_a_compiled_training_step_hands_gradients_to_the_compiled_optimizer_without_copies(set_to_none):
    """The backward hands its gradients out as its own tensors; the compiled Adam step, given them again
    each call, uses them in place. Only the batch and the loss's gradient are copied into the graphs."""
    torch.manual_seed(0)
    batches = [(torch.randn(4, 7), torch.randint(0, 3, (4,))) for _ in range(STEPS + 1)]
    model = _mlp()
    eager = _compiled_adam_training(model, batches, compiled=False, set_to_none=set_to_none)
    compiled = _compiled_adam_training(model, batches, compiled=True, set_to_none=set_to_none)
    for a, b in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=1e-5, rtol=1e-5)
    stats = compile_backend.stats()
    replayed_steps = STEPS + 1 - 2
    assert stats["replays"] == 3 * replayed_steps, stats   # forward, backward, optimizer step
    assert not any(key.startswith("eager") for key in stats), stats
    if set_to_none:   # (zeroed .grad tensors are the user's own, copied into the optimizer's graph)
        assert stats["input_copies"] == 2 * replayed_steps, stats   # the batch and the loss's gradient


def test_gradients_kept_from_autograd_grad_are_not_overwritten_by_later_replays():
    model = _mlp().to("opencl")
    reference = copy.deepcopy(model)
    run = torch.compile(model, backend="tunecl")
    xs = [torch.randn(3, 7, device="opencl") for _ in range(STEPS + 2)]
    kept = [torch.autograd.grad(run(x).square().sum(), list(model.parameters())) for x in xs]
    expected = [torch.autograd.grad(reference(x).square().sum(), list(reference.parameters())) for x in xs]
    for got, want in zip(kept, expected):
        for a, b in zip(got, want):
            torch.testing.assert_close(a.cpu(), b.cpu(), atol=1e-5, rtol=1e-5)
    assert compile_backend.stats()["replays"] >= 2   # (the backward replays again, its gradients copied)


def test_gradients_over_one_storage_accumulate_as_eagerly():
    """Two parameters whose gradient is the same tensor (the loss's gradient itself): each ``.grad`` gets
    storage of its own, and a second backward before ``zero_grad`` adds into both once."""
    class Sum(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p, self.q = nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(3, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.p + self.q

    model = Sum().to("opencl")
    reference = copy.deepcopy(model)
    run = torch.compile(model, backend="tunecl")
    for _ in range(STEPS):
        for _ in range(2):
            x = torch.randn(3, 4, device="opencl")
            run(x).square().sum().backward()
            reference(x).square().sum().backward()
        for a, b in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(a.grad.cpu(), b.grad.cpu(), atol=1e-5, rtol=1e-5)
        model.zero_grad()
        reference.zero_grad()


def _dropped(x: torch.Tensor) -> torch.Tensor:
    return F.dropout(x, 0.3, training=True) * 2


@pytest.mark.parametrize("random", ["host", "device"])
def test_replays_draw_fresh_dropout_masks(random):
    """A replayed step draws new dropout masks each call, at the right keep rate, the backward scaling by
    the mask the forward used. With host draws they are the masks an eager run draws after the same
    ``torch.manual_seed`` (torch's CPU generator at their place in the replay); by default the graph's
    device generator draws them (nothing uploaded)."""
    with config.override(random=random):
        _replays_draw_fresh_dropout_masks(same_as_eager=random == "host")


def _replays_draw_fresh_dropout_masks(same_as_eager: bool):
    run = torch.compile(_dropped, backend="tunecl")
    x = torch.rand(4096) + 0.5
    masks = []
    for seed in range(STEPS + 1):
        given = x.to("opencl").requires_grad_()
        torch.manual_seed(seed)
        out = run(given)
        out.backward(torch.ones_like(out))
        torch.manual_seed(seed)
        expected = _dropped(x.to("opencl")).cpu()
        got, grad = out.detach().cpu(), given.grad.cpu()
        if same_as_eager:
            torch.testing.assert_close(got, expected)
        mask = got != 0
        torch.testing.assert_close(got, x * mask * 2 / 0.7)
        torch.testing.assert_close(grad, mask.float() * 2 / 0.7)
        assert abs(mask.float().mean().item() - 0.7) < 0.03   # 4096 draws: 4.5 standard deviations
        masks.append(mask)
    assert all((a != b).any() for a, b in itertools.pairwise(masks))
    assert compile_backend.stats()["replays"] >= 2 * (STEPS - 1)


@config.override(random="host")
def test_replays_draw_the_bernoulli_numbers_eager_draws():
    def stochastic_depth(x: torch.Tensor) -> torch.Tensor:   # torchvision's: a kept/dropped flag per sample
        return x * torch.empty(x.shape[0], 1, device=x.device).bernoulli_(0.6) / 0.6

    run = torch.compile(stochastic_depth, backend="tunecl")
    x = torch.randn(64, 5, device="opencl")
    for seed in range(STEPS + 1):
        torch.manual_seed(seed)
        got = run(x).cpu()
        torch.manual_seed(seed)
        torch.testing.assert_close(got, stochastic_depth(x).cpu())
    assert compile_backend.stats()["replays"] == STEPS - 1


@config.override(random="host")
def test_a_net_with_dropout_trains_as_it_does_eagerly():
    model = nn.Sequential(nn.Linear(7, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 3))
    batches = [(torch.randn(4, 7), torch.randint(0, 3, (4,))) for _ in range(STEPS)]
    torch.manual_seed(1)
    expected, eager = _train(model, batches, compiled=False, device="opencl")
    torch.manual_seed(1)
    got, compiled = _train(model, batches, compiled=True, device="opencl")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-5, rtol=1e-5)
    for a, b in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), atol=1e-5, rtol=1e-5)
    assert compile_backend.stats()["replays"] == 2 * (STEPS - 2)
