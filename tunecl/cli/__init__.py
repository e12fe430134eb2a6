"""The ``tunecl`` command: a table of subcommands, each in its own module with ``register(subparsers)``.

Each subcommand parses its arguments and calls a library function that tests can call directly. Heavy
imports (torch, optuna, pyopencl) happen inside the commands, so ``tunecl --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from tunecl import __version__
from tunecl.errors import TuneclError

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

    Exit codes: 0 success, 1 a tunecl error (one line on stderr), 2 a usage error, 130 interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TuneclError as error:
        print(f"tunecl: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tunecl: interrupted", file=sys.stderr)
        return 130
