"""``python -m tunecl.tools.coverage``'s arguments (the dry run itself is tested in tests/torch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tunecl
from tunecl.tools import coverage


@pytest.fixture
def walked(monkeypatch) -> list:
    """The net names main() hands to the dry run, which is not run here."""
    calls = []
    monkeypatch.setattr(coverage, "walk_nets", lambda names: calls.append(list(names)) or {})
    return calls


def test_help_prints_the_usage_and_walks_nothing(capsys, walked):
    with pytest.raises(SystemExit) as exit_:
        coverage.main(["--help"])
    assert exit_.value.code == 0 and walked == []
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m tunecl.tools.coverage [-h] [NET ...]") and "resnet18" in out


def test_an_unknown_option_is_a_usage_error(capsys, walked):
    with pytest.raises(SystemExit) as exit_:
        coverage.main(["--nets"])
    assert exit_.value.code == 2 and walked == []
    assert "unrecognized arguments: --nets" in capsys.readouterr().err


def test_nets_are_the_named_ones_or_all(walked):
    assert coverage.main(["resnet18", "vgg16"]) == 0
    assert coverage.main([]) == 0
    assert walked == [["resnet18", "vgg16"], [*coverage.NETS, *coverage.BEYOND_CNNS]]


def test_help_from_the_command_line():
    env = {**os.environ, "PYTHONPATH": str(Path(tunecl.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-m", "tunecl.tools.coverage", "--help"], check=False,
                          capture_output=True, text=True, env=env, timeout=120)
    assert (done.returncode, done.stderr) == (0, "") and done.stdout.startswith("usage: ")
