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
import environment_guard  # noqa: E402
import native_stacks  # noqa: E402
import worker_deaths  # noqa: E402

MAX_WORKERS = 4


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The suite compiles its kernels into a cache of its own, never the user's: ``TUNECL_CACHE_DIR``
    unless set is ``.pytest_cache/tunecl-kernels`` under the rootdir, so repeated runs stay warm (the
    pytest-xdist workers and the subprocesses tests start inherit it). With ``TUNECL_TEST_NATIVE_STACKS=1``
    (``.ci/run``), a process of the run (a pytest-xdist worker included) that dies on a fatal signal prints
    its threads' native stacks after faulthandler's Python stacks (see native_stacks.py)."""
    os.environ.setdefault("TUNECL_CACHE_DIR", str(config.rootpath / ".pytest_cache" / "tunecl-kernels"))
    environment_guard.install()   # environment writes wait for the devices (see environment_guard.py)
    if native_stacks.wanted():
        native_stacks.install()
        _watch.append(worker_deaths.HandlerWatch(native_stacks.SIGNALS, os.dup(sys.__stderr__.fileno())))


_watch: list[worker_deaths.HandlerWatch] = []


@pytest.hookimpl(optionalhook=True)  # defined by pytest-xdist, called in the controller
def pytest_testnodedown(node, error) -> None:
    """A worker that went down unexpectedly: say how its process ended (worker_deaths.py)."""
    if error is None or not native_stacks.wanted():
        return
    status = worker_deaths.exit_status(node)
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    line = f"==== worker {node.gateway.id} went down ({error}): {worker_deaths.describe_exit(status)} ===="
    if reporter is not None:
        reporter.write_line(line)
    else:
        sys.stderr.write(line + "\n")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Native code that replaced a fatal-signal handler during this test is named (worker_deaths.py)."""
    if _watch:
        _watch[0].check(item.nodeid)


@pytest.hookimpl(optionalhook=True)  # defined by pytest-xdist; without it, never called
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    draws.used.clear()
    native_stacks.recent.append(item.nodeid)   # printed if the process dies of a fatal signal


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed test that drew random configs (draws.py) says which seed, and how to draw them again."""
    report = yield
    if report.failed and draws.used:
        report.sections.append(("random draws", draws.describe()))
    return report
