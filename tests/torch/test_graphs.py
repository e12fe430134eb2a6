"""Graphs (tunecl.backend.graphs): a captured block replays exactly what it enqueued, on new inputs copied
into its static tensors, and everything a replay could not repeat fails the capture loudly."""

from __future__ import annotations

import copy
import gc
import threading
import weakref

import numpy as np
import pyopencl as cl
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tunecl.backend import allocator, graphs, memory
from tunecl.profiling import KernelProfile


def small_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))


def capture_training(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """Static device inputs, and a graph of forward + loss + backward captured with no gradients yet."""
    sx, sy = x.to("opencl"), y.to("opencl")
    model.zero_grad(set_to_none=True)
    g = torch.opencl.Graph()
    with torch.opencl.graph(g):
        loss = F.cross_entropy(model(sx), sy)
        loss.backward()
    return g, sx, sy, loss


def capture_optimizer_step(model: nn.Module, opt: torch.optim.Optimizer, sx: torch.Tensor, sy: torch.Tensor,
                           cleanup: list) -> graphs.Graph:
    """One eager step (the optimizer creates its state), then a graph of forward, loss, backward and step."""
    F.cross_entropy(model(sx), sy).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    g = torch.opencl.Graph()
    cleanup.append(g)
    with torch.opencl.graph(g):
        F.cross_entropy(model(sx), sy).backward()
        opt.step()
    return g


@pytest.fixture
def cleanup():
    made: list[graphs.Graph] = []
    yield made
    for g in made:
        g.reset()


def test_training_replays_match_cpu_torch_on_new_inputs(cleanup):
    cpu = small_net()
    model = small_net()
    model.load_state_dict(cpu.state_dict())
    model.to("opencl")
    x, y = torch.randn(4, 3, 10, 9), torch.randint(0, 5, (4,))
    g, sx, sy, loss = capture_training(model, x, y)
    cleanup.append(g)
    F.cross_entropy(cpu(x), y).backward()   # the captured step ran for real: same as an eager one
    for p_dev, p_cpu in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-4)
    for _ in range(2):   # new batches through the same tensors: gradients are rewritten, not accumulated
        x, y = torch.randn(4, 3, 10, 9), torch.randint(0, 5, (4,))
        sx.copy_(x)
        sy.copy_(y)
        g.replay()
        cpu.zero_grad(set_to_none=True)
        expected = F.cross_entropy(cpu(x), y)
        expected.backward()
        torch.testing.assert_close(loss.cpu(), expected.detach(), rtol=1e-4, atol=1e-5)
        for p_dev, p_cpu in zip(model.parameters(), cpu.parameters()):
            torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-4)
    # batch norm's running statistics advanced once per replay, as eagerly
    torch.testing.assert_close(model[1].running_mean.cpu(), cpu[1].running_mean, rtol=1e-4, atol=1e-5)
    assert model[1].num_batches_tracked.item() == cpu[1].num_batches_tracked.item() == 3


def test_replay_is_bitwise_the_eager_step(cleanup):
    model = small_net().to("opencl")
    x, y = torch.randn(3, 3, 12, 12), torch.randint(0, 5, (3,))
    g, sx, sy, loss = capture_training(model, x, y)
    cleanup.append(g)
    sx.copy_(torch.randn(3, 3, 12, 12))
    g.replay()
    replayed = [p.grad.cpu().clone() for p in model.parameters()] + [loss.cpu()]
    model.zero_grad(set_to_none=True)   # (the graph keeps rewriting its own gradient tensors regardless)
    eager_loss = F.cross_entropy(model(sx), sy)
    eager_loss.backward()
    eager = [p.grad.cpu() for p in model.parameters()] + [eager_loss.detach().cpu()]
    for a, b in zip(replayed, eager):
        assert torch.equal(a, b)


def _winograd_pair() -> tuple[nn.Module, torch.Tensor]:
    """Two 3x3 stride-1 convolutions on the device (the kind whose transformed weights the Winograd cache may
    serve) in evaluation, and a device input for them."""
    dev = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1)).eval()
    return dev.to("opencl"), torch.randn(2, 4, 9, 9).to("opencl")


