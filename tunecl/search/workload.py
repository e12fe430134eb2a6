"""Workload extraction: the unique conv, GEMM and attention problems a model asks for (torchvision's
nets, the ``hf:`` language models, ``package.module:factory``).

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

A ``scaled_dot_product_attention`` call that the backend's fused kernels compute
(:func:`tunecl.kernels.attention.unsupported` says which) becomes their :class:`AttentionProblem`, and with
``train=True`` (where the query, key or value needs a gradient) also its backward; its products are then not
recorded (the call runs as a shape-only stand-in on the meta device). Any other call (grouped-query heads,
a mask that needs a gradient, dropout where the backend draws it on the host: CPU devices or
``TUNECL_RANDOM=host``) records the matrix products of torch's math path, which the backend runs for it.
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import functools
import importlib
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

from tunecl import config
from tunecl.kernels import attention
from tunecl.problems import AttentionProblem, ConvProblem, GemmProblem, Problem


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


def extract(model: Any, batch: int, image_size: int, train: bool = False,
            device_type: str = "gpu") -> collections.Counter[Problem]:
    """Count the conv, GEMM and attention problems one forward (and, with ``train``, backward) pass
    asks for on a device of ``device_type`` (``Fingerprint.device_type``: which attention calls train on
    the fused kernels depends on it); ``image_size`` is a language model's sequence length (a model with
    ``example_batch``)."""
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
        with _attention_recorder(found, device_type), _gemm_recorder(found), torch.set_grad_enabled(train):
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


def _sdpa_call(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
               is_causal: bool = False, *, scale: float | None = None, enable_gqa: bool = False) -> tuple:
    """``scaled_dot_product_attention``'s arguments, bound as it binds them."""
    return query, key, value, attn_mask, dropout_p, is_causal


def attention_of(args: tuple, kwargs: dict[str, Any] | None = None) -> AttentionProblem | None:
    """The forward :class:`AttentionProblem` the backend's fused kernels run for
    ``scaled_dot_product_attention(*args, **kwargs)``, or None where the call takes torch's math path."""
    query, key, value, mask, dropout, causal = _sdpa_call(*args, **(kwargs or {}))
    if any(t.is_nested for t in (query, key, value)):
        return None
    names = [str(t.dtype).removeprefix("torch.") for t in (query, key, value)]
    mask_dtype = None if mask is None else str(mask.dtype).removeprefix("torch.")
    if attention.unsupported(query.shape, key.shape, value.shape, names, None if mask is None else mask.shape,
                             mask_dtype, mask is not None and mask.requires_grad, dropout, causal) is not None:
        return None
    return attention.problem_of(query.shape, key.shape, value.shape, names[0], mask_dtype, causal, "fwd")


@contextlib.contextmanager
def _attention_recorder(found: collections.Counter[Problem], device_type: str = "gpu") -> Iterator[None]:
    """While active, ``torch.nn.functional.scaled_dot_product_attention`` (what ``nn.MultiheadAttention``,
    Hugging Face's models and most code call) counts every call the fused kernels compute into ``found``
    (forward, and backward where the query, key or value needs a gradient) and runs it as
    :func:`_stand_in`, whose forward and backward run no matrix products; other calls run as they are."""
    import torch
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def recording(*args: Any, **kwargs: Any) -> Any:
        problem = attention_of(args, kwargs)
        if problem is None:
            return original(*args, **kwargs)
        query, key, value, _, dropout = _sdpa_call(*args, **kwargs)[:5]
        if dropout > 0.0 and not attention.dropout_on_device(device_type, config.get().random):
            return original(*args, **kwargs)   # the math path, as the backend draws dropout on the host
        backward = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if backward and attention.math_for_training(device_type, query.shape, key.shape):
            return original(*args, **kwargs)   # the math path, as the backend trains there
        found[problem] += 1
        if backward:
            found[problem.with_direction("bwd")] += 1
        return _stand_in().apply(query, key, value)

    F.scaled_dot_product_attention = recording
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


@functools.cache
def _stand_in() -> Any:
    """An autograd function with the fused attention's output (in the query's dim order, as the backend
    allocates it) and gradients (in the inputs' layouts), computing nothing: the extraction runs on the
    meta device, where only shapes and strides matter."""
    import torch

    class FusedStandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, query: Any, key: Any, value: Any) -> Any:
            shape = (*query.shape[:-1], value.shape[-1])
            order = sorted(range(query.dim()), key=lambda i: query.stride()[i], reverse=True)
            strides, step = [0] * query.dim(), 1
            for i in reversed(order):
                strides[i] = step
                step *= shape[i]
            ctx.save_for_backward(query, key, value)
            return query.new_empty_strided(shape, strides)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return tuple(torch.empty_like(t) for t in ctx.saved_tensors)

    return FusedStandIn


def net_problems(name: str, batch: int = 16, image_size: int = 224, train: bool = False,
                 device_type: str = "gpu") -> collections.Counter[Problem]:
    """:func:`extract` for a model given by name (see :func:`build_model`; ``image_size`` is a language
    model's sequence length), built on the meta device (:func:`build_on_meta`)."""
    return extract(build_on_meta(model_builder(name, image_size)), batch, image_size, train, device_type)
