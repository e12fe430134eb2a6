"""``torch.compile(model, backend="tunecl")``: dynamo's graphs replayed from device graphs.

The backend is registered under the ``torch_dynamo_backends`` entry point, so a fresh process finds it by
name (importing this module also registers the opencl device). It is built on AOTAutograd: dynamo's graph
is split into a forward and a backward graph (an inference graph under ``no_grad``), with parameters and
buffers as inputs. Each of those graphs runs eagerly once (the warm-up: lazily built state, plans and
kernels), is captured into a :class:`tunecl.backend.graphs.Graph` on its second call, and is replayed
after that: a call copies the inputs that are not the graph's own (the batch, incoming gradients) into the
graph's static inputs and enqueues the recorded commands, without running the graph's Python again; an
input the graph writes (``x.add_(y)`` in the compiled function) is copied back out of its static input after.

- Parameters, buffers and the tensors a forward saves for its backward are the graph's inputs in place:
  they are not copied, and a replay sees whatever was written into them since (optimizer steps,
  ``load_state_dict``, in-place writes). The saved tensors are the forward graph's static outputs, which
  live until the backward that reads them has run.
- A replay rewrites the graph's outputs in place. The forward's user-visible outputs are returned as
  copies, so a result kept across calls is never overwritten. The other outputs (saved tensors,
  gradients) are handed out as aliases of the graph's own tensors, each watched by a weak reference:
  a gradient becomes ``.grad`` (or is added into it), and ``zero_grad()`` lets go of it before the next
  backward. Where a replay would overwrite a tensor someone still holds (two forwards before a backward;
  a gradient kept from ``torch.autograd.grad``), that call runs eagerly instead, and such gradients are
  handed out as copies from then on.
- Random numbers (dropout's masks, ``bernoulli_``) are drawn anew by every replay: on the device from the
  graph's own generator (keyed from torch's CPU generator at capture; the default), or with
  ``TUNECL_RANDOM=host`` on the host from torch's CPU generator at their place in every replay, as eager
  ops then draw them, so that a compiled step draws what the eager one would under the same seed
  (``Graph(random_on_host=True)``, :mod:`tunecl.backend.graphs`, :mod:`tunecl.backend.random_draws`).
- An input that is another captured graph's tensor (the gradients an optimizer step is given are the
  backward's) is used in place, so passing the same tensor again costs no copy.
- What cannot be captured runs eagerly for that graph, with one warning naming why: a graph with CPU
  tensors or symbolic sizes, an op served by the CPU fallback or any other host copy
  (:class:`~tunecl.backend.graphs.GraphCaptureError`). A compile never fails where eager works; with
  ``TUNECL_FALLBACK=error`` an op without a kernel raises as it would eagerly.
- Recompiles (a new shape, dtype, train/eval) get graphs of their own; the graphs go with the compiled
  code. :func:`stats` counts captures, replays and eager calls with their reasons.
- Before a graph runs, it is rewritten: in an inference graph each convolution -> eval batch norm pair
  becomes one convolution with folded weights (:mod:`tunecl.backend.folding`), in a backward graph each
  relu or relu6 backward that feeds a batch norm's backward alone is read through by it
  (:mod:`tunecl.backend.norm_fusion`), and in every graph each
  run of pointwise ops becomes one generated kernel (:mod:`tunecl.backend.fusion`); ops whose results are
  written back into a mutated input are made in place where that is sound (:mod:`tunecl.backend.reinplace`:
  a compiled Adam step updates its parameters, moments and step counts where they are), each run of
  ``_foreach_*`` ops becomes one multi-tensor kernel (:mod:`tunecl.backend.foreach_fusion`), the batch
  norms' step-count increments become one launch (:mod:`tunecl.backend.step_counts`), and the copies
  that still write mutated inputs back are grouped into multi-tensor copies
  (:mod:`tunecl.backend.copy_backs`). Options switch them off: ``torch.compile(m, backend="tunecl",
  options={"fold_conv_bn": False, "fuse_norm_backward": False, "fuse_pointwise": False, "reinplace": False,
  "fuse_foreach": False, "group_step_counts": False, "group_copy_backs": False})``.
"""

from __future__ import annotations

import collections
import functools
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._inductor.utils import count_tangents

import tunecl.backend  # noqa: F401  (registers the opencl device)
from tunecl.backend import (copy_backs, folding, foreach_fusion, foreach_runs, fusion, graphs, norm_fusion,
                            random_draws, reinplace, step_counts)