def _winograd_pair_on_cpu(dev: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """:func:`_winograd_pair`'s model with its current weights, run by CPU torch on ``x``."""
    return F.conv2d(F.relu(F.conv2d(x, dev[0].weight.cpu(), dev[0].bias.cpu(), padding=1)),
                    dev[2].weight.cpu(), dev[2].bias.cpu(), padding=1)


def test_inference_capture_sees_weights_updated_between_replays(cleanup):
    dev, sx = _winograd_pair()
    g = torch.opencl.Graph()
    cleanup.append(g)
    with torch.no_grad():
        dev(sx)   # warm-up: the weight cache holds the transforms now
        with torch.opencl.graph(g):
            out = dev(sx)
    # the graph reads the cached transforms, and checks the weights' versions before each replay
    assert len(g._before_replay) == 2
    with KernelProfile() as profile:
        g.replay()
        profile.summary()
    assert profile.commands == g.commands   # nothing changed: nothing transformed again
    x = torch.randn(2, 4, 9, 9)
    with torch.no_grad():
        sx.copy_(x)
        dev[2].weight.mul_(-0.5)   # in place: the replay must read the new values
        with KernelProfile() as profile:
            g.replay()
            names = [row.name for row in profile.summary()]
        # that weight's transform, and not mul_ (deferred before the block: it once counted here when an
        # earlier test had left the device profiling by default; the names say what ran)
        assert profile.commands == g.commands + 1 and "winograd_filter" in names, (profile.commands, g.commands,
                                                                                   names)
        expected = _winograd_pair_on_cpu(dev, x)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_a_transform_made_during_the_capture_is_recorded_and_guarded_by_nothing_else(cleanup):
    """A cached Winograd transform that is stale when the capture reaches it (the weight written after the
    warm-up, as an optimizer step does) is made inside the capture: every replay transforms at that point,
    so no version guard transforms it a second time before the replay."""
    dev, sx = _winograd_pair()
    g = torch.opencl.Graph()
    cleanup.append(g)
    with torch.no_grad():
        dev(sx)                       # warm-up: both transforms cached
        dev[2].weight.mul_(2)         # the second one is stale now
        with torch.opencl.graph(g):
            out = dev(sx)
    assert len(g._before_replay) == 1   # the first weight's guard only
    x = torch.randn(2, 4, 9, 9)
    for scale in (-0.5, 3.0):
        with torch.no_grad():
            sx.copy_(x)
            dev[2].weight.mul_(scale)   # read by the recorded transform of every replay
            with KernelProfile() as profile:
                g.replay()
                profile.summary()
            assert profile.commands == g.commands
            expected = _winograd_pair_on_cpu(dev, x)
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("what", ["to_device", "item", "cpu", "random", "print"])
def test_host_copies_and_random_ops_fail_the_capture_and_leave_nothing_behind(what):
    a = torch.randn(5, 5).to("opencl")
    g = torch.opencl.Graph()
    with pytest.raises(graphs.GraphCaptureError, match="captured in a graph"), torch.opencl.graph(g):
        b = a * 2
        if what == "to_device":
            b + torch.ones(5).to("opencl")
        elif what == "item":
            b.sum().item()
        elif what == "cpu":
            b.cpu()
        elif what == "random":
            b + torch.randn(5, 5, device="opencl")   # drawn on the host (only bernoulli_ has a device draw)
        else:
            str(b)
    assert not graphs.capturing()
    with pytest.raises(graphs.GraphCaptureError, match="nothing to replay"):
        g.replay()
    # pyopencl's functions are back: eager work, a profile and a new capture all work
    torch.testing.assert_close((a + 1).cpu(), a.cpu() + 1)
    with KernelProfile() as profile:
        (a * 3).cpu()
    assert profile.commands >= 1
    with torch.opencl.graph(g):
        c = a * 4
    g.replay()
    torch.testing.assert_close(c.cpu(), a.cpu() * 4)
    g.reset()


def test_work_of_another_context_during_a_capture_runs_and_is_not_recorded(cleanup):
    """A capability probe runs the first time a plan is chosen, which may be inside a capture: it builds,
    launches and reads back in a context of its own, which the capture leaves alone."""
    from tunecl.backend import state

    a = torch.randn(6).to("opencl")
    cl_device = state.get().device.cl_device
    context = cl.Context([cl_device])
    queue = cl.CommandQueue(context, cl_device)
    program = cl.Program(context, "__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }").build()
    host = np.arange(4, dtype=np.float32)
    buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    g = torch.opencl.Graph()
    cleanup.append(g)
    with torch.opencl.graph(g):
        b = a + 1
        program.twice(queue, (4,), None, buffer)
        out = np.empty_like(host)
        cl.enqueue_copy(queue, out, buffer, is_blocking=True)
    np.testing.assert_array_equal(out, host * 2)
    g.replay()
    g.replay()
    check = np.empty_like(host)
    cl.enqueue_copy(queue, check, buffer, is_blocking=True)
    np.testing.assert_array_equal(check, host * 2)   # the replays did not run the other context's kernel
    torch.testing.assert_close(b.cpu(), a.cpu() + 1)


def test_no_capture_inside_a_capture_or_a_profile_and_no_second_capture_without_reset(cleanup):
    a = torch.randn(8).to("opencl")
    outer, inner = torch.opencl.Graph(), torch.opencl.Graph()
    cleanup.extend([outer, inner])
    with pytest.raises(graphs.GraphCaptureError, match="another graph"), torch.opencl.graph(outer):
        a + 1
        with torch.opencl.graph(inner):
            a + 2
    with KernelProfile(), pytest.raises(graphs.GraphCaptureError, match="KernelProfile"):
        torch.opencl.graph(inner).__enter__()
    with torch.opencl.graph(outer):
        b = a + 1
    with pytest.raises(graphs.GraphCaptureError, match="reset"), torch.opencl.graph(outer):
        a + 2
    outer.replay()
    torch.testing.assert_close(b.cpu(), a.cpu() + 1)


def test_a_profile_sees_every_replayed_command(cleanup):
    model = small_net().to("opencl")
    g, *_ = capture_training(model, torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,)))
    cleanup.append(g)
    assert g.commands > 10
    # outside a profile, every launch replays from its preset kernel (arguments set at capture)
    launches = [preset for command, preset in zip(g._commands, g._presets) if command[0]]
    assert launches and all(preset is not None for preset in launches)
    with KernelProfile() as profile:
        g.replay()
        profile.summary()
    assert profile.commands == g.commands


