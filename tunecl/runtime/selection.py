"""Opening devices: :func:`select_device` gives the :class:`Device` a selector names, one object per
device per process."""

from __future__ import annotations

import threading

from tunecl.runtime.device import Device
from tunecl.runtime.devices import resolve

_devices: dict[int, Device] = {}
_lock = threading.RLock()


def open_devices() -> list[Device]:
    """The devices this process has opened (by :func:`select_device`)."""
    with _lock:
        return list(_devices.values())


def select_device(selector: str | int | None = None) -> Device:
    """The :class:`Device` a selector names (one object per device per process)."""
    entry = resolve(selector)
    with _lock:
        device = _devices.get(entry.index)
        if device is None:
            device = _devices[entry.index] = Device(entry)
        return device