from tunecl.backend.ops import foreach

_counts: collections.Counter[str] = collections.Counter()
_warned: set[str] = set()
_lock = threading.Lock()


def stats() -> dict[str, int]:
    """Counters of compiled graphs: ``captures``, ``replays``, ``warmups``, ``input_copies`` (inputs copied
    into a graph's static inputs), ``input_write_backs`` (inputs a graph writes, copied back out of its static
    inputs), ``output_copies``, ``eager_graphs`` (graphs that run eagerly for good),
    ``eager_calls:<reason>`` (calls of a captured graph run eagerly instead of replayed),
    ``captured_commands`` (device commands the captures hold: what their replays enqueue), and the
    rewrites: ``folded_conv_bn`` (convolution + batch norm pairs folded), ``fused_norm_backward`` (relu or
    relu6 backward + batch norm backward pairs made one call), ``fused_chains`` (runs of
    pointwise ops fused into one kernel), ``fused_ops`` (the ops in them), ``reinplaced_ops`` (ops made in
    place over a mutated input), ``in_place_activations`` (relu/relu6 of a batch norm's output made in place,
    so that they run inside its launch), ``dropped_clones`` (copies of values nothing writes),
    ``fused_foreach_runs`` and ``fused_foreach_ops`` (runs of ``_foreach_*`` ops made one multi-tensor
    kernel, and the ops in them), ``grouped_step_counts`` (batch norms' step-count
    increments made one multi-tensor launch) and ``grouped_copy_backs``
    (copies into mutated inputs made multi-tensor copies)."""
    return dict(_counts)


def reset_stats() -> None:
    _counts.clear()


def _warn_once(reason: str) -> None:
    with _lock:
        first = reason not in _warned
        _warned.add(reason)
    if first:
        warnings.warn(f"tunecl compile: a graph runs eagerly ({reason})", stacklevel=3)


