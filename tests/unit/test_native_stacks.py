"""tests/native_stacks.py: a test process dying of a fatal signal prints its Python and native stacks."""

from __future__ import annotations

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


def test_not_wanted_without_the_variable(monkeypatch):
    sys.path.insert(0, str(TESTS))
    import native_stacks

    monkeypatch.delenv(native_stacks.ENV, raising=False)
    assert not native_stacks.wanted()
    monkeypatch.setenv(native_stacks.ENV, "1")
    assert native_stacks.wanted()
