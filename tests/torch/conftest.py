"""Fixtures for the PyTorch backend tests: every op runs on PoCL and is compared with CPU torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tunecl.backend
from tunecl import config


@pytest.fixture(autouse=True)
def _private_tuning_db(tmp_path, monkeypatch):
    """No test may touch a user's real tuning DB, Optuna storage or the repository's shipped results."""
    monkeypatch.setenv("TUNECL_DB", str(tmp_path / "tuning.sqlite"))
    monkeypatch.setenv("TUNECL_STORAGE", str(tmp_path / "studies.sqlite"))
    monkeypatch.setenv("TUNECL_SHIPPED_DB", str(tmp_path / "shipped"))


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(1234)


@pytest.fixture
def strict():
    """Forbid the CPU fallback inside the test (``TUNECL_FALLBACK=error``)."""
    with config.override(fallback="error"):
        yield


@pytest.fixture
def fresh_stats():
    tunecl.backend.reset_stats()
    yield tunecl.backend.stats
    tunecl.backend.reset_stats()
