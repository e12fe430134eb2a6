"""Pyflakes' checks over the package, benchmarks and tests: an undefined name (a missing import on an error
path) or an unused import fails here instead of at a user's call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_undefined_names_or_unused_imports():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F", "--no-cache",
                           "tunecl", "benchmarks", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
