"""``tunecl validate --locate``: the modules where a model's run on the opencl device first departs from
float64 further than CPU float32 does.

The model runs three times as in :mod:`tunecl.tools.validate` (the same weights, inputs and seed, and the
CPU's dropout masks on the device): on the device, on the CPU in float32 and on the CPU in float64. A
forward hook on every module keeps its output; with ``train``, a hook on that output keeps the gradient
that reaches it in the backward of the cross-entropy loss. A module *departs* where the device's normwise
error against float64 exceeds the bound of :meth:`Tolerances.within_fp64` (a multiple of CPU float32's
error, plus a floor). Errors propagate, so the first departing modules of each phase (forward outputs in
the order the modules ran, output gradients in the order the backward reached them) are where to look:
the later ones usually inherit the error.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tunecl import config
from tunecl.tools import make_batch, use_device
from tunecl.tools.tolerances import Tolerances
from tunecl.tools.validate import reference_failed, seeded_models

MODEL = "(model)"   # the name the whole model's output goes by


@dataclasses.dataclass
class Departure:
    """A module output (``phase`` "output") or the gradient reaching it (``phase`` "gradient") whose device
    error against float64 (``device_error``, normwise) exceeds the bound for CPU float32's (``cpu_error``)."""

    phase: str
    module: str
    kind: str
    shape: tuple[int, ...]
    device_error: float
    cpu_error: float


@dataclasses.dataclass
class Located:
    """What :func:`locate` found: the departures, the first ``limit`` of each phase, and how many module
    outputs (and gradients) were compared."""

    net: str
    device: str
    train: bool
    departures: list[Departure]
    outputs: int
    gradients: int

    @property
    def exit_code(self) -> int:
        return 1 if self.departures else 0


def locate(net: str, *, device: str | None = None, train: bool = False, batch: int = 2, image_size: int = 64,
           seed: int = 0, limit: int = 10, tolerances: Tolerances | None = None) -> Located:
    """Run ``net`` on the device, the CPU and the CPU in float64, and compare every module's output (and with
    ``train`` the gradient reaching it); see the module docstring.

    Raises:
        TuneclError: unknown model or device, or a CPU run that fails (nothing to compare with).
    """
    tolerances = tolerances or Tolerances()
    device_name = use_device(device)
    cpu_model, dev_model, fp64_model = seeded_models(net, image_size, seed)
    x, y = make_batch(cpu_model, batch, image_size, train, seed)
    try:
        cpu = _trace(cpu_model, x, y, "cpu", train, seed)
        ref = _trace(fp64_model, x.double() if x.is_floating_point() else x, y, "cpu", train, seed)
    except (RuntimeError, ValueError) as error:
        raise reference_failed(error) from None
    import tunecl.backend  # noqa: F401  (the opencl device)

    with config.override(random="host"):   # the CPU's dropout masks
        dev = _trace(dev_model.to("opencl"), x, y, "opencl", train, seed)
    kinds = {name or MODEL: type(module).__name__ for name, module in cpu_model.named_modules()}
    departures = []
    for phase, index in (("output", 0), ("gradient", 1)):
        found = 0
        for key, want in ref[index].items():
            got, base = dev[index].get(key), cpu[index].get(key)
            if got is None or base is None or got.shape != want.shape:
                continue
            dev_error, cpu_error = _error(got, want), _error(base, want)
            if not tolerances.within_fp64(dev_error, cpu_error) and found < limit:
                name = key.split("#")[0]
                departures.append(Departure(phase, key, kinds.get(name, ""), tuple(want.shape), dev_error,
                                            cpu_error))
                found += 1
    return Located(net, f"opencl:0 {device_name}", train, departures, len(ref[0]), len(ref[1]))


def _error(got: Any, want: Any) -> float:
    """``||got - want|| / ||want||`` (float64), the difference's own norm where ``want`` is zero."""
    scale = float(want.norm())
    return float((got - want).norm()) / (scale if scale > 0 else 1.0)


def _trace(model: Any, x: Any, y: Any, device: str, train: bool, seed: int) -> tuple[dict, dict]:
    """(module outputs in the order the modules ran, gradients in the order the backward reached them), as
    float64 CPU tensors by module name (``name#k`` for a module's k-th call after its first)."""
    import torch
    import torch.nn.functional as F

    outputs: dict[str, Any] = {}
    gradients: dict[str, Any] = {}
    calls: dict[str, int] = {}

    def keep(name: str, output: Any) -> None:
        if not isinstance(output, torch.Tensor) or not output.is_floating_point():
            return
        count = calls[name] = calls.get(name, -1) + 1
        key = name if not count else f"{name}#{count}"
        outputs[key] = output.detach().to("cpu", torch.float64)
        if train and output.requires_grad:
            output.register_hook(lambda grad, key=key: gradients.__setitem__(
                key, grad.detach().to("cpu", torch.float64)))

    handles = [module.register_forward_hook(lambda _m, _i, out, name=name or MODEL: keep(name, out))
               for name, module in model.named_modules()]
    try:
        model.train(train)
        torch.manual_seed(seed)
        if train:
            out = model(x.to(device))
            F.cross_entropy(out, y.to(device)).backward()
        else:
            with torch.no_grad():
                model(x.to(device))
    finally:
        for handle in handles:
            handle.remove()
    return outputs, gradients
