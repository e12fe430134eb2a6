"""The graph-level rewrites of ``torch.compile(backend="tunecl")``: conv + batch norm folded in inference
graphs, runs of pointwise ops fused into one generated kernel; each equal to eager, counted, and (for
the folds) following weights written between calls."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tiny_nets import tiny_cnn
from training_checks import assert_same_state, sgd_trained_state

compile_backend = pytest.importorskip("tunecl.backend.compile")
from tunecl.backend import fusion, memory, state  # noqa: E402
from tunecl.errors import Unsupported  # noqa: E402
from tunecl.kernels.ops.fused import Chain, Fused, Step  # noqa: E402
from tunecl.kernels.strided import Operand  # noqa: E402

STEPS = 4   # warm-up, capture, then replays
TOL = {"atol": 1e-5, "rtol": 1e-5}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _randomise_batch_norms(model: nn.Module) -> nn.Module:
    """Running statistics and affine parameters away from their initial 0/1 (a fold of those is trivial)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                if module.affine:
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.uniform_(-0.2, 0.2)
    return model


class _Block(nn.Module):
    """A resnet basic block with a downsampling shortcut: conv-bn-relu, conv-bn, + conv-bn, relu."""

    def __init__(self, cin: int, cout: int, affine: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout, affine=affine)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=True)
        self.bn2 = nn.BatchNorm2d(cout, affine=affine)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=2, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.down(x))


def _resnet_like() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), _Block(6, 8),
                         _Block(8, 8, affine=False), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


# -- the fused kernel family -----------------------------------------------------------------------

def _operand(t: torch.Tensor, shape: tuple[int, ...]) -> Operand:
    strides = t.expand(shape).stride()
    return Operand(memory.buffer_of(t), t.storage_offset(), strides, "float32")


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4, 5), (0, 3)], ids=str)
def test_a_fused_chain_equals_its_ops_one_by_one(shape):
    """(a + 2b) -> hardtanh -> * -1.5 -> hardswish -> - c, with b broadcast along the last dim and c a
    non-contiguous view, against float64 CPU torch."""
    torch.manual_seed(0)
    a = torch.randn(shape) * 3
    b = torch.randn(shape[-1:] if shape else ())
    c = torch.randn(tuple(reversed(shape))).permute(*reversed(range(len(shape)))) if shape else torch.randn(())
    out = torch.empty(shape, device="opencl")
    chain = Chain(3, (Step("add", ("v0", "v1"), (2.0,)), Step("hardtanh", ("t0",), (-2.5, 4.0)),
                      Step("mul", ("t1", -1.5), ()), Step("hardswish", ("t2",), ()),
                      Step("sub", ("t3", "v2"), (1.0,))))
    da, db, dc = (t.to("opencl") for t in (a, b, c))
    Fused(state.get().device)(chain, shape, _operand(out, shape), [_operand(t, shape) for t in (da, db, dc)])
    a, b, c = a.double(), b.double(), c.double()
    expected = F.hardswish(torch.clamp(a + 2 * b, -2.5, 4.0) * -1.5) - c
    torch.testing.assert_close(out.cpu().double(), expected, **TOL)


def test_a_chain_with_constants_at_the_float_limits_and_nan_propagation():
    x = torch.tensor([float("nan"), -float("inf"), -1e30, -0.0, 3e-39, 1.0, float("inf")])
    out = torch.empty_like(x, device="opencl")
    chain = Chain(1, (Step("clamp", ("v0",), (-float("inf"), 1e30)), Step("mul", ("t0", -0.1), ())))
    shape = tuple(x.shape)
    Fused(state.get().device)(chain, shape, _operand(out, shape), [_operand(x.to("opencl"), shape)])
    torch.testing.assert_close(out.cpu(), torch.clamp(x, max=1e30) * -0.1, equal_nan=True)


