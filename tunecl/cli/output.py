"""Printing helpers shared by the subcommands: aligned tables and JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO | None = None) -> None:
    """Print rows under headers with columns padded to their widest cell (numbers right-aligned)."""
    out = out or sys.stdout
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(_is_number(row[i]) for row in rows) and rows for i in range(len(headers))]
    for j, row in enumerate(cells):
        parts = [c.rjust(w) if numeric[i] and j else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(parts).rstrip(), file=out)


def print_json(data: Any, out: TextIO | None = None) -> None:
    json.dump(data, out or sys.stdout, indent=2, sort_keys=False, default=str)
    print(file=out or sys.stdout)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
