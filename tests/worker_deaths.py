"""How a test process ended when it ended unexpectedly, and who changed its crash handlers.

A pytest-xdist worker that dies only shows, by default, "worker 'gw1' crashed while running 'TEST'".
With ``TUNECL_TEST_NATIVE_STACKS=1`` (``.ci/run``) the suite says more:

- the controller prints how the worker process ended (:func:`describe_exit`): killed by which signal
  (SIGKILL leaves no stack anywhere: the kernel's out-of-memory killer or another process sent it), or
  exited with which status without finishing its session (a native library calling ``exit()``);
- each process watches its fatal-signal handlers (:class:`HandlerWatch`): when native code loaded during
  a test replaces one (an LLVM or driver crash handler installed on first use), the process writes which
  test and which signal to its stderr, because a crash after that may end without faulthandler's stacks.

These are diagnostics only: they change no test outcome.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from typing import Any

_libc = ctypes.CDLL(None, use_errno=True)
_libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_SIGACTION_BYTES = 256   # larger than glibc's struct sigaction, whose first member is the handler


def describe_exit(returncode: int | None) -> str:
    """A sentence on how a process with this ``returncode`` (``subprocess`` convention) ended."""
    if returncode is None:
        return "its exit status could not be read"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if -returncode == signal.SIGKILL:
            return (f"killed by {name}: no handler runs for it, so no stack was printed (the kernel's "
                    "out-of-memory killer or another process sent it)")
        return f"killed by {name}"
    return (f"exited with status {returncode} before finishing its session (native code called exit(), "
            "or the process was told to exit)")


def exit_status(node: Any, timeout: float = 10.0) -> int | None:
    """The exit status of a pytest-xdist worker's process (``node`` a WorkerController), waiting up to
    ``timeout`` seconds for it to end; None where it cannot be read."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return None
    try:
        return popen.wait(timeout)
    except (subprocess.TimeoutExpired, OSError):
        return None


def handler_address(signum: int) -> int:
    """The address of the handler installed for ``signum`` (0 for SIG_DFL, 1 for SIG_IGN)."""
    action = ctypes.create_string_buffer(_SIGACTION_BYTES)
    if _libc.sigaction(signum, None, action) != 0:
        raise OSError(ctypes.get_errno(), f"sigaction({signum}) failed")
    return ctypes.c_void_p.from_buffer(action).value or 0


def library_of(address: int) -> str:
    """The file mapped at ``address`` in this process (from /proc/self/maps), or "?"."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                low, high = (int(x, 16) for x in fields[0].split("-"))
                if low <= address < high:
                    return fields[5] if len(fields) > 5 else "an anonymous mapping"
    except OSError:
        pass
    return "?"


class HandlerWatch:
    """Remembers the handlers of ``signals`` and says once per signal when one has been replaced."""

    def __init__(self, signals: tuple[int, ...], out: int) -> None:
        self.signals, self.out = signals, out
        self.known = {s: handler_address(s) for s in signals}

    def check(self, where: str) -> list[str]:
        """Compare with the remembered handlers; write a line to ``out`` for each one replaced since,
        naming ``where``, remember the new one, and return the lines."""
        lines = []
        for s in self.signals:
            now = handler_address(s)
            if now != self.known[s]:
                lines.append(f"==== {signal.Signals(s).name} handler of process {os.getpid()} replaced during "
                             f"{where} (by {library_of(now)}; the test or a thread still running from an "
                             "earlier one): a crash from here on may end "
                             "without Python stacks ====\n")
                self.known[s] = now
        for line in lines:
            os.write(self.out, line.encode())
        return lines