def test_chains_the_kernel_cannot_compute_are_refused_with_a_reason():
    family = Fused(state.get().device)
    x = torch.ones(3, device="opencl")
    one = _operand(x, (3,))
    with pytest.raises(Unsupported, match="not defined before"):
        family(Chain(1, (Step("relu", ("t0",), ()),)), (3,), one, [one])
    with pytest.raises(Unsupported, match="no floating expression"):
        family(Chain(1, (Step("bitwise_and", ("v0", "v0"), ()),)), (3,), one, [one])
    with pytest.raises(Unsupported, match="float32 only"):
        family(Chain(1, (Step("relu", ("v0",), ()),)), (3,), one, [one._replace(dtype="float16")])
    with pytest.raises(ValueError, match="takes 1 inputs"):
        family(Chain(1, (Step("relu", ("v0",), ()),)), (3,), one, [one, one])


# -- elementwise fusion in compiled graphs ---------------------------------------------------------

def test_pointwise_runs_in_an_inference_graph_fuse_and_equal_eager():
    def activations(x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.hardswish(x + bias) * 0.5                 # bias broadcast, then two more ops: one run
        kept = torch.sigmoid(y)                         # returned: it ends a run, and starts none
        z = F.gelu(F.silu(kept) - 1.0) + F.relu6(x.t().t() * 3)
        return kept, torch.tanh(z)

    x = torch.randn(5, 7, device="opencl")
    bias = torch.randn(7, device="opencl")
    run = torch.compile(activations, backend="tunecl")
    with torch.no_grad():
        results = [run(x, bias) for _ in range(STEPS)]
    expected = activations(x.cpu(), bias.cpu())
    for got in results:
        for g, e in zip(got, expected):
            torch.testing.assert_close(g.cpu(), e, **TOL)
    stats = compile_backend.stats()
    assert stats["fused_chains"] == 2, stats
    assert stats["fused_ops"] == 4 + 7, stats      # add hardswish mul sigmoid | silu sub gelu mul hardtanh add tanh
    assert stats["replays"] == STEPS - 2, stats


def test_residual_add_relu_fuses_in_forward_and_backward_and_training_equals_eager():
    torch.manual_seed(0)
    base = nn.Sequential(_Block(3, 4), _Block(4, 4), nn.Flatten(), nn.Linear(4 * 2 * 2, 3))
    batches = [(torch.randn(2, 3, 8, 8), torch.randint(0, 3, (2,))) for _ in range(STEPS)]

    def train(compiled: bool) -> tuple[list[float], nn.Module]:
        model = copy.deepcopy(base).to("opencl")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        run = torch.compile(model, backend="tunecl") if compiled else model
        losses = []
        for x, y in batches:
            loss = F.cross_entropy(run(x.to("opencl")), y.to("opencl"))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses, model

    expected, eager = train(False)
    got, compiled = train(True)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), **TOL)
    for (name, a), b in zip(compiled.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b.cpu(), **TOL, msg=name)
    stats = compile_backend.stats()
    # the blocks' add + relu in the forward; in the backward, the sum of the gradients of a block's two
    # branches feeding the relu's threshold_backward
    assert stats["fused_chains"] >= 3 and stats["fused_ops"] >= 2 * stats["fused_chains"], stats
    fused = {replayed.kind: [m for m in replayed.gm.modules() if isinstance(m, fusion.FusedChain)]
             for replayed in compile_backend._live}
    assert len(fused["forward"]) == 2 and fused["backward"], fused
    assert not stats.get("folded_conv_bn"), stats   # training graphs keep their batch norms
    assert not any(key.startswith("eager") for key in stats), stats


# -- conv + batch norm folding -------------------------------------------------------------------

@pytest.mark.parametrize("factory, pairs", [(tiny_cnn, 2), (_resnet_like, 7)], ids=["tiny_cnn", "resnet_like"])
def test_inference_folds_every_conv_bn_pair_and_equals_eager(factory, pairs):
    torch.manual_seed(0)
    model = _randomise_batch_norms(factory()).to("opencl").eval()
    run = torch.compile(model, backend="tunecl")
    inputs = [torch.randn(3, 3, 9, 9, device="opencl") for _ in range(STEPS)]
    with torch.no_grad():
        results = [run(x) for x in inputs]
        expected = [model(x) for x in inputs]
    for got, want in zip(results, expected):
        torch.testing.assert_close(got.cpu(), want.cpu(), **TOL)
    stats = compile_backend.stats()
    assert stats["folded_conv_bn"] == pairs and stats["replays"] == STEPS - 2, stats
    # every folded convolution here feeds a relu or a residual add: its bias goes into that op's chain
    assert stats["biases_into_chains"] == pairs, stats
    assert "_native_batch_norm" not in str(next(iter(_captured_graph_modules())).code)


