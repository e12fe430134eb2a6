"""Append measured results to a results CSV, with the command line that measured them and the commit of
the code that ran.

Two kinds of file: ``benchmarks/results/results.csv`` (:data:`COLUMNS`, rows from :func:`row`: tunecl's
figure next to a peer's) and ``benchmarks/results/host.csv`` (:data:`HOST_COLUMNS`, rows from
:func:`host_row`: host time in µs per case of the host-time benchmarks, with its spread and the load).
The file is checked before a benchmark starts (:func:`check_file`), so a long run never ends on a file
it cannot write; a row is appended in one write, never rewriting what is there. A file whose header
differs from its kind's columns is refused.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import os
import shlex
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import tunecl
from tunecl.errors import TuneclError

COLUMNS = ("date", "device", "benchmark", "workload", "precision", "unit", "ours", "peer", "peer_name",
           "ratio", "command", "commit")
THROUGHPUT_UNITS = {"GFLOP/s", "TFLOP/s", "GB/s"}  # higher is better: the ratio is peer ÷ ours
HOST_COLUMNS = ("date", "device", "benchmark", "case", "measure", "ours_us", "ours_min_us", "ours_max_us",
                "peer_us", "peer_name", "load", "command", "commit")
# benchmarks/results/validate.csv: one row per net benchmarks/validate_nets.py checked
VALIDATE_COLUMNS = ("date", "device", "net", "batch", "image_size", "seed", "compiled", "eval_passed",
                    "eval_output_rel", "train_passed", "train_checks", "train_worst_rel_vs_cpu_fp32", "passed_by_fp32",
                    "passed_by_fp64", "passed_by_zero", "passed_by_own", "passed_by_perturbed", "failed",
                    "fallback_ops", "command")
_KINDS = {COLUMNS: "tunecl's results columns", HOST_COLUMNS: "tunecl's host-time columns",
          VALIDATE_COLUMNS: "validate.csv's columns"}


def check_file(path: str | Path, columns: Sequence[str] = COLUMNS) -> Path:
    """``path`` as a file :func:`append` can extend: a new file in an existing folder, or a CSV whose
    header is ``columns`` (:data:`COLUMNS` or :data:`HOST_COLUMNS`). Raises TuneclError (one line)
    otherwise."""
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
    if tuple(header) != tuple(columns):
        raise TuneclError(f"--record {path}: its header is not {_KINDS.get(tuple(columns), 'the expected columns')} "
                          f"({','.join(columns)}); give a new file or a CSV with that header")
    return path


def check_argument(prog: str, path: str | Path, columns: Sequence[str] = COLUMNS) -> Path:
    """:func:`check_file` for a script's ``--record`` argument: a usage error (``prog: error: ...``, exit
    status 1) instead of a traceback."""
    try:
        return check_file(path, columns)
    except TuneclError as error:
        raise SystemExit(f"{prog}: error: {error}") from None


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


def host_row(*, device: str, benchmark: str, case: str, measure: str, samples_us: Sequence[float],
             command: str, commit: str, load: float | None, peer_us: float | None = None, peer_name: str = "",
             date: dt.date | None = None) -> dict[str, str]:
    """One host-time row: ``ours_us`` is the median of ``samples_us`` (one figure per round or per step,
    as the benchmark prints its median), ``ours_min_us``-``ours_max_us`` their spread; ``peer_us`` the
    peer's figure timed in the same run, when the benchmark times one; ``load`` the host's load average."""
    if not samples_us or min(samples_us) < 0 or not all(math.isfinite(v) for v in samples_us):
        raise TuneclError(f"cannot record {case} ({measure}): no usable samples {list(samples_us)}")
    if peer_us is not None and (peer_us <= 0 or not peer_name):
        raise TuneclError(f"cannot record {case} ({measure}): a peer needs a positive time and a name")
    return {"date": (date or dt.date.today()).isoformat(), "device": device, "benchmark": benchmark, "case": case,
            "measure": measure, "ours_us": figure(statistics.median(samples_us)),
            "ours_min_us": figure(min(samples_us)), "ours_max_us": figure(max(samples_us)),
            "peer_us": "" if peer_us is None else figure(peer_us), "peer_name": peer_name if peer_us else "",
            "load": "" if load is None or not math.isfinite(load) else f"{load:.2f}", "command": command,
            "commit": commit}


def load_average() -> float | None:
    """The host's load average over the last minute (None where the system does not report one)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def append(path: str | Path, rows: Sequence[Mapping[str, str]], columns: Sequence[str] = COLUMNS) -> None:
    """Append ``rows`` to the CSV at ``path`` (written with its header ``columns`` when new or empty), in
    one write."""
    path = check_file(path, columns)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    if not path.exists() or path.stat().st_size == 0:
        writer.writeheader()
    else:
        with path.open("rb") as fh:
            fh.seek(-1, 2)
            if fh.read(1) != b"\n":
                out.write("\n")   # the last row lacks its line end
    for values in rows:
        writer.writerow({column: values[column] for column in columns})
    with path.open("a", newline="") as fh:
        fh.write(out.getvalue())


def command_line(program: str, argv: Sequence[str]) -> str:
    """The command as a shell would take it back: ``program`` and the arguments, quoted where needed."""
    return " ".join([program, shlex.join(argv)]) if argv else program


def script_command(script: str | Path, argv: Sequence[str] | None) -> str:
    """The command line of a benchmark script as run: ``python FOLDER/NAME.py`` (``script`` is its
    ``__file__``) and ``argv``, or this process's arguments when ``argv`` is None (run from the shell)."""
    script = Path(script)
    return command_line(f"python {script.parent.name}/{script.name}", sys.argv[1:] if argv is None else argv)


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
