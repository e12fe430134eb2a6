"""A rewrite of the compiled graphs: their copy-backs into mutated inputs, grouped.

AOTAutograd's graphs compute new values for the inputs a function mutates (batch norm's running
statistics, an optimizer's parameters, moments and step counts) and end with one ``copy_`` per mutated
input, writing the value back. A compiled Adam step over n parameters ends with 4n of them, each one
launch. Each run of such copies becomes one ``_foreach_copy_`` call, which copies the float32 pairs in
one launch per ``Optim.slots`` of them (:mod:`tunecl.backend.ops.foreach`) and the others one by one.
"""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten


def _is_copy_back(node: torch.fx.Node) -> bool:
    """``copy_(input, value)`` whose result nobody reads."""
    return (node.op == "call_function" and node.target is aten.copy_.default and len(node.args) == 2
            and not node.kwargs and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder"
            and isinstance(node.args[1], torch.fx.Node) and not node.users)


def group_copy_backs(gm: torch.fx.GraphModule) -> int:
    """Replace each run of two or more consecutive copy-backs into distinct inputs (none of them the value
    of another) by one ``_foreach_copy_``; the number of copies so grouped."""
    runs: list[list[torch.fx.Node]] = [[]]
    for node in gm.graph.nodes:
        if _is_copy_back(node):
            runs[-1].append(node)
        elif runs[-1]:
            runs.append([])
    grouped = 0
    for run in runs:
        destinations, sources = [n.args[0] for n in run], [n.args[1] for n in run]
        if len(run) < 2 or len(set(destinations)) < len(run) or set(sources) & set(destinations):
            continue
        with gm.graph.inserting_before(run[0]):
            gm.graph.call_function(aten._foreach_copy_.default, (destinations, sources))
        for node in run:
            gm.graph.erase_node(node)
        grouped += len(run)
    if grouped:
        gm.recompile()
    return grouped