def test_buffers_a_graph_replays_into_never_go_to_other_tensors_until_reset():
    static = torch.randn(64, 64).to("opencl")   # the input stays alive (it must: see the module docstring)
    g = torch.opencl.Graph()
    with torch.opencl.graph(g):
        a = static
        for _ in range(4):    # temporaries that die inside the capture: their buffers belong to the graph
            a = torch.relu(a * 1.5 - 0.25)
        out = a.sum()
    assert g.nbytes > 0 and memory.allocator.stats()["graph_bytes"] >= g.nbytes
    reserved = {id(b) for b in g._buffers}
    # many allocations of the same sizes afterwards: none may get a buffer the graph replays into
    others = [torch.full((64, 64), 7.0, device="opencl") for _ in range(12)]
    assert not {id(memory.buffer_of(t)) for t in others} & reserved
    g.replay()
    for t in others:
        assert torch.equal(t.cpu(), torch.full((64, 64), 7.0))
    expected = out.cpu().clone()
    g.replay()
    torch.testing.assert_close(out.cpu(), expected)
    before, held = memory.allocator.stats()["graph_bytes"], g.nbytes
    g.reset()
    assert memory.allocator.stats()["graph_bytes"] == before - held
    assert not (reserved & set(allocator.graph_buffers))
    with pytest.raises(graphs.GraphCaptureError):
        g.replay()


def _step(model, opt, sx, sy):
    F.cross_entropy(model(sx), sy).backward()
    opt.step()


