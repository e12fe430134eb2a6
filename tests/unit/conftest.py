"""Fixtures for unit tests: a private tuning DB and shipped folder per test, and device fingerprints."""

from __future__ import annotations

import dataclasses

import pytest

from tunecl.db import shipped
from tunecl.fingerprint import Fingerprint


@pytest.fixture(autouse=True)
def _private_tuning_db(tmp_path, monkeypatch):
    """No test may touch a user's real tuning DB, Optuna storage or the repository's shipped results."""
    monkeypatch.setenv("TUNECL_DB", str(tmp_path / "tuning.sqlite"))
    monkeypatch.setenv("TUNECL_STORAGE", str(tmp_path / "studies.sqlite"))
    monkeypatch.setenv("TUNECL_SHIPPED_DB", str(tmp_path / "shipped"))
    shipped.clear_cache()
    yield
    shipped.clear_cache()


_BASE = Fingerprint(vendor="Acme", name="Acme GPU 9000", driver_version="1.0",
                    opencl_c_version="OpenCL C 3.0", device_type="gpu", compute_units=64,
                    max_work_group_size=1024, local_mem_size=65536, global_mem_size=16 * 2**30,
                    platform="Acme OpenCL", device_version="OpenCL 3.0")


@pytest.fixture
def fingerprint():
    """Factory: ``fingerprint(driver="2.0")`` is the same model on another driver, ``name=`` another model."""

    def make(driver: str = "1.0", name: str = _BASE.name) -> Fingerprint:
        return dataclasses.replace(_BASE, driver_version=driver, name=name)

    return make
