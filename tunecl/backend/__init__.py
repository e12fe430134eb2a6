"""``import tunecl.backend`` makes ``opencl`` a PyTorch device, in pure Python.

Tensors on ``opencl:0`` are plain ``torch.Tensor``s on the PrivateUse1 dispatch key; their storage
comes through DLPack and lives in OpenCL buffers (see :mod:`tunecl.backend.memory`). Ops run as
OpenCL kernels from :mod:`tunecl.kernels`; anything without a kernel takes a CPU fallback governed by
``TUNECL_FALLBACK`` (``warn`` | ``silent`` | ``error``). Only ``.cpu()``, ``.item()``, printing and
``torch.opencl.synchronize()`` wait for the device.

Example::

    import torch, tunecl.backend
    model = model.to("opencl")
    print(tunecl.backend.stats()["fallback_ops"])
"""

from __future__ import annotations

from tunecl.backend.counters import reset_stats, stats
from tunecl.backend.fallback import FallbackError
from tunecl.backend.registration import register

register()

__all__ = ["FallbackError", "register", "reset_stats", "stats"]
