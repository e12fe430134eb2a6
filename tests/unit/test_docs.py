"""The README and docs/ stay consistent with the results data and with what CI runs."""

from __future__ import annotations

import csv
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "results" / "results.csv"
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest -q -n auto"


def _plot_results():
    spec = importlib.util.spec_from_file_location("plot_results", ROOT / "benchmarks" / "plot_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_short_and_keeps_the_test_command_ci_mirrors():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    assert f"    {TEST_COMMAND}\n" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "install -q -e '.[test]'" in ci and "-m pytest -q -n auto" in ci


def test_docs_results_page_is_generated_from_the_data():
    plot = _plot_results()
    expected = plot.page(plot.load(RESULTS))  # (load also checks every ratio against ours / peer)
    page = (ROOT / "docs" / "results.md").read_text()
    assert page == expected, "regenerate: python benchmarks/plot_results.py --markdown > docs/results.md"


def test_every_figure_of_the_readme_results_table_is_in_the_data():
    with RESULTS.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    known = set()
    for row in rows:
        for column in ("ours", "peer"):
            value = float(row[column])
            known.add(f"{value:.2f}")
            if row["unit"] == "GFLOP/s":
                known.add(f"{value / 1000:.1f}")  # shown as TFLOP/s
        known.add(row["ratio"])
    section = README.read_text().split("## Results", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| workload")]
    assert table
    for line in table:
        # the figure columns: tunecl, torch CUDA, ratio (the last three cells)
        for cell in line.strip("|").split("|")[-3:]:
            for figure in re.findall(r"\d+\.\d+", cell):
                assert figure in known or f"{float(figure):.2f}" in known, f"{figure} ({line.strip()})"


def test_docs_links_resolve():
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def _subcommands(parser):
    import argparse

    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def test_every_db_subcommand_and_its_options_are_on_the_commands_page():
    from tunecl.cli import build_parser

    page = (ROOT / "docs" / "commands.md").read_text()
    section = page.split("## `tunecl db`", 1)[1].split("\n## ", 1)[0]
    for name, command in _subcommands(_subcommands(build_parser())["db"]).items():
        assert f"`tunecl db {name}" in section, name
        for action in command._actions:   # each option under one of its spellings (-o or --output)
            spellings = [o for o in action.option_strings if o not in ("-h", "--help")]
            assert not spellings or any(f"`{o}" in section or f"[{o}" in section for o in spellings), \
                f"tunecl db {name} {spellings}"
