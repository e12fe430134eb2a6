"""Workload extraction: the unique conv and GEMM problems a torchvision model asks for.

The model runs once on the ``meta`` device (no memory, no arithmetic) with forward hooks on every
``nn.Conv2d``, ``nn.ConvTranspose2d`` and ``nn.Linear``; each call becomes a :class:`ConvProblem`
(forward, and with ``train=True`` also backward-data and backward-weight) or a :class:`GemmProblem`,
counted by how often it occurs. A transposed convolution is recorded as the regular convolution the
backend runs it as (:meth:`ConvProblem.transposed`): its forward is that problem's backward-data, its
input gradient the forward and its weight gradient the backward-weight. ``nn.Linear(x) = x @ W.T + b`` is the GEMM M=batch, N=out_features, K=in_features with B
transposed; its backward adds dX = dY @ W (M=batch, N=in, K=out) and dW = dY.T @ X (M=out, N=in,
K=batch, A transposed).
"""

from __future__ import annotations

import collections
import difflib
import importlib
import textwrap
from typing import Any

from tunecl.problems import ConvProblem, GemmProblem, Problem


def build_model(name: str, image_size: int | None = None) -> Any:
    """A model by torchvision name (``resnet50``), ``hf:`` name (:mod:`tunecl.language_models`) or
    ``package.module:factory``, with random weights. ``image_size`` is passed to the torchvision builders
    that fix their input size (the vision transformers ``vit_*``), as ``image_size``."""
    from tunecl import language_models

    if name.startswith(language_models.PREFIX):
        return language_models.build(name)
    if ":" in name:
        module_name, _, factory = name.partition(":")
        return getattr(importlib.import_module(module_name), factory)()
    import torchvision

    try:
        factory = torchvision.models.get_model_builder(name)
    except ValueError:
        known = sorted(torchvision.models.list_models(module=torchvision.models))
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.7)
        hint = f" (close matches: {', '.join(close)})" if close else ""
        # the 80-odd names wrapped, not one line of 1,200 characters
        names = textwrap.fill(", ".join(known), width=100, initial_indent="  ", subsequent_indent="  ",
                              break_on_hyphens=False)
        raise ValueError(f"unknown model {name!r}{hint}; the torchvision classification models are:\n"
                         f"{names}\nor give package.module:factory") from None
    kwargs = {"aux_logits": False, "init_weights": False} if name in ("inception_v3", "googlenet") else {}
    if image_size is not None and name.startswith("vit_"):
        kwargs["image_size"] = image_size
    return factory(weights=None, **kwargs)


def extract(model: Any, batch: int, image_size: int, train: bool = False) -> collections.Counter[Problem]:
    """Count the conv and GEMM problems one forward (and, with ``train``, backward) pass asks for."""
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

    def on_linear(module: torch.nn.Linear, inputs: tuple, output: torch.Tensor) -> None:
        x = inputs[0]
        rows = x.numel() // x.shape[-1]
        found[GemmProblem(rows, module.out_features, module.in_features, trans_b=True)] += 1
        if train:
            found[GemmProblem(module.out_features, module.in_features, rows, trans_a=True)] += 1
            if x.requires_grad:
                found[GemmProblem(rows, module.in_features, module.out_features)] += 1

    hooks = []
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            hooks.append(module.register_forward_hook(on_conv))
        elif isinstance(module, torch.nn.ConvTranspose2d):
            hooks.append(module.register_forward_hook(on_conv_transpose))
        elif isinstance(module, torch.nn.Linear):
            hooks.append(module.register_forward_hook(on_linear))
    try:
        model = model.to("meta").train(train)
        x = torch.empty(batch, 3, image_size, image_size, device="meta")
        with torch.set_grad_enabled(train):
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return found


def net_problems(name: str, batch: int = 16, image_size: int = 224,
                 train: bool = False) -> collections.Counter[Problem]:
    """:func:`extract` for a model given by name (see :func:`build_model`)."""
    return extract(build_model(name), batch, image_size, train)
