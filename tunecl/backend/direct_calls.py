"""The backend's device kernels by op name, for its autograd kernels to call without the dispatcher.

An autograd kernel of the backend (:mod:`tunecl.backend.ops.composite`) that runs an op below autograd
would otherwise call it through the dispatcher: a second boxing of every argument into Python, the
in-place op's version bump (``ADInplaceOrView``) and the same kernel in the end, about 20 µs per call.
Where nothing between autograd and the device kernel can see the call (see :func:`plain`), it calls the
kernel directly, as the dispatcher would have registered it (:mod:`tunecl.backend.registration`'s wrapper:
call counts, a pending foreach run launched first, the CPU fallback for what the device cannot run), and
bumps the version counter of what an in-place op wrote itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# the PrivateUse1 kernels as registered, by op name ("hardtanh_", "hardtanh_backward", ...); filled by
# tunecl.backend.registration when it registers them
kernels: dict[str, Callable[..., Any]] = {}
ENABLED = True   # False: every call goes through the dispatcher

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_dispatch_modes = torch._C._len_torch_dispatch_stack
bump_version = torch._C._increment_version   # (tensors,): what ADInplaceOrView does for an in-place op


def plain(*tensors: torch.Tensor) -> bool:
    """Whether a call on ``tensors`` below autograd reaches the device kernel unseen: plain tensors (not a
    traced fake or functional tensor, nor another subclass), no torch dispatch mode active (a mode sees
    every op), no lazy negation (its dispatch key would materialise the tensor first), and ``ENABLED``."""
    if not ENABLED or _dispatch_modes():
        return False
    for t in tensors:
        if type(t) not in _PLAIN_TYPES or t.is_neg():
            return False
    return True