def test_a_folded_bias_moved_into_a_chain_reads_the_current_fold_and_stays_without_a_fusible_user():
    """The bias added by the chain is the fold's: a fold after a weight write reaches the replays; a folded
    convolution whose user is not pointwise (a pool) keeps its bias."""
    from tunecl.backend.folding import FoldedConv

    torch.manual_seed(0)
    model = _randomise_batch_norms(nn.Sequential(nn.Conv2d(3, 5, 3), nn.BatchNorm2d(5), nn.ReLU(),
                                                 nn.Conv2d(5, 4, 1, bias=True), nn.BatchNorm2d(4),
                                                 nn.MaxPool2d(2))).to("opencl").eval()
    run = torch.compile(model, backend="tunecl")
    x = torch.randn(2, 3, 9, 9, device="opencl")
    with torch.no_grad():
        for _ in range(STEPS):
            torch.testing.assert_close(run(x).cpu(), model(x).cpu(), **TOL)
        model[1].bias.add_(0.75)   # the first fold's bias, read by the chain
        model[3].bias.sub_(0.5)    # the second's, still inside its convolution
        torch.testing.assert_close(run(x).cpu(), model(x).cpu(), **TOL)
    stats = compile_backend.stats()
    assert stats["folded_conv_bn"] == 2 and stats["biases_into_chains"] == 1, stats
    assert stats["replays"] == STEPS - 1 and not any(key.startswith("eager") for key in stats), stats
    folds = [m for gm in _captured_graph_modules() for m in gm.modules() if isinstance(m, FoldedConv)]
    assert sorted(f.bias_apart for f in folds) == [False, True]


def _captured_graph_modules() -> list[torch.fx.GraphModule]:
    return [replayed.gm for replayed in compile_backend._live]


def test_folded_replays_follow_every_kind_of_weight_write():
    torch.manual_seed(0)
    model = _randomise_batch_norms(_resnet_like()).to("opencl").eval()
    run = torch.compile(model, backend="tunecl")
    x = torch.randn(2, 3, 8, 8, device="opencl")

    def check() -> None:
        with torch.no_grad():
            torch.testing.assert_close(run(x).cpu(), model(x).cpu(), **TOL)

    with torch.no_grad():
        for _ in range(3):
            run(x)
    bn, conv = model[1], model[0]
    with torch.no_grad():
        bn.running_var.mul_(3)              # in place: the version moves
    check()
    conv.weight.data.mul_(-0.5)             # through .data: the version does not, the write is seen
    check()
    other = _randomise_batch_norms(_resnet_like())
    model.load_state_dict(other.state_dict())
    check()
    with torch.no_grad():
        torch.testing.assert_close(run(x).cpu(), other.eval()(x.cpu()), atol=1e-5, rtol=1e-4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)   # fused steps move no version
    model(torch.randn(2, 3, 8, 8, device="opencl")).sum().backward()
    optimizer.step()
    check()
    stats = compile_backend.stats()
    assert stats["replays"] >= 5 and not any(key.startswith("eager") for key in stats), stats


def test_folded_replays_follow_a_compiled_optimizer_step_replayed_in_between():
    """A compiled capturable Adam step replays its kernels: no torch op, no version or write notice; the
    folds see that the step's graph used their weights' buffers."""
    torch.manual_seed(0)
    model = _randomise_batch_norms(tiny_cnn()).to("opencl")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05, capturable=True)
    step = torch.compile(optimizer.step, backend="tunecl")
    infer = torch.compile(model, backend="tunecl")
    x = torch.randn(2, 3, 8, 8, device="opencl")
    for _ in range(STEPS):
        model.train()
        model(torch.randn(2, 3, 8, 8, device="opencl")).square().mean().backward()
        step()
        optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(infer(x).cpu(), model(x).cpu(), **TOL)
    stats = compile_backend.stats()
    assert stats["folded_conv_bn"] == 2 and stats["replays"] >= 2 * (STEPS - 2), stats


