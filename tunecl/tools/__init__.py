"""Net-level tools behind ``tunecl bench`` and ``tunecl validate``: whole models on the opencl device.

Helpers shared by :mod:`tunecl.tools.bench` and :mod:`tunecl.tools.validate`. Nothing here imports
``tunecl.backend`` at module level: the torch-CUDA peer of ``tunecl bench`` runs
:mod:`tunecl.tools.bench` in a child process that must never load the backend (backend notes §8:
with a PrivateUse1 backend loaded, CUDA ``backward()`` can fail, pytorch#161129).
"""

from __future__ import annotations

import copy
import difflib
import os
from typing import Any

from tunecl.errors import TuneclError


def use_device(selector: str | None) -> str:
    """Make the backend's ``opencl:0`` the device ``selector`` names and return its name.

    The backend has one device, chosen from ``TUNECL_DEVICE`` when it is first used, so the selector
    is written there before that happens. ``None`` keeps ``TUNECL_DEVICE`` (default ``0``).

    Raises:
        DeviceNotFoundError: nothing matches ``selector`` (the message lists the devices).
        TuneclError: the backend already runs on another device in this process.
    """
    from tunecl import runtime

    entry = runtime.resolve(selector) if selector is not None else None
    import torch

    import tunecl.backend  # noqa: F401  (registers the opencl device and torch.opencl)

    if entry is not None:
        if not torch.opencl.is_initialized():
            os.environ["TUNECL_DEVICE"] = str(selector)
        current = torch.opencl.get_device_properties()
        if current["index"] != entry.index:
            raise TuneclError(
                f"opencl:0 is already device {current['index']} ({current['name']}) in this process; "
                f"--device {selector} selects device {entry.index} ({entry.name}): the backend picks its "
                f"one device once, from TUNECL_DEVICE, before its first use")
    return torch.opencl.get_device_name()


def load_model(name: str, image_size: int | None = None) -> Any:
    """:func:`tunecl.search.workload.build_model` with user-facing errors (close matches for a typo)."""
    from tunecl.search.workload import build_model

    try:
        return build_model(name, image_size)
    except ValueError as error:
        if ":" in name or not str(error).startswith("unknown model"):
            raise TuneclError(f"cannot build {name!r}: {error}") from None
        import torchvision

        known = torchvision.models.list_models(module=torchvision.models)
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
        hint = f"close matches: {', '.join(close)}" if close else "no close match"
        raise TuneclError(f"unknown model {name!r} ({hint}); torchvision classification models are listed "
                          f"by torchvision.models.list_models(), or give package.module:factory") from None
    except (ImportError, AttributeError) as error:
        raise TuneclError(f"cannot build {name!r}: {error}") from None


def output_classes(model: Any, batch: int, image_size: int, train: bool = False) -> int:
    """The number of classes the model predicts, from one forward on the ``meta`` device (no compute).

    Raises:
        TuneclError: the model cannot take ``batch`` x 3 x ``image_size`` x ``image_size`` (typically an
            image too small for its downsampling, or with ``train`` a batch norm over one value per
            channel), or does not return ``batch`` x classes logits.
    """
    import torch

    probe = copy.deepcopy(model).to("meta").train(train)
    try:
        with torch.no_grad():
            out = probe(torch.empty(batch, 3, image_size, image_size, device="meta"))
    except (RuntimeError, ValueError) as error:
        mode = "in train mode " if train else ""
        raise TuneclError(f"the model cannot take a {batch}x3x{image_size}x{image_size} input {mode}(is the "
                          f"image size or batch too small for it?): {str(error).splitlines()[0]}") from None
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != batch:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise TuneclError(f"expected classification logits of shape ({batch}, classes), got {shape}")
    return int(out.shape[1])


def make_inputs(batch: int, image_size: int, classes: int, seed: int = 0) -> tuple[Any, Any]:
    """A random image batch and labels on the CPU, from their own seeded generator."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, image_size, image_size, generator=generator)
    y = torch.randint(0, classes, (batch,), generator=generator)
    return x, y


def make_batch(model: Any, batch: int, image_size: int, train: bool = False, seed: int = 0) -> tuple[Any, Any]:
    """Inputs and labels on the CPU that ``model`` takes, from their own seeded generator.

    An image classifier gets :func:`make_inputs`. A model with an ``example_batch(batch, size,
    generator)`` method (the ``hf:`` language models: ``size`` is the sequence length) makes its own,
    and one meta-device forward checks that its logits have a row per label.

    Raises:
        TuneclError: the model cannot take such a batch.
    """
    import torch

    example = getattr(model, "example_batch", None)
    if example is None:
        return make_inputs(batch, image_size, output_classes(model, batch, image_size, train), seed)
    x, y = example(batch, image_size, torch.Generator().manual_seed(seed))
    probe = copy.deepcopy(model).to("meta").train(train)
    try:
        with torch.no_grad():
            out = probe(x.to("meta"))
    except (RuntimeError, ValueError, IndexError) as error:
        raise TuneclError(f"the model cannot take a {'x'.join(map(str, x.shape))} input: "
                          f"{str(error).splitlines()[0]}") from None
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != y.shape[0]:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise TuneclError(f"expected logits of shape ({y.shape[0]}, classes) for {y.shape[0]} labels, got {shape}")
    return x, y


def model_and_inputs(net: str, batch: int, image_size: int, train: bool, seed: int = 0) -> tuple[Any, Any, Any]:
    """``net`` on the CPU with random weights (``torch.manual_seed(seed)`` first) and a batch of inputs
    and labels it takes (:func:`make_batch`; ``image_size`` is the sequence length of a language model).

    Raises:
        TuneclError: an unknown model, or an input it cannot take.
    """
    import torch

    torch.manual_seed(seed)
    model = load_model(net, image_size)
    x, y = make_batch(model, batch, image_size, train, seed)
    return model, x, y


def synchronize(device: str) -> None:
    """Wait for the device (``torch.opencl.synchronize()``, ``torch.cuda.synchronize()``; CPU: no-op)."""
    import torch

    kind = torch.device(device).type
    if kind != "cpu":
        getattr(torch, kind).synchronize()
