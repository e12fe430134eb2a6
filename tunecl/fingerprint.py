"""The identity of an OpenCL device as the tuning database stores it (a pure value, no OpenCL here)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """What makes tuning results of one device valid for another.

    Two devices with equal ``key`` are the same device model on the same driver; equal ``model_key``
    means the same model, possibly on another driver (the lookup chain's second step).
    """

    vendor: str
    name: str
    driver_version: str
    opencl_c_version: str
    device_type: str  # "gpu", "cpu", "accelerator" or "other"
    compute_units: int
    max_work_group_size: int
    local_mem_size: int
    global_mem_size: int
    platform: str = ""
    device_version: str = ""

    @property
    def model_key(self) -> str:
        """Hash of the hardware identity (vendor, name, type, compute units, local memory), driver excluded.

        Global memory is left out on purpose: CPU runtimes such as PoCL report the host's currently
        free memory there, which changes from process to process and would make every lookup miss.
        """
        model = (self.vendor, self.name, self.device_type, self.compute_units, self.local_mem_size)
        return _digest(model)

    @property
    def key(self) -> str:
        """Hash of the full identity: the model plus platform, driver and OpenCL versions."""
        return _digest((self.model_key, self.platform, self.driver_version, self.opencl_c_version,
                        self.device_version, self.max_work_group_size))

    @property
    def label(self) -> str:
        """A short human-readable name: ``NVIDIA H200 (driver 580.1)``."""
        return f"{self.name.strip()} (driver {self.driver_version.strip()})"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Fingerprint:
        """Build from a dict, ignoring unknown keys (documents from newer versions may carry more)."""
        names = {f.name for f in dataclasses.fields(Fingerprint)}
        missing = names - set(data) - {"platform", "device_version"}
        if missing:
            raise ValueError(f"device fingerprint lacks {', '.join(sorted(missing))}")
        return Fingerprint(**{k: v for k, v in data.items() if k in names})


def _digest(parts: tuple) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
