"""Runs of ``_foreach_*`` ops in compiled graphs as one multi-tensor kernel (:mod:`tunecl.backend.foreach_fusion`,
``optim.cl``'s ``foreach_chain``): compiled optimizer steps equal eager ones in fewer launches, the kernel
against CPU torch on odd sizes, and the runs the rewrite must leave alone."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

compile_backend = pytest.importorskip("tunecl.backend.compile")
from tunecl.backend import foreach_fusion, memory, state  # noqa: E402
from tunecl.kernels.ops.fused import Chain, Step  # noqa: E402
from training_checks import assert_same_parameters_and_state  # noqa: E402

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 1), nn.Flatten(0))


OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, capturable=True, foreach=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, capturable=True, foreach=True),
    "adam amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, capturable=True, foreach=True),
    "sgd momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, foreach=True),
}


def _train(optimizer_name: str, options: dict | None) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = _model().to("opencl")
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    step = optimizer.step if options is None else torch.compile(optimizer.step, backend="tunecl", options=options)
    torch.manual_seed(1)
    for _ in range(5):
        model(torch.randn(4, 7).to("opencl")).square().sum().backward()
        step()
        optimizer.zero_grad()
    return model, optimizer


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_compiled_foreach_step_runs_as_one_kernel_and_equals_eager(name):
    eager_model, eager_optimizer = _train(name, None)
    model, optimizer = _train(name, {})
    stats = compile_backend.stats()
    assert stats["fused_foreach_runs"] >= 1 and stats["fused_foreach_ops"] >= 3 and stats["replays"] >= 2, stats
    fused_commands = stats["captured_commands"]
    assert_same_parameters_and_state(model, optimizer, eager_model, eager_optimizer)
    torch._dynamo.reset()
    compile_backend.reset_stats()
    _train(name, {"fuse_foreach": False})
    unfused = compile_backend.stats()
    assert not unfused.get("fused_foreach_runs") and unfused["captured_commands"] > fused_commands, unfused


def _columns(*lists):
    return [[(memory.buffer_of(t), t.storage_offset()) for t in column] for column in lists]


def test_the_chain_kernel_against_cpu_torch_on_odd_sizes_and_one_element_columns():
    shapes = [(5,), (0,), (300,), (1,), (17, 3), (4097,)] * 4   # more tensors than a launch's slots
    torch.manual_seed(0)
    a = [torch.randn(s) for s in shapes]
    b = [torch.randn(s) for s in shapes]
    steps = [torch.tensor(float(k + 1)) for k in range(len(shapes))]
    da, db, dsteps = ([t.to("opencl") for t in column] for column in (a, b, steps))
    # a = a * 0.9 ** step + 2 * sqrt(|b|); b = b / (1 - 0.9 ** step)
    chain = Chain(3, (Step("pow", (0.9, "v2"), ()), Step("mul", ("v0", "t0"), ()), Step("abs", ("v1",), ()),
                      Step("sqrt", ("t2",), ()), Step("add", ("t1", "t3"), (2.0,)), Step("sub", (1.0, "t0"), (1.0,)),
                      Step("div", ("v1", "t5"), ())))
    state.get().optim.chain(chain, (False, False, True), [(0, 4), (1, 6)], _columns(da, db, dsteps),
                            [t.numel() for t in a])
    for x, y, s, got_a, got_b in zip(a, b, steps, da, db):
        torch.testing.assert_close(got_a.cpu(), x * 0.9 ** s + 2 * y.abs().sqrt())
        torch.testing.assert_close(got_b.cpu(), y / (1 - 0.9 ** s))


def _graph(build, inputs):
    graph = torch.fx.Graph()
    placeholders = [graph.placeholder(f"x{k}") for k in range(len(inputs))]
    graph.output(tuple(build(graph, *placeholders)))
    gm = torch.fx.GraphModule(nn.Module(), graph)
    for node, value in zip(placeholders, inputs):
        node.meta["val"] = value
    return gm


def _list(g, node, count):
    return [g.call_function(operator.getitem, (node, k)) for k in range(count)]


def test_a_run_whose_intermediate_is_read_outside_stays_as_it_is():
    a, b = torch.randn(3).to("opencl"), torch.randn(4).to("opencl")

    def build(g, x, y):
        doubled = _list(g, g.call_function(aten._foreach_mul.Scalar, ([x, y], 2.0)), 2)
        g.call_function(aten._foreach_add_.List, ([x, y], doubled))
        return [g.call_function(aten.sum.default, (doubled[0],))]   # read outside the run

    gm = _graph(build, [a, b])
    assert foreach_fusion.fuse_foreach(gm) == []


def test_a_run_writing_a_one_element_column_or_reading_a_written_tensor_elsewhere_is_not_fused():
    steps = [torch.tensor(1.0).to("opencl"), torch.tensor(2.0).to("opencl")]
    params = [torch.randn(3).to("opencl"), torch.randn(4).to("opencl")]

    def build_steps(g, s0, s1, p0, p1):   # the step counts' own add_ cannot join (every element reads them)
        g.call_function(aten._foreach_add_.Scalar, ([s0, s1], 1.0))
        g.call_function(aten._foreach_mul_.Scalar, ([p0, p1], 0.5))
        return []

    assert foreach_fusion.fuse_foreach(_graph(build_steps, [*steps, *params])) == []

    def build_crossed(g, s0, s1, p0, p1):   # p0 written through one list, read through another
        g.call_function(aten._foreach_mul_.Scalar, ([p0, p1], 0.5))
        g.call_function(aten._foreach_add_.List, ([s0, s1], [p0, p0]))
        return []

    shaped = [torch.randn(3).to("opencl"), torch.randn(3).to("opencl")]
    assert foreach_fusion.fuse_foreach(_graph(build_crossed, [*shaped, params[0], torch.randn(3).to("opencl")])) \
        == []


def test_foreach_calls_over_empty_lists_are_left_alone():
    def build(g):
        g.call_function(aten._foreach_pow.ScalarAndTensor, (0.9, []))
        g.call_function(aten._foreach_mul_.Scalar, ([], 0.5))
        return []

    assert foreach_fusion.fuse_foreach(_graph(build, [])) == []


def test_a_fused_run_given_tensors_it_cannot_take_runs_the_original_ops():
    x = [torch.randn(6).to("opencl"), torch.randn(6).to("opencl")]

    def build(g, a, b):
        halves = _list(g, g.call_function(aten._foreach_mul.Scalar, ([a, b], 0.5)), 2)
        g.call_function(aten._foreach_add_.List, ([a, b], halves))
        return []

    gm = _graph(build, x)
    assert foreach_fusion.fuse_foreach(gm) == [2]
    strided = [torch.randn(12).to("opencl")[::2], torch.randn(12).to("opencl")[::2]]   # not contiguous
    expected = [t.cpu() * 1.5 for t in strided]
    gm(*strided)
    for got, want in zip(strided, expected):
        torch.testing.assert_close(got.cpu(), want)
