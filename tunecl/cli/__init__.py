"""The ``tunecl`` command: a table of subcommands, each in its own module with ``register(subparsers)``.

Each subcommand parses its arguments and calls a library function that tests can call directly. Heavy
imports (torch, optuna, pyopencl) happen inside the commands, so ``tunecl --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from tunecl import __version__
from tunecl.errors import TuneclError

# the status a shell reports for a tool killed by SIGPIPE (128 + 13)
SIGPIPE_EXIT = 141

# name of the subcommand -> module under tunecl.cli that registers it
COMMANDS = {
    "devices": "tunecl.cli.devices",
    "db": "tunecl.cli.db",
    "tune": "tunecl.cli.tune",
    "bench": "tunecl.cli.bench",
    "validate": "tunecl.cli.validate",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunecl", description="OpenCL kernels tuned by measurement, and a tuning database.")
    parser.add_argument("--version", action="version", version=f"tunecl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMANDS.values():
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script. Returns the process exit code.

    Exit codes: 0 success, 1 a tunecl error (one line on stderr), 2 a usage error, 130 interrupted,
    141 (128 + SIGPIPE) when the reader of standard output went away, as in ``tunecl db list | head``:
    the command stops quietly, like a Unix tool killed by SIGPIPE.
    """
    try:
        try:
            code = _run(argv)
        except SystemExit:  # --help, --version and usage errors print before exiting
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # a closed pipe shows here rather than at interpreter exit
        return code
    except BrokenPipeError:
        _discard_stdout()
        return SIGPIPE_EXIT


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)   # the command line as typed, for records
    try:
        return int(args.func(args) or 0)
    except TuneclError as error:
        print(f"tunecl: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tunecl: interrupted", file=sys.stderr)
        return 130


def _discard_stdout() -> None:
    """Point standard output at the null device, so the interpreter's final flush of what is still
    buffered for the closed pipe does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stdout without a file descriptor (a test's capture): nothing to point
        pass
