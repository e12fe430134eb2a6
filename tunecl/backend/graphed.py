"""``torch.opencl.make_graphed_callables``: modules or functions whose forward and backward are replayed
from device graphs, the counterpart of ``torch.cuda.make_graphed_callables``.

Where :func:`tunecl.backend.graphs.graph` captures a whole step, this graphs a part of it and leaves the
rest (the loss, the optimizer, data-dependent code) eager::

    model = make_graphed_callables(model, (sample_x,))   # sample_x: an opencl tensor of the batch's shape
    for x, y in loader:
        loss = F.cross_entropy(model(x.to("opencl")), y.to("opencl"))   # the forward: a replay
        loss.backward()                                                 # its backward: a replay
        optimizer.step()

For each callable, after ``num_warmup_iters`` eager forward+backward passes on the sample arguments, the
forward is captured into one graph and the backward (``torch.autograd.grad`` of the outputs that require
grad, with respect to the arguments and parameters that do) into another. The callable becomes an autograd
function: a call copies its tensor arguments into the sample arguments (the graphs' static inputs) and
replays the forward graph; its backward copies the incoming gradients into static ones and replays the
backward graph; the parameters' gradients then accumulate into ``.grad`` eagerly, as usual. A module's
``forward`` is replaced by one that does this while the module is in the training mode it was captured in,
and runs the original forward otherwise.

As with CUDA: arguments must have the sample arguments' shapes, dtypes and layouts (checked); the
outputs are the forward graph's static tensors, rewritten by the next call (clone what must outlive it);
keyword arguments, hooks on the module and capture-time Python values are as for any graph
(:mod:`tunecl.backend.graphs`). Everything a forward does to the module's buffers (batch norm's running
statistics) is replayed with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.function import once_differentiable
from torch.utils._pytree import tree_flatten, tree_unflatten

from tunecl.backend.graphs import Graph, graph


def make_graphed_callables(callables: Any, sample_args: Any, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False) -> Any:
    """Graphed versions of ``callables`` (a module or function, or a tuple of them) for calls shaped like
    ``sample_args`` (a tuple of opencl tensors, or a tuple of such tuples); see the module docstring."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if len(callables) != len(sample_args):
        raise ValueError(f"{len(callables)} callables but {len(sample_args)} sample argument tuples")
    graphed = tuple(_graph_one(fn, tuple(args), num_warmup_iters, allow_unused_input)
                    for fn, args in zip(callables, sample_args))
    return graphed[0] if single else graphed


def _graph_one(fn: Any, static_inputs: tuple[torch.Tensor, ...], warmup: int, allow_unused: bool) -> Any:
    module = fn if isinstance(fn, torch.nn.Module) else None
    if module is not None and (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks):
        raise ValueError("make_graphed_callables: a module with hooks cannot be graphed (a replay skips them)")
    for arg in static_inputs:
        if not isinstance(arg, torch.Tensor) or arg.device.type != "opencl":
            raise TypeError(f"make_graphed_callables: sample arguments must be opencl tensors, not {arg!r:.60}")
    params = tuple(p for p in module.parameters() if p.requires_grad) if module is not None else ()
    differentiable = tuple(t for t in static_inputs + params if t.requires_grad)

    def backward_of(outputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor]) -> tuple:
        return torch.autograd.grad(outputs, differentiable, grad_outputs=grad_outputs, only_inputs=True,
                                   allow_unused=allow_unused) if outputs and differentiable else ()

    for _ in range(warmup):   # eagerly: lazy state, plans and kernels are made before the captures
        flat, _ = tree_flatten(fn(*static_inputs))
        wanting = [o for o in flat if isinstance(o, torch.Tensor) and o.requires_grad]
        backward_of(wanting, [torch.ones_like(o) for o in wanting])
    forward_graph, backward_graph = Graph(), Graph()
    with graph(forward_graph):
        static_outputs, spec = tree_flatten(fn(*static_inputs))
    wants_grad = [isinstance(o, torch.Tensor) and o.requires_grad for o in static_outputs]
    static_grad_outputs = [torch.empty_like(o) if w else None for o, w in zip(static_outputs, wants_grad)]
    with graph(backward_graph):
        grads = iter(backward_of([o for o, w in zip(static_outputs, wants_grad) if w],
                                 [g for g in static_grad_outputs if g is not None]))
        static_grads = tuple(next(grads) if t.requires_grad else None for t in static_inputs + params)

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: torch.Tensor) -> tuple:
            for static, new in zip(static_inputs, inputs):
                if new.data_ptr() != static.data_ptr():
                    static.copy_(new)
            forward_graph.replay()
            return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in static_outputs)

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, *grad_outputs: torch.Tensor | None) -> tuple:
            for static, new in zip(static_grad_outputs, grad_outputs):
                if static is not None:
                    if new is None:
                        static.zero_()
                    elif new.data_ptr() != static.data_ptr():
                        static.copy_(new)
            backward_graph.replay()
            return tuple(None if g is None else g.detach() for g in static_grads)

    def graphed(*args: torch.Tensor, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError("a graphed callable takes positional tensor arguments only")
        _check_like(args, static_inputs)
        return tree_unflatten(list(Graphed.apply(*args, *params)), spec)

    # the graphs and their static tensors live as long as the graphed callable
    graphed.graphs = (forward_graph, backward_graph)   # type: ignore[attr-defined]
    if module is None:
        return graphed
    original, training = module.forward, module.training

    def forward(*args: Any, **kwargs: Any) -> Any:
        return graphed(*args, **kwargs) if module.training == training else original(*args, **kwargs)

    module.forward = forward   # type: ignore[method-assign]
    return module


def _check_like(args: Sequence[Any], static_inputs: Sequence[torch.Tensor]) -> None:
    if len(args) != len(static_inputs):
        raise TypeError(f"the graphed callable takes {len(static_inputs)} tensor arguments, got {len(args)}")
    for i, (new, static) in enumerate(zip(args, static_inputs)):
        if not isinstance(new, torch.Tensor) or (new.shape, new.dtype, new.stride()) != (
                static.shape, static.dtype, static.stride()) or new.device != static.device:
            described = (f"{tuple(new.shape)} {new.dtype} on {new.device}" if isinstance(new, torch.Tensor)
                         else type(new).__name__)
            raise ValueError(f"argument {i} of a graphed callable must be like its sample argument "
                             f"({tuple(static.shape)} {static.dtype}, strides {static.stride()}, on {static.device}), "
                             f"not {described}")

