"""Inference conv + batch norm folding, a rewrite of the compiled inference graph.

In evaluation, batch norm after a convolution is an affine map per output channel, so the pair is one
convolution with ``w' = w * s`` and ``b' = (b - mean) * s + beta``, ``s = gamma / sqrt(var + eps)``
(per output channel): the batch norm's pass over the activations goes, and the bias rides in the
convolution's plan. :func:`fold_conv_bn` rewrites each ``convolution -> batch norm`` of an AOT inference
graph (eval batch norm: ``_native_batch_norm_legit_no_training`` or ``native_batch_norm`` with
``training=False``) into a :class:`FoldedConv`, which holds ``w'`` and ``b'`` on the device.

The folded weights follow the parameters and running statistics they come from: a :class:`FoldedConv`
folds again (on the device, a few ops) whenever one of them may have changed since its last fold, which
it checks on every eager call and, in a captured graph, before every replay (so a replay runs the
folded convolution only, at the cost of one batch norm less). "May have changed" is any of:

- a new tensor in a source's place, or a source's ``_version`` moved (in-place ops, ``copy_`` under
  ``no_grad``, ``load_state_dict``, the optimizers' foreach and per-tensor steps);
- a write into a source's storage that passed the dispatcher without moving the version (``.data``
  writes, the fused optimizers; :class:`tunecl.backend.weight_cache.WriteListener`);
- a replay of another captured graph that uses a source's buffer (a compiled optimizer step: replays
  pass no torch op, so they move no counter).

Where the folded convolution's only user is a pointwise op that the elementwise fusion takes
(:mod:`tunecl.backend.fusion`: a relu, a residual add), :func:`biases_into_pointwise` moves the folded bias
out of the convolution into an add before that op, which the fusion then makes part of the op's generated
kernel: the convolution runs without a bias (several algorithms add it in a kernel of its own), and the
bias costs the chain one broadcast read.

Inference tensors keep no version counter: with one among the sources the fold runs on every call, and
a capture records it, so every replay folds too. Before a capture the folds are brought up to date
(:func:`refresh_before_capture`), so a capture that still finds them stale (a source written during the
capture) records its fold. Writes that pass neither
the dispatcher nor a graph (into a tensor's ``cl.Buffer`` directly) stay invisible, as they do to the
Winograd weight cache.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch import nn

from tunecl.backend import graphs, memory, weight_cache

aten = torch.ops.aten

_BATCH_NORMS = {
    aten._native_batch_norm_legit_no_training.default: 6,   # -> index of eps
    aten.native_batch_norm.default: 7,
}


def fold_conv_bn(gm: torch.fx.GraphModule) -> int:
    """Rewrite every foldable ``convolution -> eval batch norm`` of ``gm`` (an inference graph) into a
    :class:`FoldedConv` submodule; returns how many pairs were folded (``gm`` is recompiled if any)."""
    folded = 0
    for bn in list(gm.graph.nodes):
        eps_index = _BATCH_NORMS.get(bn.target) if bn.op == "call_function" else None
        if eps_index is None:
            continue
        conv = _foldable(bn, eps_index)
        if conv is None:
            continue
        x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = conv.args
        gamma, beta, mean, var = bn.args[1:5]
        name = f"tunecl_folded_conv_{folded}"
        gm.add_submodule(name, FoldedConv(stride, padding, dilation, output_padding, groups, float(bn.args[eps_index])))
        value = next(iter(bn.users))
        with gm.graph.inserting_before(bn):
            node = gm.graph.call_module(name, (x, weight, bias, gamma, beta, mean, var))
        node.meta["val"] = value.meta.get("val")
        for user in list(bn.users):   # the getitem(bn, 0) nodes: the output
            user.replace_all_uses_with(node)
            gm.graph.erase_node(user)
        gm.graph.erase_node(bn)
        gm.graph.erase_node(conv)
        folded += 1
    if folded:
        gm.graph.lint()
        gm.recompile()
    return folded


def biases_into_pointwise(gm: torch.fx.GraphModule) -> int:
    """Move the folded bias of each :class:`FoldedConv` node of ``gm`` whose only user is a fusible
    pointwise op out of the convolution, into ``add(conv, bias)`` before that op (see the module
    docstring); returns how many were moved (``gm`` is recompiled if any). Run it after
    :func:`fold_conv_bn` and before :func:`tunecl.backend.fusion.fuse_pointwise`."""
    from tunecl.backend import fusion

    moved = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(gm.get_submodule(node.target), FoldedConv):
            continue
        value = node.meta.get("val")
        fake_mode = getattr(value, "fake_mode", None)
        if len(node.users) != 1 or fake_mode is None:
            continue
        user = next(iter(node.users))
        if fusion.pointwise(user) is None:
            continue
        gm.get_submodule(node.target).bias_apart = True
        with fake_mode:
            bias_value = torch.empty((value.shape[1], 1, 1), dtype=value.dtype, device=value.device)
        with gm.graph.inserting_after(node):
            out = gm.graph.call_function(operator.getitem, (node, 0))
        with gm.graph.inserting_after(out):
            bias = gm.graph.call_function(operator.getitem, (node, 1))
        with gm.graph.inserting_after(bias):
            added = gm.graph.call_function(aten.add.Tensor, (out, bias))
        out.meta["val"], bias.meta["val"], added.meta["val"] = value, bias_value, value
        node.meta["val"] = (value, bias_value)
        user.replace_input_with(node, added)
        moved += 1
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved


def _foldable(bn: torch.fx.Node, eps_index: int) -> torch.fx.Node | None:
    """The convolution node ``bn`` normalises, where the pair folds: a 2-d float32 opencl convolution
    (not transposed) whose only user is ``bn``, an eval batch norm whose only used output is the first."""
    if bn.target is aten.native_batch_norm.default and bn.args[5]:   # training=True
        return None
    conv = bn.args[0]
    if not (isinstance(conv, torch.fx.Node) and conv.op == "call_function"
            and conv.target is aten.convolution.default and len(conv.args) == 9 and not conv.kwargs
            and not conv.args[6] and len(conv.users) == 1):
        return None
    if bn.kwargs or len(bn.args) != eps_index + 1:
        return None
    if not all(user.op == "call_function" and user.target is operator.getitem and user.args[1] == 0
               for user in bn.users):
        return None
    tensors = [conv.args[0], conv.args[1], conv.args[2], *bn.args[1:5], conv]
    for node in tensors:
        if node is None:
            continue
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not (isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.device.type == "opencl"
                and all(isinstance(n, int) for n in value.shape)):
            return None
    if bn.args[3] is None or bn.args[4] is None or conv.meta["val"].dim() != 4:   # no running statistics
        return None
    return conv


class _Listener(weight_cache.WriteListener):
    """Marks its :class:`FoldedConv` stale on a write into a source's storage (held weakly: the fold's
    life is its graph's)."""

    def __init__(self, fold: FoldedConv) -> None:
        self.fold = weakref.ref(fold)

    def on_write(self) -> None:
        fold = self.fold()
        if fold is not None:
            fold.written = True


