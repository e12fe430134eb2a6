"""Device selection by index, platform:device and name, on a fake device list (no OpenCL needed)."""

import pytest

from tunecl import config, runtime
from tunecl.errors import DeviceNotFoundError
from tunecl.runtime import devices


def _entry(index, plat, dev, platform, name, kind, error=""):
    return runtime.DeviceEntry(index, plat, dev, platform, name, kind, None,
                               f"{name} {platform}".lower(), error)


@pytest.fixture
def fake_devices(monkeypatch):
    entries = [
        _entry(0, 1, 0, "NVIDIA CUDA", "NVIDIA H200", "gpu"),
        _entry(1, 0, 0, "Portable Computing Language", "pthread-AMD EPYC", "cpu"),
        _entry(2, 2, 0, "Portable Computing Language", "pthread-old", "cpu", "unknown target CPU"),
    ]
    monkeypatch.setattr(devices, "_entries", entries)  # what list_devices reads
    return entries


def test_select_by_index_pair_and_name(fake_devices):
    assert runtime.resolve(0).name == "NVIDIA H200"
    assert runtime.resolve("1").name == "pthread-AMD EPYC"
    assert runtime.resolve("0:0").name == "pthread-AMD EPYC"
    assert runtime.resolve("1:0").name == "NVIDIA H200"
    assert runtime.resolve("h200").index == 0
    assert runtime.resolve("PORTABLE").index == 1  # first match in list order
    assert runtime.resolve("old").index == 2


def test_default_comes_from_config(fake_devices, monkeypatch):
    monkeypatch.delenv("TUNECL_DEVICE", raising=False)
    with config.override(device="epyc"):
        assert runtime.resolve().index == 1
    assert runtime.resolve().index == 0


@pytest.mark.parametrize("selector", ["7", "3:0", "radeon", ""])
def test_unknown_selector_lists_available_devices(fake_devices, selector):
    with pytest.raises(DeviceNotFoundError) as info:
        runtime.resolve(selector)
    message = str(info.value)
    assert "available devices: 0: NVIDIA H200" in message
    assert "2: pthread-old" in message and "(cannot compile)" in message


def test_no_devices_at_all(monkeypatch):
    monkeypatch.setattr(devices, "_entries", [])
    with pytest.raises(DeviceNotFoundError, match="no OpenCL device is available"):
        runtime.resolve()
