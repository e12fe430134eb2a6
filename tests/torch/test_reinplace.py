"""The reinplace rewrite of compiled graphs (:mod:`tunecl.backend.reinplace`): functional ops whose results
go back into a mutated input run in place where that is sound, and stay functional where it is not; a
rewritten graph computes what the functional one did."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
from torch import nn

compile_backend = pytest.importorskip("tunecl.backend.compile")
from tunecl.backend.reinplace import activations_in_place, drop_clones, reinplace_input_mutations  # noqa: E402
from training_checks import assert_same_parameters_and_state, assert_same_state, sgd_trained_state  # noqa: E402

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class _Record(torch.fx.Interpreter):
    """Runs a graph and keeps each node's value in its ``val``, as AOT's graphs carry them."""

    def run_node(self, node: torch.fx.Node):
        result = super().run_node(node)
        node.meta["val"] = result
        return result


def _graph(build, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    """A graph module over placeholders for ``inputs`` that ``build(graph, *placeholders)`` fills (returning
    the output values), with every node's ``val`` filled in from a run on clones of ``inputs``."""
    graph = torch.fx.Graph()
    placeholders = [graph.placeholder(f"x{k}") for k in range(len(inputs))]
    graph.output(tuple(build(graph, *placeholders)))
    gm = torch.fx.GraphModule(nn.Module(), graph)
    _Record(gm).run(*[t.clone() for t in inputs])
    return gm