class FoldedConv(nn.Module):
    """``convolution(x, w', b')`` with ``w'``, ``b'`` the batch norm folded into the convolution's weight
    and bias (see the module docstring); called with the convolution's input, weight and bias and the
    batch norm's weight, bias, running mean and running variance."""

    def __init__(self, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                 output_padding: Sequence[int], groups: int, eps: float) -> None:
        super().__init__()
        self.conv_args = (list(stride), list(padding), list(dilation), False, list(output_padding), groups)
        self.eps = eps
        self.weight: torch.Tensor | None = None   # w' and b', the targets of every fold
        self.bias: torch.Tensor | None = None
        self.bias_apart = False                   # return (convolution without b', b' as (K, 1, 1))
        self.written = False                      # set by a write into a source's storage
        self.folds = 0                            # how many times it folded (its tests read it)
        self._stamp: tuple | None = None
        self._listener = _Listener(self)
        self._watched: list[int] = []
        self._graph_replays: dict[int, tuple[weakref.ref, int]] = {}   # graph id -> (graph, replays seen)
        self._sources: tuple = ()                 # those of the last call (see refresh_before_capture)
        weakref.finalize(self, _unwatch, self._watched, self._listener)

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gamma: torch.Tensor | None,
                beta: torch.Tensor | None, mean: torch.Tensor, var: torch.Tensor) -> Any:
        sources = self._sources = (weight, bias, gamma, beta, mean, var)
        if graphs.capturing():
            if self._stale(sources, own=graphs.active()):
                self._fold(sources)   # recorded: every replay folds (see the module docstring)
            else:
                graphs.before_each_replay(_Refresh(self, sources, graphs.active()))
        else:
            self.refresh(sources)
        if self.bias_apart:
            return (aten.convolution.default(x, self.weight, None, *self.conv_args),
                    self.bias.view(-1, 1, 1))
        return aten.convolution.default(x, self.weight, self.bias, *self.conv_args)

    def refresh(self, sources: Sequence[torch.Tensor | None], own: graphs.Graph | None = None) -> None:
        """Fold again if a source may have changed since the last fold."""
        if self._stale(sources, own):
            self._fold(sources)

    # -- staleness ---------------------------------------------------------------------------------
    def _stale(self, sources: Sequence[torch.Tensor | None], own: graphs.Graph | None) -> bool:
        stale = (self.written or _stamp(sources) != self._stamp
                 or any(t is not None and t.is_inference() for t in sources))
        # replays of other graphs over a source's buffer (their counts since the last look)
        for graph in graphs.captured_graphs():
            if graph is own:
                continue
            seen = self._graph_replays.get(id(graph))
            if seen is None or seen[0]() is not graph:
                uses = any(t is not None and graph.uses_buffer(memory.buffer_of(t)) for t in sources)
                seen = self._graph_replays[id(graph)] = (weakref.ref(graph), graph.replays if uses else None)
            if seen[1] is not None and seen[1] != graph.replays:
                stale = True
                self._graph_replays[id(graph)] = (seen[0], graph.replays)
        return stale

    def _fold(self, sources: Sequence[torch.Tensor | None]) -> None:
        weight, bias, gamma, beta, mean, var = sources
        # (never inference tensors: a later fold outside inference mode writes into them)
        with torch.inference_mode(False), torch.no_grad():
            scale = torch.rsqrt(var + self.eps)
            if gamma is not None:
                scale = scale * gamma
            shift = -mean if bias is None else bias - mean
            shift = shift * scale
            if beta is not None:
                shift = shift + beta
            folded = weight * scale.reshape(-1, *([1] * (weight.dim() - 1)))
            if self.weight is None or self.weight.shape != folded.shape:
                self.weight, self.bias = folded, shift.contiguous()
            else:   # into the same tensors: a captured convolution reads them
                self.weight.copy_(folded)
                self.bias.copy_(shift)
        self.folds += 1
        self.written = False
        self._stamp = _stamp(sources)
        self._watch(sources)

    def _watch(self, sources: Sequence[torch.Tensor | None]) -> None:
        storages = [t.untyped_storage().data_ptr() for t in sources if t is not None]
        if storages != self._watched:
            _unwatch(self._watched, self._listener)
            for t in sources:
                if t is not None:
                    weight_cache.watch_writes(t, self._listener)
            self._watched[:] = storages


