"""Elementwise fusion, a rewrite of the compiled forward, backward and inference graphs.

Each run of pointwise ops whose intermediate values nobody else reads (not another op outside the run,
not a graph output, so not a tensor saved for the backward either) becomes one :class:`FusedChain`: one
kernel of the fused family (:mod:`tunecl.kernels.ops.fused`) that reads the run's inputs once and writes its
last value once, instead of a launch, a store and a load per op. A run is a tree (or a DAG) of ops
ending in one output; its inputs may broadcast (a bias add, a scalar tensor). Only float32 opencl
tensors with static shapes are fused; Python numbers become constants of the kernel.

The ops fused (:data:`OPS`): arithmetic (add, sub, mul, div with their scalar forms, neg), activations
(relu, relu6/hardtanh, clamp, leaky_relu, sigmoid, tanh, silu, gelu, hardswish, hardsigmoid) and their
backward ops (threshold_backward, hardtanh_backward, sigmoid_backward, tanh_backward, silu_backward,
gelu_backward, hardswish_backward, hardsigmoid_backward, leaky_relu_backward), and a few math functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch import nn

from tunecl.backend import memory, state
from tunecl.backend.operands import broadcast_strides
from tunecl.kernels.ops.fused import MAX_INPUTS, MAX_STEPS, Chain, Fused, Step
from tunecl.kernels.strided import MAX_RANK, Operand

aten = torch.ops.aten
Number = bool | int | float
# what a node computes: (pointwise expression, its inputs a, b, c: nodes or numbers, its parameters)
Pointwise = tuple[str, tuple[Any, ...], tuple[Number, ...]]


def _binary(expr: str, alpha: bool = False) -> Callable[..., Pointwise]:
    if alpha:
        return lambda a, b, alpha=1: (expr, (a, b), (alpha,))
    return lambda a, b: (expr, (a, b), ())


def _unary(expr: str) -> Callable[..., Pointwise]:
    return lambda a: (expr, (a,), ())


def _clamp(a: Any, min: Number | None = None, max: Number | None = None) -> Pointwise | None:
    if min is not None and max is not None:
        return "clamp", (a,), (min, max)
    if min is not None:
        return "clamp_min", (a,), (min,)
    if max is not None:
        return "clamp_max", (a,), (max,)
    return None


def _leaky_relu_backward(grad: Any, x: Any, slope: Number, self_is_result: bool) -> Pointwise | None:
    return None if self_is_result else ("leaky_relu_backward", (grad, x), (slope,))


OPS: dict[Any, Callable[..., Pointwise | None]] = {
    aten.add.Tensor: _binary("add", alpha=True),
    aten.add.Scalar: _binary("add", alpha=True),
    aten.sub.Tensor: _binary("sub", alpha=True),
    aten.sub.Scalar: _binary("sub", alpha=True),
    aten.mul.Tensor: _binary("mul"),
    aten.mul.Scalar: _binary("mul"),
    aten.div.Tensor: _binary("div"),
    aten.div.Scalar: _binary("div"),
    aten.neg.default: _unary("neg"),
    aten.exp.default: _unary("exp"),
    aten.sqrt.default: _unary("sqrt"),
    aten.rsqrt.default: _unary("rsqrt"),
    aten.reciprocal.default: _unary("reciprocal"),
    aten.relu.default: _unary("relu"),
    aten.sigmoid.default: _unary("sigmoid"),
    aten.tanh.default: _unary("tanh"),
    aten.silu.default: _unary("silu"),
    aten.hardswish.default: _unary("hardswish"),
    aten.hardsigmoid.default: _unary("hardsigmoid"),
    aten.gelu.default: lambda a, approximate="none": ("gelu_tanh" if approximate == "tanh" else "gelu", (a,), ()),
    aten.hardtanh.default: lambda a, min_val=-1.0, max_val=1.0: ("hardtanh", (a,), (min_val, max_val)),
    aten.clamp.default: _clamp,
    aten.clamp_min.default: lambda a, min: ("clamp_min", (a,), (min,)),
    aten.clamp_max.default: lambda a, max: ("clamp_max", (a,), (max,)),
    aten.leaky_relu.default: lambda a, negative_slope=0.01: ("leaky_relu", (a,), (negative_slope,)),
    aten.threshold_backward.default: lambda g, x, threshold: ("threshold_backward", (g, x), (threshold,)),
    aten.hardtanh_backward.default: lambda g, x, lo, hi: ("hardtanh_backward", (g, x), (lo, hi)),
    aten.sigmoid_backward.default: _binary("sigmoid_backward"),
    aten.tanh_backward.default: _binary("tanh_backward"),
    aten.silu_backward.default: _binary("silu_backward"),
    aten.hardswish_backward.default: _binary("hardswish_backward"),
    aten.hardsigmoid_backward.default: _binary("hardsigmoid_backward"),
    aten.gelu_backward.default: lambda g, x, approximate="none": (
        "gelu_tanh_backward" if approximate == "tanh" else "gelu_backward", (g, x), ()),
    aten.leaky_relu_backward.default: _leaky_relu_backward,
}


def fuse_pointwise(gm: torch.fx.GraphModule) -> list[int]:
    """Replace every fusible run of pointwise ops of ``gm`` (at least two) by a :class:`FusedChain`
    submodule; returns the number of ops of each run fused (``gm`` is recompiled if any)."""
    nodes = list(gm.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    computes = {node: pointwise(node) for node in nodes}
    taken: set[torch.fx.Node] = set()
    runs = []
    for root in reversed(nodes):   # consumers first: each run grows from its output towards its inputs
        if computes[root] is None or root in taken:
            continue
        run = {root}
        grew = True
        while grew and len(run) < MAX_STEPS:
            grew = False
            for member in sorted(run, key=position.__getitem__):
                for producer in _nodes(computes[member][1]):
                    if (producer in run or producer in taken or computes.get(producer) is None
                            or not all(user in run for user in producer.users)):
                        continue
                    if len(run) >= MAX_STEPS or len(_inputs(run | {producer}, computes)) > MAX_INPUTS:
                        continue
                    run.add(producer)
                    grew = True
        if len(run) > 1:
            taken |= run
            runs.append(sorted(run, key=position.__getitem__))
    for k, run in enumerate(runs):
        _replace(gm, f"tunecl_fused_{k}", run, computes, position)
    if runs:
        gm.graph.lint()
        gm.recompile()
    return [len(run) for run in runs]


def pointwise(node: torch.fx.Node) -> Pointwise | None:
    """What ``node`` computes as a pointwise expression, where it can be fused (None: not fusible)."""
    if node.op != "call_function" or node.target not in OPS or not _float32_opencl(node):
        return None
    try:
        computed = OPS[node.target](*node.args, **node.kwargs)
    except TypeError:   # an argument form the table does not know
        return None
    if computed is None:
        return None
    _, inputs, params = computed
    for x in inputs:
        if isinstance(x, torch.fx.Node):
            if not _float32_opencl(x):
                return None
        elif not _is_number(x):
            return None
    if not all(_is_number(p) for p in params):
        return None
    return computed


def _is_number(x: Any) -> bool:
    return isinstance(x, (bool, int, float))


def _float32_opencl(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return (isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.device.type == "opencl"
            and value.dim() <= MAX_RANK and all(isinstance(n, int) for n in value.shape))


def _nodes(values: Sequence[Any]) -> list[torch.fx.Node]:
    return [x for x in values if isinstance(x, torch.fx.Node)]


def _inputs(run: set[torch.fx.Node], computes: dict) -> list[torch.fx.Node]:
    """The nodes a run reads that it does not compute, each once, in the order first read."""
    seen: dict[torch.fx.Node, None] = {}
    for member in run:
        for x in _nodes(computes[member][1]):
            if x not in run:
                seen.setdefault(x)
    return list(seen)


def _replace(gm: torch.fx.GraphModule, name: str, run: list[torch.fx.Node], computes: dict,
             position: dict[torch.fx.Node, int]) -> None:
    inputs = sorted(_inputs(set(run), computes), key=position.__getitem__)
    names = {node: f"v{k}" for k, node in enumerate(inputs)} | {node: f"t{k}" for k, node in enumerate(run)}
    steps = []
    for member in run:
        expr, args, params = computes[member]
        steps.append(Step(expr, tuple(names[a] if isinstance(a, torch.fx.Node) else float(a) for a in args),
                          tuple(float(p) for p in params)))
    root = run[-1]
    value = root.meta["val"]
    gm.add_submodule(name, FusedChain(Chain(len(inputs), tuple(steps)), tuple(value.shape), _dense_stride(value)))
    with gm.graph.inserting_before(root):
        node = gm.graph.call_module(name, tuple(inputs))
    node.meta["val"] = value
    root.replace_all_uses_with(node)
    for member in reversed(run):
        gm.graph.erase_node(member)


def _dense_stride(value: torch.Tensor) -> tuple[int, ...]:
    """The strides eager gives the run's output (the root's), where they are dense; else contiguous."""
    stride = tuple(value.stride())
    order = sorted(range(value.dim()), key=lambda d: stride[d])
    step = 1
    for d in order:
        if value.shape[d] != 1 and stride[d] != step:
            return torch.empty(value.shape, device="meta").stride()
        step *= value.shape[d]
    return stride


_family: list[Fused] = []   # the fused family of the current device (built on first use)


def _fused() -> Fused:
    device = state.get().device
    if not _family or _family[0].device is not device:
        _family[:] = [Fused(device)]
    return _family[0]


class FusedChain(nn.Module):
    """One fused run: ``chain`` over its inputs broadcast to ``shape``, into a new tensor with ``stride``."""

    def __init__(self, chain: Chain, shape: tuple[int, ...], stride: tuple[int, ...]) -> None:
        super().__init__()
        self.chain, self.shape, self.stride = chain, shape, stride

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = torch.empty_strided(self.shape, self.stride, dtype=torch.float32, device=inputs[0].device)
        operands = [Operand(memory.buffer_of(t), t.storage_offset(), broadcast_strides(t.shape, t.stride(), self.shape),
                            "float32") for t in inputs]
        _fused()(self.chain, self.shape, Operand(memory.buffer_of(out), 0, self.stride, "float32"), operands)
        return out

    def extra_repr(self) -> str:
        return " -> ".join(step.op for step in self.chain.steps)
