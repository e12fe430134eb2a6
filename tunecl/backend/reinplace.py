"""A rewrite of the compiled graphs: functional ops whose results go back into a mutated input, in place.

AOTAutograd hands a backend functional graphs: an in-place update of an input (an optimizer's
``p.add_(...)``, ``exp_avg.lerp_(...)``, a step count's ``+= 1``) arrives as an op that makes a new tensor,
and the graph ends with ``copy_(input, new_value)``. A compiled foreach Adam step over n parameters so
allocates 4n new tensors per op chain and copies 4n of them back. Here each such op whose first operand
(``self``, or each tensor of a foreach op's first list) is the current value of an input that the graph
mutates, and is read by nothing after the op, becomes the op's in-place variant (``_foreach_add.Scalar`` ->
``_foreach_add_.Scalar``, ``add.Tensor`` -> ``add_.Tensor``): its result is written into the input's storage,
later readers of the result read the input, and the final ``copy_`` of the input into itself goes.
Batch norm in training arrives as ``_native_batch_norm_legit_functional``, which clones the running mean
and variance to return their new values, copied back at the end: four copies per layer. Where those new
values go back into the inputs they came from, it becomes ``_native_batch_norm_legit``, which updates them
in place.

An op stays functional unless all of these hold: every ``self`` tensor is a distinct input that the graph
copies a new value into at its end (so its old value is the graph's to overwrite), that shares no storage
with another input, and whose final value no earlier op has written in place already; nothing after the op
reads that old value (other than the final ``copy_``); no other
operand of the op is one of those inputs (``mul_(a, a)`` is not sound); each result has its input's shape,
dtype and strides (an in-place op keeps them); and no result is a graph output.

Two more rewrites here undo what functionalization does to eager code that works in place:
:func:`drop_clones` drops a copy of a value that nothing in the graph writes (``ReLU6(inplace=True)`` in
training leaves one per layer), and :func:`activations_in_place` makes a relu or relu6 of a batch norm's
output in place again, so that it runs inside the batch norm's launch.
"""

from __future__ import annotations

import collections
import operator
from typing import Any

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

aten = torch.ops.aten


def _in_place_variant(target: Any) -> Any | None:
    """The in-place overload of a functional ATen overload (``aten.add.Tensor`` -> ``aten.add_.Tensor``) whose
    first argument is the one written, or None."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    schema = target._schema
    if schema.name.endswith("_") or not schema.arguments or any(a.alias_info for a in schema.arguments):
        return None
    packet = getattr(aten, schema.name.split("::")[-1] + "_", None)
    variant = getattr(packet, target._overloadname, None) if packet is not None else None
    if variant is None:
        return None
    first = variant._schema.arguments[0]
    if first.alias_info is None or not first.alias_info.is_write:
        return None
    if [a.name for a in variant._schema.arguments] != [a.name for a in schema.arguments]:
        return None
    return variant


def _copy_backs(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, torch.fx.Node]:
    """The inputs the graph ends by overwriting, each with its ``copy_(input, value)`` node (inputs copied into
    more than once are left out)."""
    found: dict[torch.fx.Node, torch.fx.Node] = {}
    twice: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if (node.op == "call_function" and node.target is aten.copy_.default and len(node.args) == 2
                and not node.kwargs and not node.users and isinstance(node.args[0], torch.fx.Node)
                and node.args[0].op == "placeholder"):
            target = node.args[0]
            if target in found:
                twice.add(target)
            else:
                found[target] = node
    return {target: copy for target, copy in found.items() if target not in twice}


def _storage_key(value: Any) -> Any:
    """What identifies ``value``'s storage (the example inputs are fake tensors: no addresses), or None."""
    if not isinstance(value, torch.Tensor):
        return None
    return StorageWeakRef(value.untyped_storage())


def _same_layout(a: Any, b: Any) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype and a.stride() == b.stride() and a.device == b.device)


