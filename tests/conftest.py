"""Suite-wide pytest settings.

``pytest -n auto`` (pytest-xdist, in the ``test`` extra; the README's test command uses it) runs the
suite in ``min(4, CPUs)`` worker processes: most of a cold run is single-threaded kernel compilation,
which then proceeds in parallel, while more workers than that would mostly multiply PoCL's threads
and the memory of each process's torch.
"""

from __future__ import annotations

import os

import pytest

MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)  # defined by pytest-xdist; without it, never called
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))
