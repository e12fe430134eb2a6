"""``tunecl.backend.amp.GradScaler``: torch's gradient scaler for the ``opencl`` device.

``torch.amp.GradScaler.unscale_`` takes the reciprocal of the scale in float64
(``scale.double().reciprocal().float()``) on every device but MPS, and the OpenCL device does not
store float64 (it refuses rather than silently downcasts). This subclass takes the float32
reciprocal instead, as torch does on MPS: with the default growth and backoff factors (2 and 0.5)
the scale is a power of two and its float32 reciprocal is exact. Everything else, including the
device kernels ``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_``, is torch's.
:func:`patch_torch_grad_scaler` makes ``torch.amp.GradScaler("opencl")`` construct this class.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.amp.grad_scaler import OptState


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("opencl", ...)`` whose ``unscale_`` needs no float64."""

    def __init__(self, device: str = "opencl", *args: Any, **kwargs: Any) -> None:
        super().__init__(device, *args, **kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        assert self._scale is not None
        inv_scale = self._scale.reciprocal()
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=self._scale.device)
        optimizer_state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, False)
        optimizer_state["stage"] = OptState.UNSCALED


def patch_torch_grad_scaler() -> None:
    """Make ``torch.amp.GradScaler("opencl", ...)`` construct :class:`GradScaler` (once), so code written
    for ``torch.amp.GradScaler(device)`` trains on the opencl device unchanged. Subclasses of torch's
    scaler and other devices are left alone."""
    scaler = torch.amp.GradScaler
    original = scaler.__new__
    if getattr(original, "_tunecl", False):
        return

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        device = args[0] if args else kwargs.get("device", "cuda")
        if (cls is scaler and isinstance(device, (str, torch.device))
                and torch.device(device).type == "opencl"):
            cls = GradScaler
        # (torch's scaler has no __new__ of its own: object's takes no arguments)
        return object.__new__(cls) if original is object.__new__ else original(cls, *args, **kwargs)

    __new__._tunecl = True
    scaler.__new__ = __new__
