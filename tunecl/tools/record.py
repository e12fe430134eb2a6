"""Append measured results to a results CSV (``benchmarks/results/results.csv``'s columns), with the
command line that measured them and the commit of the code that ran.

The file is checked before a benchmark starts (:func:`check_file`), so a long run never ends on a file
it cannot write; a row is appended in one write, never rewriting what is there. A file whose header
differs from :data:`COLUMNS` is refused.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import tunecl
from tunecl.errors import TuneclError

COLUMNS = ("date", "device", "benchmark", "workload", "precision", "unit", "ours", "peer", "peer_name",
           "ratio", "command", "commit")
THROUGHPUT_UNITS = {"GFLOP/s", "TFLOP/s", "GB/s"}  # higher is better: the ratio is peer ÷ ours


def check_file(path: str | Path) -> Path:
    """``path`` as a file :func:`append` can extend: a new file in an existing folder, or a CSV whose
    header is :data:`COLUMNS`. Raises TuneclError (one line) otherwise."""
    path = Path(path)
    if path.is_dir():
        raise TuneclError(f"--record {path}: a folder, not a CSV file")
    if not path.parent.is_dir():
        raise TuneclError(f"--record {path}: no folder {path.parent}")
    if not path.exists() or path.stat().st_size == 0:
        return path
    try:
        with path.open(newline="") as fh:
            header = next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise TuneclError(f"--record {path}: cannot read it ({error})") from None
    if tuple(header) != COLUMNS:
        raise TuneclError(f"--record {path}: its header is not tunecl's results columns "
                          f"({','.join(COLUMNS)}); give a new file or a results CSV")
    return path


def figure(value: float) -> str:
    """A measured value with four significant digits and no exponent (70.56, 0.8512, 48332)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def row(*, device: str, benchmark: str, workload: str, precision: str, unit: str, ours: float, peer: float,
        peer_name: str, command: str, commit: str, date: dt.date | None = None) -> dict[str, str]:
    """One result row; ``ratio`` is computed from the written figures (ours ÷ peer as time)."""
    ours_text, peer_text = figure(ours), figure(peer)
    if float(ours_text) <= 0 or float(peer_text) <= 0:
        raise TuneclError(f"cannot record {workload}: ours {ours_text} and peer {peer_text} must be positive")
    ratio = float(ours_text) / float(peer_text)
    if unit in THROUGHPUT_UNITS:
        ratio = 1 / ratio
    return {"date": (date or dt.date.today()).isoformat(), "device": device, "benchmark": benchmark,
            "workload": workload, "precision": precision, "unit": unit, "ours": ours_text, "peer": peer_text,
            "peer_name": peer_name, "ratio": f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.2g}",
            "command": command, "commit": commit}


def append(path: str | Path, rows: Sequence[Mapping[str, str]]) -> None:
    """Append ``rows`` to the CSV at ``path`` (written with its header when new or empty), in one write."""
    path = check_file(path)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    if not path.exists() or path.stat().st_size == 0:
        writer.writeheader()
    else:
        with path.open("rb") as fh:
            fh.seek(-1, 2)
            if fh.read(1) != b"\n":
                out.write("\n")   # the last row lacks its line end
    for values in rows:
        writer.writerow({column: values[column] for column in COLUMNS})
    with path.open("a", newline="") as fh:
        fh.write(out.getvalue())


def command_line(program: str, argv: Sequence[str]) -> str:
    """The command as a shell would take it back: ``program`` and the arguments, quoted where needed."""
    return " ".join([program, shlex.join(argv)]) if argv else program


def code_version() -> str:
    """The git commit of the checkout this tunecl is imported from (12 hex digits, ``-dirty`` when a
    tracked file of the package or of ``benchmarks/`` is modified, results aside), else ``tunecl VERSION``
    (an installed package). ``TUNECL_CODE_VERSION``, when set, is taken as is: a copy of a checkout
    without its ``.git`` (a working tree sent to a GPU machine) then records the commit it was copied at."""
    given = os.environ.get("TUNECL_CODE_VERSION", "").strip()
    if given:
        return given
    package = Path(tunecl.__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=package, capture_output=True, text=True, timeout=10,
                                  check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    # a package installed inside some other repository (a venv in a project folder) is not a checkout
    if top and (Path(top) / "tunecl").resolve() == package:
        commit = git("rev-parse", "--short=12", "HEAD")
        if commit:
            dirty = git("-C", top, "status", "--porcelain", "--untracked-files=no", "--", "tunecl", "benchmarks",
                        ":(exclude)benchmarks/results")
            return commit + ("-dirty" if dirty else "")
    return f"tunecl {tunecl.__version__}"
