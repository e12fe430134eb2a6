"""Native stacks of a test process that dies on a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT).

Python's faulthandler (which pytest enables) prints the Python stack of every thread of a dying process;
a heap corrupted by native code shows itself only in the native frames. :func:`install` adds a handler
that runs after faulthandler's: it attaches gdb to the dying process and prints every thread's native
backtrace to stderr (the pytest-xdist controller's stderr for a worker, so the CI log), then lets the
process die of the signal as before. Enabled by ``TUNECL_TEST_NATIVE_STACKS=1`` (``.ci/run`` sets it)
where gdb is on PATH; without either, nothing changes.

The handler is a ctypes callback: it takes the GIL, so it runs in a crashing thread that holds it (the
usual case: a Python call into a native library) and waits for it in a native thread that does not.
A second fault inside the handler kills the process with the signal's default action.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import faulthandler
import os
import re
import shutil
import signal
import subprocess
import sys

ENV = "TUNECL_TEST_NATIVE_STACKS"
SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)
GDB_TIMEOUT_S = 180
_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
_SIG_DFL = 0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.signal.restype = ctypes.c_void_p
_libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
_installed: list = []   # the callback object: it must outlive every signal
# the tests this process ran last, newest last (tests/conftest.py adds each as it starts): the handler
# prints them, since heap corruption by native code shows itself in whatever test runs next
recent: collections.deque[str] = collections.deque(maxlen=12)
RECENT_TITLE = "the tests this process ran last, newest last:"


def _gdb_command(gdb: str, pid: int) -> list[str]:
    return [gdb, "-nx", "-batch", "-iex", "set auto-load no", "-p", str(pid), "-ex", "set pagination off",
            "-ex", "set print frame-arguments none", "-ex", "thread apply all bt 40"]


def _make_handler(gdb: str, out: int):
    """The handler, writing to file descriptor ``out`` (a copy of stderr taken before pytest captures
    fd 2 around each test, as pytest's faulthandler does)."""

    def on_fatal_signal(signum: int) -> None:
        for s in SIGNALS:   # a fault from here on ends the process at once
            _libc.signal(s, _SIG_DFL)
        pid = os.getpid()
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        header = f"\n==== native stacks of pytest process {pid} ({worker}), signal {signum}: gdb ====\n"
        os.write(out, header.encode())
        if recent:
            os.write(out, (RECENT_TITLE + "\n"
                           + "".join(f"    {nodeid}\n" for nodeid in recent)).encode())
        try:
            subprocess.run(_gdb_command(gdb, pid), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                           timeout=GDB_TIMEOUT_S, check=False)
        except BaseException as error:   # (nothing may escape a signal handler)
            os.write(out, f"gdb could not run: {error!r}\n".encode())
        os.write(out, f"==== end of the native stacks of process {pid} ({worker}) ====\n".encode())
        # returning re-runs the faulting instruction (or returns into faulthandler's raise()): the signal
        # now has its default action and ends the process as it would have without this handler

    return _HANDLER(on_fatal_signal)


def install(gdb: str | None = None) -> bool:
    """Install the handler beneath faulthandler's (which runs first and then raises the signal again);
    True if installed."""
    gdb = gdb or shutil.which("gdb")
    if _installed or gdb is None:
        return bool(_installed)
    enabled = faulthandler.is_enabled()
    if enabled:   # faulthandler keeps the handler it found when enabled and calls it after its own
        faulthandler.disable()
    handler = _make_handler(gdb, os.dup(sys.__stderr__.fileno()))
    address = ctypes.cast(handler, ctypes.c_void_p).value
    for s in SIGNALS:
        _libc.signal(s, address)
    _installed.append(handler)
    if enabled:
        faulthandler.enable(all_threads=True)
    return True


def wanted() -> bool:
    return os.environ.get(ENV, "") == "1"


def _python_stack(lines: list[str], start: int, frames: int) -> list[str]:
    """The "Fatal Python error" line at ``start`` and the crashing thread's Python stack after it."""
    out, i = [lines[start].strip()], start + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i < len(lines) and "thread 0x" in lines[i].lower():
        out.append(lines[i].strip())
        i += 1
        while i < len(lines) and lines[i].startswith("  File ") and len(out) < frames + 2:
            out.append(lines[i].rstrip())
            i += 1
    return out


def _recent_tests(block: list[str]) -> list[str]:
    """The handler's list of the tests the process ran last (its title and the indented lines after it)."""
    for k, line in enumerate(block):
        if line.startswith(RECENT_TITLE):
            tests = [line]
            for test in block[k + 1:]:
                if not test.startswith("    "):
                    break
                tests.append(test.rstrip())
            return tests
    return []


def _faulting_threads(block: list[str], frames: int) -> list[str]:
    """Of gdb's "thread apply all bt" output, each thread that took a signal: its header and the frames
    beneath its last "<signal handler called>" (the faulting code, not the handlers above it)."""
    out, thread = [], []
    for line in block + ["Thread end"]:
        if re.match(r"Thread \d+ ", line) or line == "Thread end":
            marks = [k for k, text in enumerate(thread) if "<signal handler called>" in text]
            if marks:
                faulting = [t for t in thread[marks[-1]:] if t.startswith("#")][:frames + 1]
                out += [thread[0]] + [t.rstrip()[:200] for t in faulting]
            thread = [line]
        elif thread:
            thread.append(line)
    return out


def _last_words(lines: list[str], index: int, count: int = 6) -> list[str]:
    """Up to ``count`` lines of native output just before line ``index`` (pytest's progress dots stripped;
    pytest-xdist's own lines and the notes on replaced crash handlers, present in every worker, left out)."""
    words: list[str] = []
    for line in reversed(lines[max(0, index - 40):index]):
        text = line.lstrip(".").strip()
        if (re.fullmatch(r"[.sFEx]*(\s*\[\s*\d+%\])?", text) or "handler of process" in text
                or text.startswith("[gw")):
            continue
        words.append("    " + text[:200])
        if len(words) == count:
            break
    return words[::-1]


def digest(log: str, frames: int = 16) -> str:
    """What a long test log says about processes that died, in a few lines to print at its end: each
    controller line on a worker that went down with the native messages just before it (a driver's or
    compiler's last words on file descriptor 2, e.g. PoCL's "Final linking of kernel ... failed" before it
    aborts), each "Fatal Python error"
    with the crashing thread's Python stack, and from the native stacks the faulting thread's frames."""
    lines = log.splitlines()
    out: list[str] = []
    native: list[str] | None = None
    for i, line in enumerate(lines):
        if "==== native stacks of pytest process" in line:
            native = []
            out.append(line[line.index("===="):])
        elif "==== end of the native stacks" in line and native is not None:
            out += _recent_tests(native)
            out += _faulting_threads(native, frames) or ["(gdb printed no thread that took a signal)"]
            native = None
        elif native is not None:
            native.append(line)
        elif re.search(r"==== worker \S+ went down", line):
            out += _last_words(lines, i) + [line[line.index("===="):]]
        elif "Fatal Python error:" in line:
            out += _python_stack(lines, i, frames)
    if native is not None:   # the log ends inside a native-stacks section: the process died in gdb's run
        out += _recent_tests(native)
        out += _faulting_threads(native, frames) or ["(the native stacks end unfinished)"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the digest of the process deaths a test log records.")
    parser.add_argument("--digest", metavar="LOG", required=True, help="a pytest log (.ci/run's)")
    args = parser.parse_args(argv)
    with open(args.digest, errors="replace") as f:
        text = digest(f.read())
    print(text or "the log records no process death with a stack")
    return 0


if __name__ == "__main__":
    sys.exit(main())
