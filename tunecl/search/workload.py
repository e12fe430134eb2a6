"""Workload extraction: the unique conv and GEMM problems a model asks for (torchvision's nets, the
``hf:`` language models, ``package.module:factory``).

The model runs once on the ``meta`` device (no memory, no arithmetic); with ``train=True`` also its
backward from a dense output gradient (what a loss gives). Forward hooks on every ``nn.Conv2d`` and ``nn.ConvTranspose2d``
turn each call into a :class:`ConvProblem` (forward, and with ``train=True`` also backward-data and
backward-weight), counted by how often it occurs. A transposed convolution is recorded as the regular
convolution the backend runs it as (:meth:`ConvProblem.transposed`): its forward is that problem's
backward-data, its input gradient the forward and its weight gradient the backward-weight.

Every matrix product dispatched meanwhile (``mm``, ``addmm``, ``bmm``, ``baddbmm``: linear layers forward
and backward, attention's products) becomes the :class:`GemmProblem` the backend runs for it, with the
operand layouts (``trans_a``/``trans_b``) and batch it reads them in. ``nn.Linear(x) = x @ W.T + b`` is
the GEMM M=rows, N=out_features, K=in_features with B transposed; its backward adds dX = dY @ W (M=rows,
N=in, K=out) and dW = dY.T @ X (M=out, N=in, K=rows, A transposed).
"""

from __future__ import annotations

import collections
import difflib
import functools
import importlib
import textwrap
from collections.abc import Callable
from typing import Any

from tunecl.problems import ConvProblem, GemmProblem, Problem


def model_builder(name: str, image_size: int | None = None) -> Callable[[], Any]:
    """What builds the model :func:`build_model` names, found without building it (a bad name fails
    before any model is built).

    Raises:
        ValueError: an unknown torchvision or ``hf:`` name (the message names close matches and the
            known models).
        ImportError, AttributeError: a ``package.module:factory`` that is not there.
    """
    from tunecl import language_models

    if name.startswith(language_models.PREFIX):
        return language_models.builder(name)
    if ":" in name:
        module_name, _, factory = name.partition(":")
        return getattr(importlib.import_module(module_name), factory)
    import torchvision

    try:
        builder = torchvision.models.get_model_builder(name)
    except ValueError:
        known = sorted(torchvision.models.list_models(module=torchvision.models))
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.7)
        hint = f" (close matches: {', '.join(close)})" if close else ""
        # the 80-odd names wrapped, not one line of 1,200 characters
        names = textwrap.fill(", ".join(known), width=100, initial_indent="  ", subsequent_indent="  ",
                              break_on_hyphens=False)
        raise ValueError(f"unknown model {name!r}{hint}; the torchvision classification models are:\n"
                         f"{names}\nor give package.module:factory") from None
    kwargs: dict[str, Any] = {"aux_logits": False, "init_weights": False} \
        if name in ("inception_v3", "googlenet") else {}
    if image_size is not None and name.startswith("vit_"):
        kwargs["image_size"] = image_size
    return functools.partial(builder, weights=None, **kwargs)


def build_model(name: str, image_size: int | None = None) -> Any:
    """A model by torchvision name (``resnet50``), ``hf:`` name (:mod:`tunecl.language_models`) or
    ``package.module:factory``, with random weights. ``image_size`` is passed to the torchvision builders
    that fix their input size (the vision transformers ``vit_*``), as ``image_size``."""
    return model_builder(name, image_size)()


def build_on_meta(build: Callable[[], Any]) -> Any:
    """``build()`` with its parameters on the meta device: no memory, no initialisation (what only
    shapes need). A constructor that reads tensor data (regnet's block widths) is run on the CPU and its
    model moved to the meta device."""
    import torch

    try:
        with torch.device("meta"):
            return build()
    except NotImplementedError:
        return build().to("meta")