def _why_not_capturable(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> str | None:
    """Why a graph cannot be captured as it stands, judged from its inputs and its nodes' example values."""
    # (a CPU tensor, 0-dim ones included, is read on the host: a replay would repeat the value it had at the
    # capture, e.g. a non-capturable optimizer's step count)
    for value in inputs:
        if isinstance(value, torch.SymInt):
            return "symbolic sizes: a graph replays fixed shapes"
        if isinstance(value, torch.Tensor) and value.device.type != "opencl":
            return f"a {value.device.type} tensor input: a graph replays device work only"
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.device.type not in ("opencl", "meta"):
            return f"node {node.name} computes on {value.device.type}"
    return None


class _Replayed:
    """One AOT graph: eager on its first call, captured on its second, replayed after (see the module
    docstring). ``aliased``: indices of inputs used in place (parameters, buffers, saved tensors);
    ``copied_outputs``: indices of outputs returned as copies (the forward's user-visible ones);
    ``gradients``: the outputs are gradients (see :meth:`_choose_handed_out`)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str,
                 aliased: set[int], copied_outputs: set[int], gradients: bool = False,
                 mutated: set[int] | frozenset[int] = frozenset()) -> None:
        self._boxed_call = True   # called with one list of arguments (an instance attribute: wrappers copy it)
        self.kind = kind
        self.gm = gm
        self.run_eagerly = boxed_nop(gm, list(example_inputs))
        self.aliased = aliased
        self.mutated = set(mutated)              # inputs the graph writes: a copy in is copied back out
        self.borrowed: set[int] = set()          # inputs over another graph's tensors, used in place
        self.copied_outputs = set(copied_outputs)
        self.gradients = gradients
        self.reason = _why_not_capturable(gm, example_inputs)
        if self.reason:
            _counts["eager_graphs"] += 1
            _warn_once(self.reason)
        self.calls = 0
        self.graph: graphs.Graph | None = None
        self.static_inputs: list[Any] = []
        self.static_addresses: list[int | None] = []   # each tensor input's data_ptr (None: not a tensor)
        self.static_outputs: list[Any] = []
        self.rewritten: list[int] = []           # outputs a replay rewrites, handed out as fresh aliases
        self.handed_out: list[tuple[int, weakref.ref]] = []   # (output index, alias) of the last call

    def release(self) -> None:
        """Free the capture (its buffers go back to the allocator); later calls run eagerly."""
        if self.graph is not None:
            self.graph.reset()
        self.graph, self.static_inputs, self.static_outputs, self.handed_out = None, [], [], []
        self.static_addresses = []
        self.reason = self.reason or "its capture was released (torch._dynamo.reset)"

    def __call__(self, args: list[Any]) -> Any:
        # a pending run goes first (the graph's kernels may read what it writes), and the graph's own
        # foreach ops join none: its rewrites launch kernels directly and fuse its foreach runs themselves
        with foreach_runs.paused():
            return self._call(args)

    def _call(self, args: list[Any]) -> Any:
        if self.reason:
            return self.run_eagerly(args)
        self.calls += 1
        if self.graph is None:
            if self.calls == 1:
                _counts["warmups"] += 1
                return self.run_eagerly(args)
            return self._capture(args)
        return self._replay(args)

    # -- capture -----------------------------------------------------------------------------------
    def _capture(self, args: list[Any]) -> Any:
        # in-place inputs are held as aliases of their own (a saved tensor the forward handed out must be
        # free to die); so are inputs over a tensor another captured graph holds (its output, e.g. a
        # gradient the backward handed out, which the next call passes again); the others are copied into
        # static tensors
        self.borrowed = {i for i, a in enumerate(args) if i not in self.aliased and isinstance(a, torch.Tensor)
                         and _storage(a) in _holders}
        static = [a if not isinstance(a, torch.Tensor) else
                  _alias(a) if i in self.aliased or i in self.borrowed else _static_copy(a)
                  for i, a in enumerate(args)]
        folding.refresh_before_capture(self.gm)
        graph = graphs.Graph(random_on_host=random_draws.on_host())
        try:
            with graphs.graph(graph):
                outputs = self.run_eagerly(list(static))
        except graphs.GraphCaptureError as error:
            self.reason = str(error).split(";")[0]
            _counts["eager_graphs"] += 1
            _warn_once(self.reason)
            return self.run_eagerly(args)
        self.graph, self.static_inputs, self.static_outputs = graph, static, list(outputs)
        self.static_addresses = [t.data_ptr() if isinstance(t, torch.Tensor) else None for t in static]
        _write_back([(static[i], args[i]) for i in self.mutated if static[i] is not args[i]
                     and isinstance(args[i], torch.Tensor) and static[i].data_ptr() != args[i].data_ptr()])
        _live.add(self)
        tensors = [t for t in (*static, *self.static_outputs) if isinstance(t, torch.Tensor)]
        _hold(self, tensors)
        self._choose_handed_out()
        _counts["captures"] += 1
        _counts["captured_commands"] += graph.commands
        args.clear()
        return self._hand_out()

    def _choose_handed_out(self) -> None:
        """Which outputs a replay rewrites, handed out as aliases of their own (the rest are returned as
        they are: those over an in-place input's storage, e.g. a parameter saved for the backward; or as
        copies: ``copied_outputs``). Gradients are handed out as aliases only where their storage is not
        an input's and not another output's: autograd takes a gradient over as ``.grad`` when that is
        None, and two ``.grad`` must not share storage."""
        in_place = {_storage(t) for i, t in enumerate(self.static_inputs)
                    if (i in self.aliased or i in self.borrowed) and isinstance(t, torch.Tensor)}
        every_input = {_storage(t) for t in self.static_inputs if isinstance(t, torch.Tensor)}
        seen: set[int] = set()
        self.rewritten = []
        for i, t in enumerate(self.static_outputs):
            if not isinstance(t, torch.Tensor) or i in self.copied_outputs:
                continue
            storage = _storage(t)
            if self.gradients and (storage in every_input or storage in seen):
                self.copied_outputs.add(i)
            elif storage not in in_place:
                self.rewritten.append(i)
            seen.add(storage)

    # -- replay ------------------------------------------------------------------------------------
    def _replay(self, args: list[Any]) -> Any:
        held = self._held_outputs()
        if held:
            _counts[f"eager_calls:an output of the last {self.kind} call is still in use"] += 1
            if self.gradients:   # (e.g. kept from torch.autograd.grad) handed out as copies from now on
                self.copied_outputs.update(held)
                self.rewritten = [i for i in self.rewritten if i not in self.copied_outputs]
            return self.run_eagerly(args)
        copies = []
        copied: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # (an input at its static tensor's address is that tensor: dynamo's guards fix a graph's input sizes,
        # strides and dtypes, and the backward's inputs are the forward's outputs or coerced to their layout)
        for i, (given, static, address) in enumerate(zip(args, self.static_inputs, self.static_addresses)):
            if address is None or given is static or given.data_ptr() == address:
                continue
            if (i in self.aliased or i in self.borrowed) and _held_elsewhere(static):
                # never write into a tensor someone holds
                _counts["eager_calls:an in-place input moved to another tensor"] += 1
                return self.run_eagerly(args)
            copies.append((static, given))
            copied[i] = (static, given)
        if not foreach.copy_all([static for static, _ in copies], [given for _, given in copies]):
            for static, given in copies:
                static.copy_(given)
        _counts["input_copies"] += len(copies)
        written = [(static, given) for i, (static, given) in copied.items() if i in self.mutated]
        args.clear()
        self.graph.replay()
        _counts["replays"] += 1
        _write_back(written)
        return self._hand_out()

    def _held_outputs(self) -> list[int]:
        """The outputs of the last call that a replay would rewrite and that are still held (a saved tensor
        whose backward has not run: two forwards before a backward; a gradient kept from
        ``torch.autograd.grad``): each is handed out as an alias of its own, dead once torch lets go of it."""
        return [i for i, ref in self.handed_out if ref() is not None]

    def _hand_out(self) -> list[Any]:
        outputs = list(self.static_outputs)
        # (user-visible results and gradients: a later replay must not rewrite them) copied in few launches
        copied = [i for i in self.copied_outputs if isinstance(outputs[i], torch.Tensor)]
        copies = foreach.clone_all([outputs[i] for i in copied])
        for k, i in enumerate(copied):
            outputs[i] = copies[k] if copies is not None else outputs[i].clone()
        _counts["output_copies"] += len(copied)
        handed_out = []
        ref = weakref.ref
        for i in self.rewritten:   # (never a Parameter: those are in-place inputs' storages, see above)
            outputs[i] = out = outputs[i].detach()
            handed_out.append((i, ref(out)))
        self.handed_out = handed_out
        return outputs


_live: weakref.WeakSet[_Replayed] = weakref.WeakSet()   # graphs holding a capture


def release_all() -> None:
    """Free every capture of the compiled graphs (``torch._dynamo.reset()`` calls this: torch keeps
    compiled functions, and with them their graphs, beyond the compiled module's life)."""
    for replayed in list(_live):
        replayed.release()
    _live.clear()


# storage -> ids of the tensors over it that compiled graphs hold (each holds a reference to the storage)
_holders: dict[int, set[int]] = collections.defaultdict(set)


def _write_back(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """``given.copy_(static)`` for each pair: the graph wrote an input through its static copy, and the
    caller's tensor must hold what an eager call would have left in it."""
    if pairs and not foreach.copy_all([given for _, given in pairs], [static for static, _ in pairs]):
        for static, given in pairs:
            given.copy_(static)
    _counts["input_write_backs"] += len(pairs)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _hold(owner: _Replayed, tensors: Sequence[torch.Tensor]) -> None:
    """Note that ``owner`` holds ``tensors`` (until it is collected)."""
    held = [(_storage(t), id(t)) for t in tensors]
    for storage, tensor in held:
        _holders[storage].add(tensor)
    weakref.finalize(owner, _let_go, held)


def _let_go(held: list[tuple[int, int]]) -> None:
    for storage, tensor in held:
        holders = _holders.get(storage)
        if holders is not None:
            holders.discard(tensor)
            if not holders:
                del _holders[storage]


def _held_elsewhere(t: torch.Tensor) -> bool:
    """Whether a tensor outside the compiled graphs shares ``t``'s storage (the storage object made to ask
    counts once)."""
    storage = t.untyped_storage()
    return torch._C._storage_Use_Count(storage._cdata) > 1 + len(_holders.get(storage.data_ptr(), ()))


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor object of its own over ``t``'s storage and version counter (``detach``: a microsecond, where
    a view op through the dispatcher costs tens)."""
    return t if isinstance(t, torch.nn.Parameter) else t.detach()


def _static_copy(t: torch.Tensor) -> torch.Tensor:
    static = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    static.copy_(t)
    return static


def _forward_layout() -> tuple[set[int], range]:
    """From AOTAutograd's metadata of the graph being compiled: the forward inputs torch keeps at fixed
    addresses (parameters and buffers), and the forward outputs the caller sees (not the mutated inputs'
    new values, which torch copies at once, nor the tensors saved for the backward)."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    if meta is None:
        return set(), range(0)
    mutated = meta.num_mutated_inp_runtime_indices
    return set(meta.static_input_indices or ()), range(mutated, mutated + meta.num_outputs
                                                         + meta.num_intermediate_bases)


def _rewrite(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any],
             inference: bool) -> None:
    """The graph-level rewrites of ``gm`` the options allow (see the module docstring), counted."""
    if inference and options.get("fold_conv_bn", True):
        _counts["folded_conv_bn"] += folding.fold_conv_bn(gm)
        if options.get("fuse_pointwise", True):
            _counts["biases_into_chains"] += folding.biases_into_pointwise(gm)
    if options.get("fuse_norm_backward", True):
        _counts["fused_norm_backward"] += norm_fusion.fuse_norm_backward(gm)
    if options.get("fuse_pointwise", True):
        runs = fusion.fuse_pointwise(gm)
        _counts["fused_chains"] += len(runs)
        _counts["fused_ops"] += sum(runs)
    if options.get("reinplace", True):
        _counts["reinplaced_ops"] += reinplace.reinplace_input_mutations(gm, list(example_inputs))
        _counts["dropped_clones"] += reinplace.drop_clones(gm)
        _counts["in_place_activations"] += reinplace.activations_in_place(gm)
    if options.get("fuse_foreach", True):
        runs = foreach_fusion.fuse_foreach(gm)
        _counts["fused_foreach_runs"] += len(runs)
        _counts["fused_foreach_ops"] += sum(runs)
    if options.get("group_step_counts", True):
        _counts["grouped_step_counts"] += step_counts.group_step_counts(gm)
    if options.get("group_copy_backs", True):
        _counts["grouped_copy_backs"] += copy_backs.group_copy_backs(gm)


def _mutated_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """The inputs a functional AOT graph writes (it ends with ``copy_(input, new_value)`` for each), by index."""
    placeholders = {node: i for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    return {placeholders[node.args[0]] for node in gm.graph.nodes
            if node.op == "call_function" and node.target is torch.ops.aten.copy_.default
            and node.args and node.args[0] in placeholders}


def _forward_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, inference: bool = False,
                      options: dict[str, Any]) -> Any:
    aliased, user_outputs = _forward_layout()   # (before the rewrites: they keep inputs and outputs)
    mutated = _mutated_inputs(gm)
    _rewrite(gm, example_inputs, options, inference)
    aliased |= {i for i, a in enumerate(example_inputs) if isinstance(a, torch.nn.Parameter)}
    return _Replayed(gm, example_inputs, "inference" if inference else "forward", aliased, set(user_outputs),
                     mutated=mutated)


def _backward_compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, options: dict[str, Any]) -> Any:
    mutated = _mutated_inputs(gm)
    _rewrite(gm, example_inputs, options, inference=False)
    return _Replayed(gm, example_inputs, "backward", set(range(count_tangents(gm))), set(), gradients=True,
                     mutated=mutated)


