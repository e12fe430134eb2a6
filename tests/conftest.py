"""Suite-wide pytest settings.

``pytest -n auto`` (pytest-xdist, in the ``test`` extra; the README's test command uses it) runs the
suite in ``min(4, CPUs)`` worker processes: most of a cold run is single-threaded kernel compilation,
which then proceeds in parallel, while more workers than that would mostly multiply PoCL's threads
and the memory of each process's torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import draws  # noqa: E402
import native_stacks  # noqa: E402

MAX_WORKERS = 4


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """With ``TUNECL_TEST_NATIVE_STACKS=1`` (``.ci/run``), a process of the run (a pytest-xdist worker
    included) that dies on a fatal signal prints its threads' native stacks after faulthandler's Python
    stacks (see native_stacks.py)."""
    if native_stacks.wanted():
        native_stacks.install()


@pytest.hookimpl(optionalhook=True)  # defined by pytest-xdist; without it, never called
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    draws.used.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed test that drew random configs (draws.py) says which seed, and how to draw them again."""
    report = yield
    if report.failed and draws.used:
        report.sections.append(("random draws", draws.describe()))
    return report
