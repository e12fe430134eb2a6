"""A rewrite of the compiled backward graphs: an activation's backward folded into the batch norm's.

Conv -> batch norm -> relu (or relu6) is the block of most CNNs. Its backward is ``threshold_backward``
(``hardtanh_backward``) of the incoming gradient, a pass over the activations that writes a masked copy,
then ``native_batch_norm_backward`` of that copy, which reads it twice (its reduction and its
elementwise pass). Where the masked gradient goes to that batch norm's backward alone, the pair becomes
one call of :func:`tunecl.backend.ops.nn.batch_norm_backward_masked`, whose kernels read the incoming
gradient through the mask: a launch and a pass fewer per block.
"""

from __future__ import annotations

import torch
import torch.fx

from tunecl.backend.ops.nn import batch_norm_backward_masked

aten = torch.ops.aten


def _mask_of(node: torch.fx.Node) -> str | None:
    """"relu" for ``threshold_backward(g, act, 0)``, "relu6" for ``hardtanh_backward(g, act, 0, 6)``, else None."""
    if node.op != "call_function" or node.kwargs:
        return None
    if node.target is aten.threshold_backward.default and len(node.args) == 3 and node.args[2] == 0:
        return "relu"
    if node.target is aten.hardtanh_backward.default and len(node.args) == 4 and tuple(node.args[2:]) == (0, 6):
        return "relu6"
    return None


def fuse_norm_backward(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm`` as the module docstring says; the number of pairs fused (``gm`` is recompiled if any)."""
    fused = 0
    for node in list(gm.graph.nodes):
        mask = _mask_of(node)
        if mask is None or len(node.users) != 1:
            continue
        (norm,) = node.users
        if (norm.op != "call_function" or norm.target is not aten.native_batch_norm_backward.default
                or norm.kwargs or len(norm.args) != 10 or norm.args[0] is not node or node in norm.args[1:]):
            continue
        grad, act = node.args[0], node.args[1]
        value = node.meta.get("val")
        if not all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.shape == value.shape
                   for v in (value, _val(grad), _val(act), _val(norm.args[1]))):
            continue
        with gm.graph.inserting_before(norm):
            fused_node = gm.graph.call_function(batch_norm_backward_masked, (grad, act, mask, *norm.args[1:]))
        fused_node.meta.update(norm.meta)
        norm.replace_all_uses_with(fused_node)
        gm.graph.erase_node(norm)
        gm.graph.erase_node(node)
        fused += 1
    if fused:
        gm.graph.lint()
        gm.recompile()
    return fused


def _val(node: object) -> object:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None
