"""Where dropout's masks and ``bernoulli_(p)`` are drawn outside a graph capture (``TUNECL_RANDOM``).

``device``: Philox on the device (``random.cl``) under a 64-bit key drawn from torch's CPU generator (or
the CPU generator passed in), one key per call. ``torch.manual_seed`` and the CPU generator's state
therefore reproduce every mask; the masks are not the CPU kernels' (as CUDA's are not). ``host``: torch's
CPU generator draws every number as the CPU kernels do and the result is uploaded, so the masks equal the
CPU's bit for bit (``tunecl validate`` and the tests that compare with the CPU use it), at the cost of
the host's draw and upload: on an H100, BERT-base's 25 dropouts of 2048 x 768 at batch 16 took most of its
training step that way. ``auto`` (the default): ``device`` on GPUs and other non-CPU devices, ``host`` on
CPU devices, whose kernels share the host's cores (PoCL on 2 cores: 41 ms for a Philox draw of 2048 x 768
against 11 ms for torch's). Other random ops (``normal_``, ``uniform_``, ...) always draw on the host, so
a model initialised on the device matches one initialised on the CPU. With device draws, eager dropout of a
contiguous float32 tensor draws its mask and applies it in one launch (:func:`dropout`); the fused attention
draws its dropout inside its kernels under such a key (:mod:`tunecl.backend.ops.sdpa`).
"""

from __future__ import annotations

import torch

from tunecl import config
from tunecl.backend import memory, state

_DTYPES = {torch.float32: "float32", torch.bool: "bool"}


def _mode(cfg: config.Config) -> str:
    if cfg.random not in config.RANDOM_MODES:
        raise ValueError(f"TUNECL_RANDOM must be one of {', '.join(config.RANDOM_MODES)}, not {cfg.random!r}")
    return cfg.random


_setting = config.Derived(_mode, "TUNECL_RANDOM")


def mode() -> str:
    """``TUNECL_RANDOM``'s value: ``device``, ``host`` or ``auto``."""
    return _setting()


def on_host() -> bool:
    """Whether random draws are made on the host (``TUNECL_RANDOM``, ``auto`` by the device's type)."""
    mode = _setting()
    return mode == "host" or (mode == "auto" and state.get().device.fingerprint.device_type == "cpu")


def key(generator: torch.Generator | None = None) -> int:
    """A 62-bit Philox key drawn from ``generator`` (torch's CPU default generator when None)."""
    # (a CPU tensor, named so: reading a number back from the device would wait for it)
    return int(torch.randint(1 << 62, (), dtype=torch.int64, generator=generator, device="cpu"))


def bernoulli_(t: torch.Tensor, p: float, generator: torch.Generator | None = None) -> bool:
    """Fill contiguous float32 or bool ``t`` with 1 (probability ``p``) or 0 on the device, under a key from
    ``generator``; False (nothing done, nothing drawn) where that does not apply: host draws, other dtypes
    or layouts, ``p`` outside [0, 1] (the host path gives torch's error), a generator not on the CPU."""
    dtype = _DTYPES.get(t.dtype)
    if dtype is None or not t.is_contiguous() or not 0.0 <= p <= 1.0 or on_host() \
            or (generator is not None and generator.device.type != "cpu"):
        return False
    state.get().random.bernoulli_keyed(memory.buffer_of(t), t.storage_offset(), t.numel(), float(p),
                                       key(generator), dtype)
    return True


def dropout(input: torch.Tensor, keep: float, scale: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Eager dropout of a contiguous float32 ``input`` in one launch on the device: (output, bool mask), the
    mask the keyed Bernoulli draw of :func:`bernoulli_` would give under the call's key; None (nothing
    done, nothing drawn) for host draws and other dtypes or layouts."""
    if input.dtype is not torch.float32 or not input.is_contiguous() or not 0.0 <= keep <= 1.0 or on_host():
        return None
    out = memory.empty_contiguous(input.shape, torch.float32)
    mask = memory.empty_contiguous(input.shape, torch.bool)
    state.get().random.dropout_keyed(memory.buffer_of(out), 0, memory.buffer_of(mask), 0, memory.buffer_of(input),
                                     input.storage_offset(), input.numel(), float(keep), float(scale), key())
    return out, mask
