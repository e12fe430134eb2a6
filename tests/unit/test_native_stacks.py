"""tests/native_stacks.py: a test process dying of a fatal signal prints its Python and native stacks."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]
CRASH = """
import ctypes, faulthandler, sys
sys.path.insert(0, {tests!r})
import native_stacks
{before}
native_stacks.recent.extend(["tests/a.py::test_one", "tests/b.py::test_two"])
assert native_stacks.install()
{after}
ctypes.string_at(0)   # reads address 0: SIGSEGV
"""


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
@pytest.mark.parametrize("order", ["faulthandler first", "faulthandler after"])
def test_a_segfault_prints_python_then_native_stacks(order):
    enable = "faulthandler.enable()"
    code = CRASH.format(tests=str(TESTS), before=enable if order == "faulthandler first" else "",
                        after=enable if order == "faulthandler after" else "")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGSEGV, done.stderr
    err = done.stderr
    python = err.find("Fatal Python error: Segmentation fault")
    native, end = err.find("==== native stacks of pytest process"), err.find("==== end of the native")
    assert 0 <= python < native < end, err
    assert "string_at" in err[native:end] and "<signal handler called>" in err[native:end], err[native:end]
    # the digest .ci/run prints at the end of its log: the Python stack, then the faulting native frames
    import native_stacks

    noise = "........ [ 42%]\nwarnings\n" * 50
    digest = native_stacks.digest(noise + err + noise).splitlines()
    assert digest[0] == "Fatal Python error: Segmentation fault", digest
    assert any(line.endswith(" in <module>") for line in digest[:8]), digest
    header = next(k for k, line in enumerate(digest) if line.startswith("==== native stacks"))
    assert digest[header + 1:header + 4] == [native_stacks.RECENT_TITLE, "    tests/a.py::test_one",
                                             "    tests/b.py::test_two"], digest
    assert digest[header + 4].startswith("Thread ") and "<signal handler called>" in digest[header + 5], digest
    assert "string_at" in "\n".join(digest[header + 6:header + 9]), digest
    assert "raise" not in "\n".join(digest[header:]), digest   # the handlers' own frames are left out


def test_the_digest_of_a_log_without_deaths_is_empty(tmp_path):
    sys.path.insert(0, str(TESTS))
    import native_stacks

    assert native_stacks.digest("..... [100%]\n3 passed in 1.0s\n") == ""
    # a worker that died without a Python stack (native code called abort()): its last native words
    aborted = ("...... [ 38%]\n....error: unable to execute command: posix_spawn failed: Bad address\n"
               "==== SIGABRT handler of process 7 replaced during t (by libpocl.so) ====\n"
               "Final linking of kernel pointwise failed.\n[gw2] node down: Not properly terminated\n"
               "==== worker gw2 went down (Not properly terminated): killed by SIGABRT ====\n....... [ 40%]\n")
    assert native_stacks.digest(aborted).splitlines() == [
        "    error: unable to execute command: posix_spawn failed: Bad address",
        "    Final linking of kernel pointwise failed.",
        "==== worker gw2 went down (Not properly terminated): killed by SIGABRT ===="]
    log = tmp_path / "log"
    log.write_text("==== worker gw1 went down (crashed): killed by SIGKILL: no handler runs ====\n")
    done = subprocess.run([sys.executable, str(TESTS / "native_stacks.py"), "--digest", str(log)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("==== worker gw1 went down"), done


def test_not_wanted_without_the_variable(monkeypatch):
    sys.path.insert(0, str(TESTS))
    import native_stacks

    monkeypatch.delenv(native_stacks.ENV, raising=False)
    assert not native_stacks.wanted()
    monkeypatch.setenv(native_stacks.ENV, "1")
    assert native_stacks.wanted()


DYING = """
import os, signal

def test_killed():
    os.kill(os.getpid(), signal.SIGKILL)

def test_exits():
    os._exit(3)
"""


def test_a_worker_that_dies_without_a_stack_is_said_how(tmp_path):
    """The controller names the signal or exit status of a worker process that went down
    (tests/worker_deaths.py); both deaths here leave no Python stack."""
    (tmp_path / "conftest.py").write_text(   # the suite's conftest under another module name
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(TESTS / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "globals().update({k: v for k, v in vars(suite).items() if k.startswith('pytest_')})\n")
    (tmp_path / "test_dying.py").write_text(DYING)
    env = {**os.environ, "TUNECL_TEST_NATIVE_STACKS": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "killed by SIGKILL: no handler runs for it" in out, out
    assert "exited with status 3 before finishing its session" in out, out


def test_a_replaced_crash_handler_is_named(tmp_path):
    sys.path.insert(0, str(TESTS))
    import worker_deaths

    read, write = os.pipe()
    watch = worker_deaths.HandlerWatch((signal.SIGUSR1,), write)
    assert watch.check("nothing") == []
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        lines = watch.check("test_x")
    finally:
        signal.signal(signal.SIGUSR1, previous)
    os.close(write)
    assert len(lines) == 1 and "SIGUSR1 handler" in lines[0] and "during test_x" in lines[0]
    assert os.read(read, 4096).decode() == lines[0]
    os.close(read)
    assert "killed by SIGSEGV" == worker_deaths.describe_exit(-signal.SIGSEGV)
    assert "could not be read" in worker_deaths.describe_exit(None)
