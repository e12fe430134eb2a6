"""Writes to ``os.environ`` (and ``os.putenv``/``os.unsetenv``) wait for the opened OpenCL devices first (tests/conftest.py installs this).

PoCL links a kernel its cache does not hold by spawning a linker on its worker thread, on the kernel's
first launch, and hands the spawn the process environment. A write to ``os.environ`` on another thread
meanwhile (``putenv`` may reallocate glibc's ``environ`` array) makes the spawn fail with EFAULT
("posix_spawn failed: Bad address", "Final linking of kernel ... failed") and PoCL calls abort(): a
test process died this way, with cold kernel caches, in whatever test was running. Tests write the
environment (``monkeypatch.setenv``) while an earlier launch may still be linking, so each write here
first synchronizes every device the process has opened (:func:`tunecl.runtime.open_devices`).
"""

from __future__ import annotations

import os

from tunecl import runtime

_installed: list[bool] = []


def _quiet() -> None:
    for device in runtime.open_devices():
        device.synchronize()


def install() -> None:
    """Make ``os.environ``'s writes and deletions synchronize the opened devices first (once per process)."""
    if _installed:
        return
    putenv, unsetenv = os.putenv, os.unsetenv   # (os.environ's writes call these module functions)

    def quiet_putenv(key: str | bytes, value: str | bytes) -> None:
        _quiet()
        putenv(key, value)

    def quiet_unsetenv(key: str | bytes) -> None:
        _quiet()
        unsetenv(key)

    os.putenv, os.unsetenv = quiet_putenv, quiet_unsetenv
    _installed.append(True)
