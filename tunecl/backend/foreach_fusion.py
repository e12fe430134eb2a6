"""A rewrite of the compiled graphs: runs of ``_foreach_*`` ops as one multi-tensor kernel.

A compiled foreach optimizer step is a run of ``_foreach_*`` ops over the same n tensors (Adam: the moments'
``lerp_``, ``mul_`` and ``addcmul_``, the bias corrections from the step counts, ``sqrt``, ``div``, ``add``,
the parameters' ``addcdiv_``): each op is a launch per ``Optim.slots`` tensors with a pointer per tensor
and operand, and each intermediate list is stored and loaded again. Here each run of two or more such ops
becomes one :class:`ForeachChain`: ``optim.cl``'s ``foreach_chain`` computes, for every tensor index k and
element i, the ops' pointwise expressions in order with the values in registers, and stores only what the
run writes in place. Where a call finds its tensors not as the graph promised, it runs the original ops.

A run joins consecutive ops (and their results' ``getitem``) while each op:

- is a functional or in-place ``_foreach_*`` overload of the multi-tensor path (:data:`OVERLOADS`, or
  ``pow.ScalarAndTensor``) whose numbers (Scalars, ScalarLists) are one value for every tensor;
- takes tensor lists of the run's length that are each the result of an earlier op of the run or a list of
  float32 opencl tensors from outside it (a *column*, at most 8): contiguous, of the run's shape at each
  index, or 0-dim (read for every element);
- if in place, writes a column of full tensors (not 0-dim: every work-item reads such a tensor, so one
  written in the same launch would race) or an earlier result.

A run is replaced only when nothing outside it reads a result computed inside it, it writes something, and
no tensor it writes is in another column or twice in its own.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch import nn

from tunecl.backend import state
from tunecl.backend.ops.foreach import arranged, buffer_pairs
from tunecl.kernels.ops.fused import Chain, Step
from tunecl.kernels.ops.optim import CHAIN_COLUMNS, CHAIN_STEPS
from tunecl.kernels.ops.pointwise import EXPRESSIONS

_PREFIX = "aten::_foreach_"


def _parse(node: torch.fx.Node) -> tuple[str, bool, list, list, list[float]] | None:
    """A foreach call as (expression, in place, self list or None, inputs after self, parameters: one number
    each); None for any other node or operand form."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    name = target._schema.name
    if not name.startswith(_PREFIX):
        return None
    base = name[len(_PREFIX):]
    in_place = base.endswith("_")
    base = base.rstrip("_")
    overload = target._overloadname
    if base == "pow" and overload == "ScalarAndTensor" and not in_place:
        scalar, exponent = node.args
        if not isinstance(scalar, (int, float)) or not isinstance(exponent, (list, tuple)):
            return None
        return "pow", False, None, [[float(scalar)] * len(exponent), list(exponent)], []
    self = node.args[0] if node.args else None
    if not isinstance(self, (list, tuple)) or not self:
        return None
    found = arranged(base if overload == "default" else f"{base}.{overload}", len(self), node.args[1:], node.kwargs)
    if found is None:
        return None
    expr, inputs, params = found
    constants = []
    for numbers in params:
        if len(set(numbers)) != 1:
            return None
        constants.append(float(numbers[0]))
    return expr, in_place, list(self), [list(x) for x in inputs], constants


def _tensor_of(node: Any) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if (isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.device.type == "opencl"
            and value.is_contiguous()):
        return value
    return None


