"""Fixtures for tests that run kernels on this machine's OpenCL device (PoCL in CI)."""

import pytest


@pytest.fixture(autouse=True)
def _private_tuning_db(tmp_path, monkeypatch):
    """No test may touch a user's real tuning DB or Optuna storage."""
    monkeypatch.setenv("TUNECL_DB", str(tmp_path / "tuning.sqlite"))
    monkeypatch.setenv("TUNECL_STORAGE", str(tmp_path / "studies.sqlite"))
