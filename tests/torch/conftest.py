"""Fixtures for the PyTorch backend tests: every op runs on PoCL and is compared with CPU torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tunecl.backend
from tunecl import config


@pytest.fixture(autouse=True)
def _private_tuning_db(tmp_path, monkeypatch):
    """No test may touch a user's real tuning DB, Optuna storage or the repository's shipped results
    (``TUNECL_SHIPPED_DB=""`` disables them; a test of the shipped step points it at its own folder),
    and no test tunes on a miss unless it says so."""
    monkeypatch.setenv("TUNECL_DB", str(tmp_path / "tuning.sqlite"))
    monkeypatch.setenv("TUNECL_STORAGE", str(tmp_path / "studies.sqlite"))
    monkeypatch.setenv("TUNECL_SHIPPED_DB", "")
    monkeypatch.setenv("TUNECL_TUNE", "off")


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


@pytest.fixture
def fresh_dynamo():
    """dynamo's caches and the tunecl compile backend's counters emptied before the test, and dynamo's after
    (a compiled function from an earlier test must not serve this one)."""
    import torch

    from tunecl.backend import compile as compile_backend

    torch._dynamo.reset()
    compile_backend.reset_stats()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fresh_plans():
    """An empty plan cache before and after the test (plans chosen under this test's tuning DB must
    not serve later tests, nor earlier plans this one)."""
    from tunecl.backend import plans

    plans.clear()
    yield plans
    plans.clear()