class _Run:
    """The ops of one run so far and what they compute (see the module docstring)."""

    def __init__(self) -> None:
        self.members: list[torch.fx.Node] = []
        self.count = 0
        self.columns: list[tuple[torch.fx.Node, ...]] = []
        self.ones: list[bool] = []
        self.shapes: list[torch.Size] | None = None
        self.current: dict[tuple[torch.fx.Node, ...], str] = {}   # a column's value now: v<j> or t<s>
        self.results: dict[torch.fx.Node, int] = {}                # an op's result list -> its step
        self.steps: list[Step] = []
        self.writes: dict[int, int] = {}                           # column -> the step it ends with

    def add(self, node: torch.fx.Node) -> bool:
        """Take ``node`` into the run if it can join (the state is unchanged if not)."""
        parsed = _parse(node)
        if parsed is None:
            return False
        expr, in_place, self_list, inputs, params = parsed
        lists = ([self_list] if self_list is not None else []) + inputs
        tensor_list = next((x for x in lists if x and isinstance(x[0], torch.fx.Node)), None)
        if tensor_list is None:
            return False
        count = len(tensor_list)
        spec = EXPRESSIONS.get(expr)
        if (self.count and count != self.count) or spec is None or not spec.code or spec.special or spec.nin != len(lists) \
                or spec.nparams != len(params) or len(self.steps) >= CHAIN_STEPS:
            return False
        saved = (list(self.columns), list(self.ones), self.shapes, dict(self.current))
        args = []
        for operand in lists:
            value = self._value(operand, count)
            if value is None:
                self.columns, self.ones, self.shapes, self.current = saved[0], saved[1], saved[2], saved[3]
                return False
            args.append(value)
        step = len(self.steps)
        if in_place:
            target = self._written(self_list)
            if target is None:
                self.columns, self.ones, self.shapes, self.current = saved[0], saved[1], saved[2], saved[3]
                return False
            if isinstance(target, int):
                self.current[self.columns[target]] = f"t{step}"
                self.writes[target] = step
            else:
                self.results[target] = step
        else:
            self.results[node] = step
        self.steps.append(Step(expr, tuple(args), tuple(params)))
        self.members.append(node)
        self.count = count
        return True

    def _value(self, operand: list, count: int) -> str | float | None:
        """An operand's value in the chain: a constant, an earlier result (t<s>) or a column's (v<j>, or the
        step that last wrote it)."""
        if len(operand) != count:
            return None
        if not isinstance(operand[0], torch.fx.Node):
            return float(operand[0]) if len(set(operand)) == 1 else None
        origin = self._origin(operand)
        if origin is not None:
            return f"t{self.results[origin]}"
        if any(n in self.members or (n.target is operator.getitem and n.args[0] in self.members) for n in operand):
            return None
        key = tuple(operand)
        if key in self.current:
            return self.current[key]
        tensors = [_tensor_of(n) for n in operand]
        if any(t is None for t in tensors) or len(self.columns) >= CHAIN_COLUMNS:
            return None
        one = all(t.dim() == 0 for t in tensors)
        if not one:
            shapes = [t.shape for t in tensors]
            if self.shapes is None:
                self.shapes = shapes
            elif shapes != self.shapes:
                return None
        self.columns.append(key)
        self.ones.append(one)
        self.current[key] = f"v{len(self.columns) - 1}"
        return self.current[key]

    def _origin(self, operand: list) -> torch.fx.Node | None:
        """The run's op whose result list ``operand`` is (its getitems 0 .. n-1), or None."""
        first = operand[0]
        if first.op != "call_function" or first.target is not operator.getitem:
            return None
        origin = first.args[0]
        if origin not in self.results:
            return None
        if all(n.op == "call_function" and n.target is operator.getitem and n.args == (origin, k)
               for k, n in enumerate(operand)):
            return origin
        return None

    def _written(self, self_list: list) -> int | torch.fx.Node | None:
        """What an in-place op writes: a column of full tensors (its index) or an earlier result list."""
        origin = self._origin(self_list)
        if origin is not None:
            return origin
        key = tuple(self_list)
        column = next((j for j, c in enumerate(self.columns) if c == key), None)
        if column is None or self.ones[column]:
            return None
        return column

    # -- closing ------------------------------------------------------------------------------------
    def replaceable(self) -> bool:
        if len(self.members) < 2 or not self.writes:
            return False
        members = set(self.members)
        for member in self.members:   # no result computed inside is read outside
            for user in member.users:
                readers = list(user.users) if user.target is operator.getitem else [user]
                if any(r not in members for r in readers):
                    return False
        written = [n for j in self.writes for n in self.columns[j]]
        if len(set(written)) != len(written):
            return False
        others = [n for j, column in enumerate(self.columns) if j not in self.writes for n in column]
        return not set(written) & set(others)


def fuse_foreach(gm: torch.fx.GraphModule) -> list[int]:
    """Replace every replaceable run of ``_foreach_*`` ops of ``gm`` by a :class:`ForeachChain` submodule;
    the number of ops of each run replaced (``gm`` is recompiled if any)."""
    runs: list[_Run] = []
    run = _Run()
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] in run.members:
            continue
        if run.add(node):
            continue
        runs.append(run)
        run = _Run()
        if not run.add(node):
            run = _Run()
    runs.append(run)
    done = []
    for k, run in enumerate(r for r in runs if r.replaceable()):
        _replace(gm, f"tunecl_foreach_{k}", run)
        done.append(len(run.members))
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _replace(gm: torch.fx.GraphModule, name: str, run: _Run) -> None:
    flat: list[torch.fx.Node] = list(dict.fromkeys(n for column in run.columns for n in column))
    where = {n: i for i, n in enumerate(flat)}
    layout = tuple(tuple(where[n] for n in column) for column in run.columns)
    members = set(run.members)
    nodes = [n for n in gm.graph.nodes
             if n in members or (n.target is operator.getitem and n.args and n.args[0] in members)]
    # the run's own ops over the same inputs, for calls whose tensors are not as the graph promised
    graph = torch.fx.Graph()
    env = {n: graph.placeholder(f"x{i}") for i, n in enumerate(flat)}
    for node in nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(None)
    fallback = torch.fx.GraphModule(nn.Module(), graph)
    chain = Chain(len(run.columns), tuple(run.steps))
    module = ForeachChain(chain, tuple(run.ones), tuple(sorted(run.writes.items())), layout, fallback)
    gm.add_submodule(name, module)
    with gm.graph.inserting_before(nodes[0]):
        gm.graph.call_module(name, tuple(flat))
    for node in reversed(nodes):
        gm.graph.erase_node(node)


class ForeachChain(nn.Module):
    """One run of foreach ops: ``chain`` over the columns (``layout``: each column's indices into the call's
    arguments), writing ``writes`` ((column, step) pairs); ``fallback`` runs the original ops."""

    def __init__(self, chain: Chain, ones: tuple[bool, ...], writes: tuple[tuple[int, int], ...],
                 layout: tuple[tuple[int, ...], ...], fallback: torch.fx.GraphModule) -> None:
        super().__init__()
        self.chain, self.ones, self.writes, self.layout = chain, ones, writes, layout
        self.fallback = fallback

    def forward(self, *tensors: torch.Tensor) -> None:
        columns = [[tensors[i] for i in column] for column in self.layout]
        pairs = [buffer_pairs(column) for column in columns]
        full = [c for c, one in zip(columns, self.ones) if not one]
        numels = [t.numel() for t in full[0]]
        if (any(p is None for p in pairs) or any([t.numel() for t in c] != numels for c in full)
                or any(t.numel() != 1 for c, one in zip(columns, self.ones) if one for t in c)):
            self.fallback(*tensors)
            return
        state.get().optim.chain(self.chain, self.ones, self.writes, pairs, numels)

    def extra_repr(self) -> str:
        return " -> ".join(step.op for step in self.chain.steps)
