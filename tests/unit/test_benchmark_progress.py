"""``benchmarks/gemm.py`` draws tune's progress line only on a terminal, as ``tunecl tune`` does."""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
from pathlib import Path

import pytest

from tunecl.cli.tune import ProgressLine
from tunecl.problems import GemmProblem

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gemm.py"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def gemm_script():
    spec = importlib.util.spec_from_file_location("benchmark_gemm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _progress_given(gemm_script, monkeypatch, stderr, no_progress=False):
    """The progress callback tune_shape hands the tuner when stderr is ``stderr``."""
    seen = []

    def fake_tune(problem, device, db, *, progress, **options):
        seen.append(progress)
        return "outcome"

    monkeypatch.setattr(gemm_script, "tune_problem", fake_tune)
    monkeypatch.setattr(sys, "stderr", stderr)
    args = argparse.Namespace(trials=2, time_limit=None, sampler="tpe", storage=None, no_progress=no_progress)
    assert gemm_script.tune_shape(None, None, GemmProblem(8, 8, 8), args, None, "fp32") == "outcome"
    return seen[0]


def test_no_progress_line_when_stderr_is_not_a_terminal(gemm_script, monkeypatch):
    log = io.StringIO()
    assert _progress_given(gemm_script, monkeypatch, log) is None
    assert log.getvalue() == ""


def test_a_progress_line_on_a_terminal_unless_no_progress(gemm_script, monkeypatch):
    assert isinstance(_progress_given(gemm_script, monkeypatch, Terminal()), ProgressLine)
    assert _progress_given(gemm_script, monkeypatch, Terminal(), no_progress=True) is None


def test_the_option_parses(gemm_script, capsys):
    with pytest.raises(SystemExit):
        gemm_script.main(["--help"])
    assert "--no-progress" in capsys.readouterr().out