# the options, each True unless given False
REWRITES = ("fold_conv_bn", "fuse_norm_backward", "fuse_pointwise", "reinplace", "fuse_foreach",
            "group_step_counts", "group_copy_backs")


def tunecl_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, options: dict[str, Any] | None = None,
                   **kwargs: Any) -> Callable[..., Any]:
    """The dynamo backend ``"tunecl"`` (see the module docstring); ``options`` (``torch.compile``'s) may
    switch the rewrites of :data:`REWRITES` off."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(REWRITES)) + sorted(kwargs)
    if unknown:
        warnings.warn(f"tunecl compile: options {unknown} are not used", stacklevel=2)
    compile_with_aot = aot_autograd(
        fw_compiler=functools.partial(_forward_compiler, options=options),
        bw_compiler=functools.partial(_backward_compiler, options=options),
        inference_compiler=functools.partial(_forward_compiler, inference=True, options=options),
        keep_inference_input_mutations=True)
    return compile_with_aot(gm, example_inputs)


tunecl_backend.reset = release_all   # (dynamo's reset calls a backend's reset)


def _register_name() -> None:
    """Also register ``"tunecl"`` by name here, for runs from a source tree (the entry point needs the package
    installed)."""
    from torch._dynamo.backends import registry

    if "tunecl" not in registry._BACKENDS:
        registry.register_backend(compiler_fn=tunecl_backend, name="tunecl")


_register_name()