def _train(model, opt, sx, sy, batches, graph, cleanup, before_each=lambda index: None):
    """A warm-up step (it creates the optimizer's state), one step captured into a graph (``graph``) or run
    eagerly, then a step per batch copied into ``sx``/``sy``: a replay, or an eager step. Returns the
    parameters after each batch."""
    _step(model, opt, sx, sy)
    opt.zero_grad(set_to_none=True)
    if graph:
        g = torch.opencl.Graph()
        cleanup.append(g)
        with torch.opencl.graph(g):
            _step(model, opt, sx, sy)
    else:
        _step(model, opt, sx, sy)
    snapshots = []
    for index, (bx, by) in enumerate(batches):
        before_each(index)
        sx.copy_(bx)
        sy.copy_(by)
        if graph:
            g.replay()
        else:
            opt.zero_grad(set_to_none=True)
            _step(model, opt, sx, sy)
        snapshots.append([p.detach().cpu() for p in model.parameters()])
    return snapshots


def test_a_fused_adam_step_in_the_graph_replays_exactly_as_eager_steps(cleanup):
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))) for _ in range(3)]
    eager_model = small_net().to("opencl")
    graph_model = small_net().to("opencl")
    graph_model.load_state_dict(eager_model.state_dict())
    results, steps = {}, {}
    for name, model in (("eager", eager_model), ("graph", graph_model)):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
        results[name] = _train(model, opt, x.to("opencl"), y.to("opencl"), batches, name == "graph", cleanup)[-1]
        steps[name] = [opt.state[p]["step"].item() for p in model.parameters()]
    assert steps["graph"] == steps["eager"] == [5.0] * len(steps["eager"])
    for a, b in zip(results["graph"], results["eager"]):
        assert torch.equal(a, b)


def test_a_learning_rate_tensor_set_between_replays_takes_effect(cleanup):
    """Fused Adam and SGD with the learning rate in a device tensor: each replay reads its current value, so
    a scheduler can update it between replays; replayed steps equal eager steps with the same rates."""
    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))) for _ in range(3)]
    rates = [0.02, 0.005, 0.0]   # the last: a replay at lr 0 leaves the parameters as they are
    for make in (lambda p, lr: torch.optim.Adam(p, lr=lr, fused=True),
                 lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, fused=True)):
        results = {}
        for name in ("eager", "graph"):
            torch.manual_seed(0)
            model = small_net().to("opencl")
            lr = torch.tensor(0.01, device="opencl")
            sx, sy = batches[0][0].to("opencl"), batches[0][1].to("opencl")
            results[name] = _train(model, make(model.parameters(), lr), sx, sy, batches, name == "graph", cleanup,
                                   before_each=lambda index, lr=lr: lr.fill_(rates[index]))
            assert all(torch.equal(a, b) for a, b in zip(results[name][-2], results[name][-1]))   # lr 0
        for eager, graph in zip(results["eager"], results["graph"]):
            assert all(torch.equal(a, b) for a, b in zip(eager, graph))


def test_a_cpu_learning_rate_tensor_fails_the_capture():
    model = small_net().to("opencl")
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01), fused=True)
    sx, sy = torch.randn(2, 3, 8, 8).to("opencl"), torch.randint(0, 5, (2,)).to("opencl")
    F.cross_entropy(model(sx), sy).backward()
    opt.step()
    with pytest.raises(graphs.GraphCaptureError, match="learning-rate"), torch.opencl.graph(torch.opencl.Graph()):
        F.cross_entropy(model(sx), sy).backward()
        opt.step()


@pytest.mark.parametrize("case", ["host_step_count", "no_warm_up"])
def test_optimizer_steps_a_replay_would_get_wrong_fail_the_capture(case):
    model = small_net().to("opencl")
    opt = torch.optim.Adam(model.parameters(), fused=case == "no_warm_up")
    sx, sy = torch.randn(2, 3, 8, 8).to("opencl"), torch.randint(0, 5, (2,)).to("opencl")
    if case == "host_step_count":
        F.cross_entropy(model(sx), sy).backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    g = torch.opencl.Graph()
    match = "capturable=False" if case == "host_step_count" else "run a step before capturing"
    with pytest.raises(graphs.GraphCaptureError, match=match), torch.opencl.graph(g):
        F.cross_entropy(model(sx), sy).backward()
        opt.step()
    assert g.commands == 0 and not graphs.capturing()
    # SGD without momentum keeps no state at all: it may be captured at once; with momentum, after a step
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad(set_to_none=True)
    with torch.opencl.graph(g):
        F.cross_entropy(model(sx), sy).backward()
        sgd.step()
    g.reset()
    momentum = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(graphs.GraphCaptureError, match="run a step before capturing"), torch.opencl.graph(g):
        momentum.step()
    momentum.step()
    with torch.opencl.graph(g):
        momentum.step()
    g.reset()