def refresh_before_capture(gm: torch.fx.GraphModule) -> None:
    """Fold again, where stale, the :class:`FoldedConv` s of ``gm`` from the sources of their last call,
    so that a capture of ``gm`` about to begin (its sources are those, or aliases of them) need not record
    their folds."""
    for module in gm.modules():
        if isinstance(module, FoldedConv) and module._sources:
            module.refresh(module._sources)


class _Refresh:
    """The before-replay hook of a captured :class:`FoldedConv` (holds the graph's source tensors)."""

    def __init__(self, fold: FoldedConv, sources: Sequence[torch.Tensor | None], own: graphs.Graph) -> None:
        self.fold, self.sources, self.own = fold, tuple(sources), weakref.ref(own)

    def __call__(self) -> None:
        self.fold.refresh(self.sources, self.own())


def _stamp(sources: Sequence[torch.Tensor | None]) -> tuple:
    """What tells the sources' contents apart without reading them: address and version of each (an
    address is never reused, see :mod:`tunecl.backend.memory`; an alias made by ``detach`` shares both)."""
    return tuple(None if t is None else (t.data_ptr(), -1 if t.is_inference() else t._version) for t in sources)


def _unwatch(storages: list[int], listener: _Listener) -> None:
    for storage in storages:
        weight_cache.unwatch_writes(storage, listener)
    storages.clear()