def test_eager_evaluation_between_replays_does_not_refold_and_a_training_forward_does():
    """Evaluation batch norm reads its running statistics only; a training forward writes them."""
    from tunecl.backend.folding import FoldedConv

    torch.manual_seed(0)
    model = _randomise_batch_norms(tiny_cnn()).to("opencl").eval()
    run = torch.compile(model, backend="tunecl")
    x = torch.randn(2, 3, 8, 8, device="opencl")

    def folds() -> int:
        return sum(m.folds for gm in _captured_graph_modules() for m in gm.modules() if isinstance(m, FoldedConv))

    with torch.no_grad():
        for _ in range(3):
            run(x)
        before = folds()
        for _ in range(2):
            expected = model(x).cpu()
            torch.testing.assert_close(run(x).cpu(), expected, **TOL)
        assert folds() == before
        model.train()
        model(x)
        model.eval()
        torch.testing.assert_close(run(x).cpu(), model(x).cpu(), **TOL)
        assert folds() > before
    assert compile_backend.stats()["replays"] >= 4


def test_the_rewrites_can_be_switched_off():
    model = tiny_cnn().to("opencl").eval()
    run = torch.compile(model, backend="tunecl", options={"fold_conv_bn": False, "fuse_pointwise": False})
    x = torch.randn(2, 3, 8, 8, device="opencl")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(run(x).cpu(), model(x).cpu(), **TOL)
    stats = compile_backend.stats()
    assert stats["replays"] == 1 and not stats.get("folded_conv_bn") and not stats.get("fused_chains"), stats


def _step_count_graph(read_one: bool, values=(1, 1, 1)) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """x -> x * 2 with increments add_(count_k, values[k]) of int64 inputs (a batch norm's step counts), as a
    compiled forward graph holds them; ``read_one``: the first count is also read."""
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    counts = [graph.placeholder(f"count{k}") for k in range(len(values))]
    doubled = graph.call_function(aten.mul.Tensor, (x, 2))
    for count, value in zip(counts, values):
        graph.call_function(aten.add_.Tensor, (count, value))
    outputs = [doubled] + ([graph.call_function(aten.mul.Tensor, (counts[0], 3))] if read_one else [])
    graph.output(tuple(outputs))
    gm = torch.fx.GraphModule(nn.Module(), graph)
    inputs = [torch.randn(4)] + [torch.tensor(5 * k, dtype=torch.int64) for k in range(len(values))]
    for node, value in zip([n for n in graph.nodes if n.op == "placeholder"], inputs):
        node.meta["val"] = value
    return gm, inputs


@pytest.mark.parametrize("case", ["grouped", "one read elsewhere", "two increments"])
def test_step_count_increments_become_one_foreach_add(case):
    from tunecl.backend.step_counts import group_step_counts

    values = (1, 2, 1, 2) if case == "two increments" else (1, 1, 1)
    gm, inputs = _step_count_graph(case == "one read elsewhere", values)
    expected_inputs = [t.clone() for t in inputs]
    expected = copy.deepcopy(gm)(*expected_inputs)
    grouped = group_step_counts(gm)
    assert grouped == {"grouped": 3, "one read elsewhere": 2, "two increments": 4}[case]
    foreach = [n for n in gm.graph.nodes if n.target is torch.ops.aten._foreach_add_.Scalar]
    assert len(foreach) == (2 if case == "two increments" else 1)
    got = gm(*inputs)
    for a, b in zip([*got, *inputs], [*expected, *expected_inputs]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_compiled_step_counts_its_batch_norms_in_one_launch_and_equals_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4),
                          nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16, 3))
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 3, (2,))
    runs = {compiled: sgd_trained_state(model, x, y, STEPS, compiled=compiled) for compiled in (True, False)}
    assert_same_state(runs[True], runs[False], **TOL)
    assert int(runs[True]["1.num_batches_tracked"]) == STEPS and int(runs[True]["4.num_batches_tracked"]) == STEPS
    assert compile_backend.stats()["grouped_step_counts"] == 2, compile_backend.stats()