def test_a_capturable_adam_step_in_the_graph_matches_cpu_adam(cleanup, fresh_stats):
    cpu = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    dev = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    dev.load_state_dict(cpu.state_dict())
    dev.to("opencl")
    cpu_opt = torch.optim.Adam(cpu.parameters(), lr=1e-2)
    dev_opt = torch.optim.Adam(dev.parameters(), lr=1e-2, capturable=True)   # step counts on the device
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    sx, sy = x.to("opencl"), y.to("opencl")
    F.cross_entropy(cpu(x), y).backward()
    cpu_opt.step()
    g = capture_optimizer_step(dev, dev_opt, sx, sy, cleanup)
    assert not fresh_stats()["fallback_ops"]
    for step in range(4):   # the captured step (which ran), then three replays
        if step:
            g.replay()
        cpu_opt.zero_grad()
        F.cross_entropy(cpu(x), y).backward()
        cpu_opt.step()
    for p_dev, p_cpu in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("net", ["resnet18", "mobilenet_v2", "squeezenet1_0", "densenet121"])
def test_inference_graphs_of_torchvision_nets_replay_their_eager_forward_on_new_inputs(net, cleanup, strict):
    torchvision = pytest.importorskip("torchvision")
    model = getattr(torchvision.models, net)(num_classes=10).eval().to("opencl")
    static = torch.randn(1, 3, 48, 48).to("opencl")
    with torch.no_grad():
        model(static)   # warm-up: plans and kernels
        g = torch.opencl.Graph()
        cleanup.append(g)
        with torch.opencl.graph(g):
            out = model(static)
        for _ in range(2):
            static.copy_(torch.randn(1, 3, 48, 48))
            g.replay()
            assert torch.equal(out.cpu(), model(static).cpu())


def test_a_resnet18_training_step_replays_as_its_eager_step(cleanup, strict):
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=10).to("opencl")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sx, sy = torch.randn(2, 3, 32, 32).to("opencl"), torch.randint(0, 10, (2,)).to("opencl")
    g = capture_optimizer_step(model, opt, sx, sy, cleanup)   # (momentum buffers made before the capture)
    twin = torchvision.models.resnet18(num_classes=10).to("opencl")
    twin.load_state_dict(model.state_dict())
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))   # (loading alone would share the buffers)
    for _ in range(2):
        x = torch.randn(2, 3, 32, 32)
        sx.copy_(x)
        g.replay()
        twin_opt.zero_grad(set_to_none=True)
        F.cross_entropy(twin(x.to("opencl")), sy).backward()
        twin_opt.step()
    for a, b in zip(model.state_dict().values(), twin.state_dict().values()):
        assert torch.equal(a.cpu(), b.cpu())


def test_dropout_in_a_graph_draws_new_masks_on_the_device_at_every_replay(cleanup, strict):
    x = torch.ones(200_000).to("opencl")
    g = torch.opencl.Graph()
    cleanup.append(g)
    with torch.opencl.graph(g):
        y = F.dropout(x, 0.3, training=True)
        z = torch.empty(200_000, device="opencl").bernoulli_(0.25)   # stochastic depth's draw
        b = torch.empty(1000, dtype=torch.bool, device="opencl").bernoulli_(0.5)
    # each draw and its counter's advance; dropout's mask drawn as bool, then applied: no conversion between
    names = [command[1].function_name for command in g._commands]
    assert names == ["bernoulli_u8", "advance", "pointwise", "bernoulli_f32", "advance", "bernoulli_u8",
                     "advance"], names
    masks = []
    for replay in range(3):
        if replay:
            g.replay()
        out = y.cpu()
        kept = out != 0
        torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.7))
        assert abs(kept.float().mean().item() - 0.7) < 0.01   # ~10 standard deviations
        assert abs(z.cpu().mean().item() - 0.25) < 0.01
        assert 350 < b.cpu().sum().item() < 650   # ~10 standard deviations
        masks.append(kept)
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    # the draw is keyed from torch's generator at capture: the same seed, the same masks
    first = []
    for _ in range(2):
        torch.manual_seed(7)
        h = torch.opencl.Graph()
        cleanup.append(h)
        with torch.opencl.graph(h):
            w = F.dropout(x, 0.5, training=True)
        h.replay()
        first.append(w.cpu())
    assert torch.equal(first[0], first[1])


