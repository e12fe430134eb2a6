"""A rewrite of the compiled graphs: step counts incremented in one launch.

Every batch norm in training counts its calls in an int64 buffer (``num_batches_tracked += 1``). In a
compiled forward graph that is one ``add_`` of an input per layer, each a launch of its own (52 in
mobilenet_v2). Here the increments of int64 inputs by the same integer, where nothing else in the graph
reads or writes those inputs, become one ``_foreach_add_.Scalar`` over them, which the backend runs as one
multi-tensor launch per ``Optim.slots`` of them (:mod:`tunecl.backend.ops.foreach`). Nothing in the graph
reads the counts, so moving their increments to the place of the first one changes no value.
"""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten


def _increment(node: torch.fx.Node) -> int | None:
    """The integer an unread ``add_(input, k)`` of an int64 input that nothing else touches adds, or None."""
    if (node.op != "call_function" or node.target not in (aten.add_.Tensor, aten.add_.Scalar) or node.kwargs
            or len(node.args) != 2 or node.users or type(node.args[1]) is not int):
        return None
    count = node.args[0]
    value = count.meta.get("val") if isinstance(count, torch.fx.Node) else None
    if (count.op != "placeholder" or not isinstance(value, torch.Tensor) or value.dtype != torch.int64
            or any(user is not node for user in count.users)):
        return None
    return node.args[1]


def group_step_counts(gm: torch.fx.GraphModule) -> int:
    """Replace the increments described in the module docstring, two or more by the same integer, by one
    ``_foreach_add_.Scalar`` each; the number of increments so grouped (``gm`` is recompiled if any)."""
    groups: dict[int, list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        value = _increment(node)
        if value is not None:
            groups.setdefault(value, []).append(node)
    grouped = 0
    for value, nodes in groups.items():
        if len(nodes) < 2:
            continue
        with gm.graph.inserting_before(nodes[0]):
            gm.graph.call_function(aten._foreach_add_.Scalar, ([n.args[0] for n in nodes], value))
        for node in nodes:
            gm.graph.erase_node(node)
        grouped += len(nodes)
    if grouped:
        gm.graph.lint()
        gm.recompile()
    return grouped