def extract(model: Any, batch: int, image_size: int, train: bool = False) -> collections.Counter[Problem]:
    """Count the conv and GEMM problems one forward (and, with ``train``, backward) pass
    asks for; ``image_size`` is a language model's sequence length (a model with ``example_batch``)."""
    import torch

    found: collections.Counter[Problem] = collections.Counter()

    def on_conv(module: torch.nn.Conv2d, inputs: tuple, output: torch.Tensor) -> None:
        x = inputs[0]
        if isinstance(module.padding, str):  # "same"/"valid": torch has resolved it for this call
            raise ValueError("string padding is not supported by workload extraction")
        problem = ConvProblem(
            n=x.shape[0], c=x.shape[1], h=x.shape[2], w=x.shape[3], k=module.out_channels,
            r=module.kernel_size[0], s=module.kernel_size[1], stride=module.stride, padding=module.padding,
            dilation=module.dilation, groups=module.groups)
        found[problem] += 1
        if train:
            found[problem.with_direction("bwd_weight")] += 1
            if x.requires_grad:  # the first layer's input needs no gradient
                found[problem.with_direction("bwd_data")] += 1

    def on_conv_transpose(module: torch.nn.ConvTranspose2d, inputs: tuple, output: torch.Tensor) -> None:
        x = inputs[0]
        # the output_padding of this call, read off the output (an ``output_size`` argument sets it)
        extra = tuple(out - ((size - 1) * st - 2 * pad + dil * (kernel - 1) + 1) for out, size, st, pad, dil, kernel
                      in zip(output.shape[2:], x.shape[2:], module.stride, module.padding, module.dilation,
                             module.kernel_size))
        try:
            problem = ConvProblem.transposed(
                n=x.shape[0], c=x.shape[1], h=x.shape[2], w=x.shape[3], k=module.out_channels,
                r=module.kernel_size[0], s=module.kernel_size[1], stride=module.stride, padding=module.padding,
                output_padding=extra, dilation=module.dilation, groups=module.groups)
        except ValueError:  # output_padding ≥ stride: no regular problem, the backend runs it on the CPU
            return
        found[problem.with_direction("bwd_data")] += 1
        if train:
            found[problem.with_direction("bwd_weight")] += 1
            if x.requires_grad:
                found[problem] += 1

    hooks = []
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            hooks.append(module.register_forward_hook(on_conv))
        elif isinstance(module, torch.nn.ConvTranspose2d):
            hooks.append(module.register_forward_hook(on_conv_transpose))
    try:
        model = model.to("meta").train(train)
        example = getattr(model, "example_batch", None)
        if example is None:
            x = torch.empty(batch, 3, image_size, image_size, device="meta")
        else:   # token ids (the values do not matter on the meta device)
            x = example(batch, image_size, torch.Generator().manual_seed(0))[0].to("meta")
        with _gemm_recorder(found), torch.set_grad_enabled(train):
            out = model(x)
            if train:   # a dense gradient of the output's shape and layout, as a loss's backward gives
                out.backward(torch.empty_like(out))
    finally:
        for hook in hooks:
            hook.remove()
    return found


_PRODUCTS = ("mm", "addmm", "bmm", "baddbmm")


def _transposed(shape: Any, stride: Any) -> bool:
    """Whether the backend reads this operand as the transpose of a row-major matrix (what
    ``tunecl.backend.ops.linalg._layout`` decides from its last two dims; an operand that is neither
    layout is copied to row-major first)."""
    rows, cols = shape[-2], shape[-1]
    s_row, s_col = stride[-2], stride[-1]
    if (s_col == 1 or cols == 1) and (rows == 1 or s_row >= max(cols, 1)):
        return False
    return (s_row == 1 or rows == 1) and (cols == 1 or s_col >= max(rows, 1))


def gemm_of(name: str, args: tuple) -> GemmProblem | None:
    """The :class:`GemmProblem` the backend runs for ``aten.<name>`` (mm, addmm, bmm, baddbmm) called with
    ``args``, or None where it runs none (an empty product, a dtype without GEMM kernels)."""
    a, b = args[1:3] if name in ("addmm", "baddbmm") else args[:2]
    dtype = str(a.dtype).removeprefix("torch.")
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if min(m, k, n) == 0 or a.dim() == 3 and a.shape[0] == 0 or dtype not in ("float32", "float16"):
        return None
    return GemmProblem(m, n, k, _transposed(a.shape, a.stride()), _transposed(b.shape, b.stride()),
                       a.shape[0] if a.dim() == 3 else 1, dtype)


def _gemm_recorder(found: collections.Counter[Problem]) -> Any:
    """A dispatch mode that counts every matrix product (``aten.mm``/``addmm``/``bmm``/``baddbmm``) run
    while it is active into ``found``, as the GEMM problem the backend runs for it: linear layers
    (``nn.Linear``, Hugging Face's ``Conv1D``, attention in-projections) forward and backward, and
    attention's score and context products."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class GemmRecorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            name = func.overloadpacket.__name__
            if name in _PRODUCTS:
                problem = gemm_of(name, args)
                if problem is not None:
                    found[problem] += 1
            return func(*args, **(kwargs or {}))

    return GemmRecorder()


def net_problems(name: str, batch: int = 16, image_size: int = 224,
                 train: bool = False) -> collections.Counter[Problem]:
    """:func:`extract` for a model given by name (see :func:`build_model`; ``image_size`` is a language
    model's sequence length), built on the meta device (:func:`build_on_meta`)."""
    return extract(build_on_meta(model_builder(name, image_size)), batch, image_size, train)