def test_a_mobilenet_v2_training_step_with_dropout_replays(cleanup, strict):
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.mobilenet_v2(num_classes=10).to("opencl")   # Dropout before its classifier
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # (at 32x32 and batch 2 its last batch norms see two values per channel: the step is not finite, eagerly
    # either)
    sx, sy = torch.randn(4, 3, 64, 64).to("opencl"), torch.randint(0, 10, (4,)).to("opencl")
    g = capture_optimizer_step(model, opt, sx, sy, cleanup)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    g.replay()
    after = [p.detach().cpu() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    assert all(torch.isfinite(a).all() for a in after)


def test_a_replay_submits_its_commands_every_few_as_the_queue_does(cleanup, monkeypatch):
    from tunecl.backend import state

    device = state.get().device
    monkeypatch.setattr(device, "flush_every", 4)   # (a GPU's setting; 0 on CPU devices)
    a = torch.randn(32).to("opencl")
    g = torch.opencl.Graph()
    cleanup.append(g)
    with torch.opencl.graph(g):
        b = a
        for _ in range(10):
            b = b * 1.5
    flushes = []
    real = cl.CommandQueue.flush
    monkeypatch.setattr(cl.CommandQueue, "flush", lambda q: flushes.append(q) or real(q))
    g.replay()
    # every 4 commands and once at the end (plus, maybe, the queue's own count reaching 4 as it is taken)
    assert g.commands // 4 + 1 <= len(flushes) <= g.commands // 4 + 2
    torch.testing.assert_close(b.cpu(), a.cpu() * 1.5 ** 10)


class _FailingLock:
    """The allocator's lock, raising instead of waiting forever: a deadlock becomes a failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        if not self._lock.acquire(timeout=5):
            raise RuntimeError("the allocator's lock was not free after 5 s (a deadlock)")

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_graph_collected_inside_an_allocation_is_released_without_deadlock(monkeypatch):
    """A captured graph in a reference cycle is finalized by whatever garbage collection comes next, possibly
    one inside an allocation, while the allocator's lock is held (making a DLPack slot allocates). Its
    release must not wait for that lock: it did, and a test run hung there. It is released at the
    allocator's next use instead."""
    monkeypatch.setattr(memory.allocator, "_lock", _FailingLock())
    gc.collect()   # earlier tests' unreachable graphs go now (and are released by the next call), not below
    memory.allocator.stats()
    static = torch.randn(16, 16).to("opencl")
    g = torch.opencl.Graph()
    with torch.opencl.graph(g):
        torch.relu(static * 2.0 - 1.0).sum()
    before, held = memory.allocator.stats()["graph_bytes"], g.nbytes
    assert held > 0
    g.cycle = g   # only the cyclic collector frees it now
    collected = weakref.ref(g)
    del g
    real_slot = allocator.Slot

    def slot_after_a_collection(ndim: int):
        gc.collect()   # a collection right here, inside allocate's locked section
        return real_slot(ndim)

    monkeypatch.setattr(allocator, "Slot", slot_after_a_collection)
    monkeypatch.setitem(memory.allocator._free_large_slots, 11, [])   # so an 11-d tensor makes a new slot
    t = torch.empty((1,) * 11, device="opencl")
    assert collected() is None and t.dim() == 11
    assert memory.allocator.stats()["graph_bytes"] == before - held