def _check_rewrite(build, inputs: list[torch.Tensor], expected_made: int) -> torch.fx.GraphModule:
    """Rewrite the graph, then run it and the functional one on copies of ``inputs``: same results and the
    same values left in the inputs."""
    functional = _graph(build, *inputs)
    rewritten = copy.deepcopy(functional)
    assert reinplace_input_mutations(rewritten, list(inputs)) == expected_made
    left, right = [t.clone() for t in inputs], [t.clone() for t in inputs]
    for a, b in zip(functional(*left), rewritten(*right)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    for a, b in zip(left, right):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    return rewritten


def _targets(gm: torch.fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_an_update_copied_back_into_its_input_runs_in_place_and_the_copy_goes():
    def build(g, a, b):
        new = g.call_function(aten.mul.Tensor, (a, b))
        total = g.call_function(aten.sum.default, (new,))   # a later reader of the new value reads the input
        g.call_function(aten.copy_.default, (a, new))
        return [total]

    gm = _check_rewrite(build, [torch.randn(3, 4), torch.randn(3, 4)], 1)
    assert _targets(gm) == [aten.mul_.Tensor, aten.sum.default]


def test_a_foreach_chain_runs_in_place_through_its_intermediate():
    def build(g, a, b, grad):
        scaled = g.call_function(aten._foreach_mul.Scalar, ([a, b], 0.5))
        parts = [g.call_function(operator.getitem, (scaled, k)) for k in range(2)]
        summed = g.call_function(aten._foreach_addcmul.Scalar, (parts, [grad, grad], [grad, grad], 0.1))
        new = [g.call_function(operator.getitem, (summed, k)) for k in range(2)]
        g.call_function(aten.copy_.default, (a, new[0]))
        g.call_function(aten.copy_.default, (b, new[1]))
        return []

    gm = _check_rewrite(build, [torch.randn(5), torch.randn(5), torch.randn(5)], 2)
    assert _targets(gm) == [aten._foreach_mul_.Scalar, aten._foreach_addcmul_.Scalar]


@pytest.mark.parametrize("case", ["old value read after", "operand is the input", "result is an output",
                                  "input not written back", "dtype changes",
                                  "final value written already"])
def test_an_op_stays_functional_where_in_place_would_change_results(case):
    def build(g, a, b):
        other = a if case == "operand is the input" else b
        new = g.call_function(aten.add.Tensor, (a, other))
        outputs = [new] if case == "result is an output" else []
        if case == "old value read after":
            outputs.append(g.call_function(aten.sum.default, (a,)))
        if case == "final value written already":   # a's final value is made in place, then read
            root = g.call_function(aten.sqrt.default, (new,))
            outputs.append(g.call_function(aten.sum.default, (root,)))
        if case != "input not written back":
            g.call_function(aten.copy_.default, (a, new))
        return outputs

    a = torch.randn(4).half() if case == "dtype changes" else torch.randn(4)
    gm = _check_rewrite(build, [a, torch.randn(4)], 1 if case == "final value written already" else 0)
    assert aten.sqrt_.default not in _targets(gm)


def test_inputs_sharing_storage_are_left_functional():
    def build(g, a, b):
        new = g.call_function(aten.mul.Tensor, (a, 2.0))
        g.call_function(aten.copy_.default, (a, new))
        return [g.call_function(aten.sum.default, (b,))]

    base = torch.randn(8)
    gm = _graph(build, base[:4], base[4:])   # two views of one storage
    assert reinplace_input_mutations(gm, [base[:4], base[4:]]) == 0


def _batch_norm(g, x, w, b, mean, var, training=True):
    """A training batch norm as AOT hands it over: the functional op and its five results."""
    node = g.call_function(aten._native_batch_norm_legit_functional.default, (x, w, b, mean, var, training, 0.1, 1e-5))
    return [g.call_function(operator.getitem, (node, k)) for k in range(5)]


def _batch_norm_inputs() -> list[torch.Tensor]:
    return [torch.randn(2, 3, 4, 5), torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5]


@pytest.mark.parametrize("case", ["in place", "evaluation", "old mean read after", "mean not written back"])
def test_a_batch_norm_updates_its_running_statistics_in_place(case):
    # the functional op clones both statistics and the graph copies both back: four copies a layer
    def build(g, x, w, b, mean, var):
        y, saved_mean, saved_rstd, new_mean, new_var = _batch_norm(g, x, w, b, mean, var, case != "evaluation")
        if case != "mean not written back":
            g.call_function(aten.copy_.default, (mean, new_mean))
        g.call_function(aten.copy_.default, (var, new_var))
        later = [g.call_function(aten.sum.default, (mean,))] if case == "old mean read after" else []
        return [y, saved_mean, saved_rstd, new_mean, new_var, *later]   # (the new statistics: saved, as AOT does)

    gm = _check_rewrite(build, _batch_norm_inputs(), 1 if case == "in place" else 0)
    if case == "in place":
        assert _targets(gm) == [aten._native_batch_norm_legit.default] + [operator.getitem] * 3
    else:
        assert aten._native_batch_norm_legit_functional.default in _targets(gm)


@pytest.mark.parametrize("case", ["relu", "relu6", "read elsewhere", "hardtanh(-1, 1)", "not a batch norm"])
def test_an_activation_of_a_batch_norm_output_runs_in_place(case):
    def build(g, x, w, b, mean, var):
        y = _batch_norm(g, x, w, b, mean, var)[0]
        source = g.call_function(aten.neg.default, (x,)) if case == "not a batch norm" else y
        if case == "relu6":
            out = g.call_function(aten.hardtanh.default, (source, 0.0, 6.0))
        elif case == "hardtanh(-1, 1)":
            out = g.call_function(aten.hardtanh.default, (source, -1.0, 1.0))
        else:
            out = g.call_function(aten.relu.default, (source,))
        return [out, y] if case == "read elsewhere" else [out]

    functional = _graph(build, *_batch_norm_inputs())
    rewritten = copy.deepcopy(functional)
    made = activations_in_place(rewritten)
    assert made == (1 if case in ("relu", "relu6") else 0)
    if made:
        assert {aten.relu_.default, aten.hardtanh_.default} & set(_targets(rewritten))
    inputs = _batch_norm_inputs()
    for a, b in zip(functional(*[t.clone() for t in inputs]), rewritten(*[t.clone() for t in inputs])):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("case", ["dropped", "of an input", "through a view", "written after", "other layout"])
def test_a_clone_of_a_value_nothing_writes_is_dropped(case):
    def build(g, x):
        y = x if case == "of an input" else g.call_function(aten.mul.Tensor, (x, 2.0))
        kwargs = {"memory_format": torch.channels_last} if case == "other layout" else {}
        copy_ = g.call_function(aten.clone.default, (y,), kwargs)
        out = g.call_function(aten.relu.default, (y,))
        if case == "through a view":
            g.call_function(aten.add_.Tensor, (g.call_function(aten.view.default, (y, [-1])), 1.0))
        if case == "written after":
            g.call_function(aten.mul_.Tensor, (y, 3.0))
        return [copy_, out]

    functional = _graph(build, torch.randn(2, 3, 4, 5))
    rewritten = copy.deepcopy(functional)
    assert drop_clones(rewritten) == (1 if case == "dropped" else 0)
    inputs = torch.randn(2, 3, 4, 5)
    for a, b in zip(functional(inputs.clone()), rewritten(inputs.clone())):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_compiled_relu6_in_place_block_copies_no_activations_and_trains_as_eagerly():
    """``ReLU6(inplace=True)`` after a batch norm (mobilenet_v2's blocks) reaches the forward graph as a clone
    kept for the backward and a functional hardtanh: the clone goes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU6(inplace=True), nn.Conv2d(4, 4, 3),
                          nn.BatchNorm2d(4), nn.ReLU6(inplace=True), nn.Flatten(), nn.Linear(4 * 16, 3))
    x, y = torch.randn(2, 3, 8, 8) * 4, torch.randint(0, 3, (2,))
    assert_same_state(sgd_trained_state(model, x, y, 4), sgd_trained_state(model, x, y, 4, compiled=False))
    stats = compile_backend.stats()   # (and the relu6 backward read through by the batch norm's)
    assert stats["dropped_clones"] == 2 and stats["fused_norm_backward"] == 2, stats


def test_a_compiled_conv_bn_relu_step_copies_nothing_and_trains_as_eagerly():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 3))
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 3, (2,))
    eager = sgd_trained_state(model, x, y, 4, compiled=False)
    commands = {}
    for reinplace in (True, False):
        compile_backend.reset_stats()
        torch._dynamo.reset()
        assert_same_state(sgd_trained_state(model, x, y, 4, {"reinplace": reinplace}), eager)
        stats = compile_backend.stats()
        commands[reinplace] = stats["captured_commands"]
        if reinplace:   # the batch norm and its step count in place, the relu inside its launch
            assert stats["reinplaced_ops"] >= 2 and stats["in_place_activations"] == 1, stats
        assert stats["fused_norm_backward"] == 1, stats   # the relu's backward read through by the norm's
    # no clone of the statistics, no copy back, no relu launch of its own (the count includes the backward's)
    assert commands[True] <= commands[False] - 4, commands


@pytest.mark.parametrize("reinplace", [True, False], ids=["in place", "copied back"])
def test_a_compiled_adam_step_updates_its_state_in_place_and_equals_eager(reinplace):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3)).to("opencl")
    reference = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2, capturable=True)
    step = torch.compile(optimizer.step, backend="tunecl", options={"reinplace": reinplace})
    for _ in range(4):
        x = torch.randn(4, 7, device="opencl")
        for m in (model, reference):
            m(x).square().sum().backward()
        step()
        reference_optimizer.step()
        optimizer.zero_grad()
        reference_optimizer.zero_grad()
    assert_same_parameters_and_state(model, optimizer, reference, reference_optimizer)
    stats = compile_backend.stats()
    if reinplace:   # the step counts' add, the moments' lerp, mul and addcmul, the parameters' addcdiv
        assert stats["reinplaced_ops"] >= 5 and not stats.get("grouped_copy_backs"), stats
    else:   # 4 parameters, their moments and step counts written back in grouped copies
        assert not stats.get("reinplaced_ops") and stats["grouped_copy_backs"] >= 4 * 4, stats
    assert stats["replays"] >= 2, stats