def reinplace_input_mutations(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> int:
    """Rewrite ``gm`` as the module docstring says; the number of ops made in place (``gm`` is recompiled if
    any)."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    copies = _copy_backs(gm)
    if not copies:
        return 0
    # inputs that share storage with another input are left alone (a write into one changes the other)
    if len(example_inputs) != len(placeholders):
        return 0
    keys = [_storage_key(v) for v in example_inputs]
    counts = collections.Counter(k for k in keys if k is not None)
    mutable = {p for p, k in zip(placeholders, keys) if p in copies and k is not None and counts[k] == 1}
    outputs = {n for n in nodes if n.op == "output"}
    position = {node: i for i, node in enumerate(nodes)}
    made = 0
    for node in nodes:
        if node.op == "call_function" and node.target is aten._native_batch_norm_legit_functional.default:
            made += _batch_norm_in_place(gm, node, mutable, copies, position, outputs)
            continue
        variant = _in_place_variant(node.target) if node.op == "call_function" else None
        if variant is None or not node.args:
            continue
        first = node.args[0]
        foreach = isinstance(first, (list, tuple))
        selves = list(first) if foreach else [first]
        if not selves or not all(s in mutable for s in selves) or len(set(selves)) < len(selves):
            continue
        # an input that holds its final value already (its copy-back became a copy into itself) keeps it
        if any(copies[s].args[1] is s for s in selves):
            continue
        # no other operand is one of them
        rest = [*node.args[1:], *node.kwargs.values()]
        flat = [x for r in rest for x in (r if isinstance(r, (list, tuple)) else [r])]
        if any(isinstance(x, torch.fx.Node) and x in selves for x in flat):
            continue
        # nothing after the op reads their old values but their final copies
        if any(user is not node and user is not copies[s] and position[user] > position[node]
               for s in selves for user in s.users):
            continue
        results = _results(node, foreach, len(selves))
        if results is None or any(r in outputs or any(u in outputs for u in r.users) for r in results if r):
            continue
        if not all(r is None or _same_layout(r.meta.get("val"), s.meta.get("val")) for r, s in zip(results, selves)):
            continue
        for result, target in zip(results, selves):
            if result is not None:
                result.replace_all_uses_with(target)
                if result is not node:
                    gm.graph.erase_node(result)
        node.target = variant
        made += 1
    if not made:
        return 0
    for target, copy in copies.items():   # copies of an input into itself: nothing left to write back
        if copy.args[1] is target:
            gm.graph.erase_node(copy)
    gm.graph.lint()
    gm.recompile()
    return made


def _batch_norm_in_place(gm: torch.fx.GraphModule, node: torch.fx.Node, mutable: set[torch.fx.Node],
                         copies: dict[torch.fx.Node, torch.fx.Node], position: dict[torch.fx.Node, int],
                         outputs: set[torch.fx.Node]) -> int:
    """``_native_batch_norm_legit_functional`` -> ``_native_batch_norm_legit`` (which updates the running
    statistics in place) when its new running mean and variance (results 3 and 4) are what the graph copies
    back into the inputs it got them from, under the conditions of the module docstring; 1 if rewritten.
    The functional op clones both statistics and the graph copies both back: four copies per layer."""
    # (training only: the new statistics are also outputs there, saved for the backward, which reads them
    # only in evaluation; from here on the saved tensors are the inputs, which hold the same values)
    if len(node.args) != 8 or node.kwargs or node.args[5] is not True:
        return 0
    selves = node.args[3:5]
    if not all(isinstance(s, torch.fx.Node) and s in mutable for s in selves) or selves[0] is selves[1] \
            or any(copies[s].args[1] is s for s in selves):
        return 0
    if any(isinstance(a, torch.fx.Node) and a in selves for a in node.args[:3]):
        return 0
    results = _results(node, True, 5)
    if results is None:
        return 0
    for index, s in zip((3, 4), selves):
        result = results[index]
        if result is None or copies[s].args[1] is not result or result in outputs:
            return 0
    if any(user is not node and user is not copies[s] and position[user] > position[node]
           for s in selves for user in s.users):
        return 0
    for index, s in zip((3, 4), selves):
        results[index].replace_all_uses_with(s)
        gm.graph.erase_node(results[index])
    node.target = aten._native_batch_norm_legit.default
    value = node.meta.get("val")
    if isinstance(value, (tuple, list)):
        node.meta["val"] = tuple(value[:3])
    return 1


def _results(node: torch.fx.Node, foreach: bool, count: int) -> list[torch.fx.Node | None] | None:
    """The nodes holding ``node``'s results: itself, or for a foreach op its ``getitem`` users by index (None
    where no one reads a result); None when something else reads the list."""
    if not foreach:
        return [node]
    results: list[torch.fx.Node | None] = [None] * count
    for user in node.users:
        if (user.op != "call_function" or user.target is not operator.getitem or len(user.args) != 2
                or not isinstance(user.args[1], int) or results[user.args[1]] is not None):
            return None
        results[user.args[1]] = user
    return results


# the batch norms whose normalising launch an in-place relu or relu6 of its output can run inside (see
# tunecl.backend.ops.pointwise._folded)
_NORMALISING = {aten._native_batch_norm_legit.default, aten._native_batch_norm_legit_functional.default,
                aten._native_batch_norm_legit_no_training.default, aten.native_batch_norm.default}


def activations_in_place(gm: torch.fx.GraphModule) -> int:
    """``relu(y)`` and ``hardtanh(y, 0, 6)`` of a batch norm's output ``y`` that nothing else reads become
    ``relu_(y)`` and ``hardtanh_(y, 0, 6)``: the backend then applies them inside the batch norm's
    normalising launch, as it does eagerly for torchvision's ``ReLU(inplace=True)`` (a functional graph
    has no in-place ops of its own). The number rewritten (``gm`` is recompiled if any)."""
    outputs = {n for n in gm.graph.nodes if n.op == "output"}
    made = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target is aten.relu.default and len(node.args) == 1:
            variant = aten.relu_.default
        elif node.target is aten.hardtanh.default and tuple(node.args[1:]) == (0, 6):
            variant = aten.hardtanh_.default
        else:
            continue
        y = node.args[0]
        if not (_normalised(y) and len(y.users) == 1 and y not in outputs
                and _same_layout(node.meta.get("val"), y.meta.get("val"))):
            continue
        node.target = variant
        made += 1
    if made:
        gm.graph.lint()
        gm.recompile()
    return made


def _normalised(y: Any) -> bool:
    """Whether ``y`` is the normalised output (a new tensor) of a batch norm."""
    return (isinstance(y, torch.fx.Node) and y.op == "call_function" and y.target is operator.getitem
            and y.args[1] == 0 and isinstance(y.args[0], torch.fx.Node) and y.args[0].target in _NORMALISING)


def _writes(node: torch.fx.Node) -> bool:
    """Whether ``node`` may write one of its operands, now or later: an in-place or ``out=`` op, a view (a
    later op may write through it), or an op we cannot tell."""
    if node.op == "output":
        return False
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return True
    schema = node.target._schema
    return schema.is_mutable or any(r.alias_info for r in schema.returns)


def drop_clones(gm: torch.fx.GraphModule) -> int:
    """``clone(y)`` of a new tensor ``y`` (an op's result, not an input or a view) where nothing in the graph
    writes ``y`` or the clone: the clone's readers read ``y`` and the copy goes. Eager code that activates in
    place (``ReLU6(inplace=True)``) reaches a functional graph as ``clone(y)``, kept for the backward, and
    ``hardtanh(y)``: one copy of the activations per layer. The number dropped (``gm`` is recompiled if any)."""
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.clone.default or node.kwargs or len(node.args) != 1:
            continue
        y = node.args[0]
        if not (isinstance(y, torch.fx.Node) and _fresh(y)
                and _same_layout(node.meta.get("val"), y.meta.get("val"))):
            continue
        if any(_writes(user) for user in (*y.users, *node.users)):
            continue
        node.replace_all_uses_with(y)
        gm.graph.erase_node(node)
        dropped += 1
    if dropped:
        gm.graph.lint()
        gm.recompile()
    return dropped


def _fresh(y: torch.fx.Node) -> bool:
    """Whether ``y`` is a new tensor: the result of an op that returns no alias of its operands (or an
    element of such results; the op may write other operands), not an input."""
    if y.op != "call_function":
        return False
    if y.target is operator.getitem:
        y = y.args[0]
        if not isinstance(y, torch.fx.Node) or y.op != "call_function":
            return False
    target = y.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return not any(r.alias_info for r in target._schema.returns)
