"""Small tensors an op builds on the host once per geometry and keeps on the device: index maps (the input
position each output position reads), divisors, interpolation weights.

Each op keeps its own :class:`DeviceTables`, bounded: one that holds its limit is emptied before it keeps the
next table (a safety valve for ever-changing geometries). The device is part of every key. A table made
while the backend's State has no device memory (a dry run, :mod:`tunecl.tools.coverage`) is returned but not
kept: its storage has no buffer, so it must neither outlive the dry run nor reach a kernel after it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from tunecl.backend import state


class DeviceTables:
    """Tables on the device by (geometry key, device), at most ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._tables: dict[tuple, torch.Tensor] = {}

    def get(self, key: tuple[Hashable, ...], device: torch.device,
            make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The table of ``key`` on ``device``; ``make()`` builds it on the host the first time."""
        full_key = (*key, device)
        found = self._tables.get(full_key)
        if found is None:
            found = make().to(device)
            if not state.get().allocates:
                return found
            if len(self._tables) >= self.limit:
                self._tables.clear()
            self._tables[full_key] = found
        return found
