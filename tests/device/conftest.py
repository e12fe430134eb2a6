"""Fixtures for tests that run kernels on this machine's OpenCL device (PoCL in CI)."""

import numpy as np
import pytest

from tunecl import runtime


@pytest.fixture(autouse=True)
def _private_tuning_db(tmp_path, monkeypatch):
    """No test may touch a user's real tuning DB or Optuna storage."""
    monkeypatch.setenv("TUNECL_DB", str(tmp_path / "tuning.sqlite"))
    monkeypatch.setenv("TUNECL_STORAGE", str(tmp_path / "studies.sqlite"))
    monkeypatch.setenv("TUNECL_SHIPPED_DB", "")  # results shipped in tuning_db/ must not change tests


@pytest.fixture(scope="session")
def device():
    """The default OpenCL device (PoCL's CPU device on a machine without a GPU)."""
    return runtime.select_device()


@pytest.fixture
def rng():
    """A seeded numpy generator, fresh per test so tests do not depend on their order."""
    return np.random.default_rng(20240601)
