"""No import cycles between tunecl's modules, checked on the source (tests/module_imports.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import module_imports

import tunecl

ROOT = Path(tunecl.__file__).parent


def test_no_import_cycles():
    found = module_imports.cycles(ROOT)
    assert not found, "import cycles between tunecl modules:\n" + module_imports.describe(found)


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root / "pkg"


def test_a_cycle_through_a_deferred_import_is_reported(tmp_path):
    package = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.sub.b import helper\n",
        "sub/__init__.py": "",
        "sub/b.py": """
            def helper():
                from .. import a
                return a
            """,
        "c.py": "import pkg.a\n",
    })
    found = module_imports.cycles(package)
    assert [[(edge.source, edge.target, edge.line) for edge in cycle] for cycle in found] == [
        [("pkg.a", "pkg.sub.b", 1), ("pkg.sub.b", "pkg.a", 3)]]
    message = module_imports.describe(found)
    assert "cycle: pkg.a <-> pkg.sub.b" in message
    assert "pkg/sub/b.py:3: from .. import a" in message


def test_a_package_reexporting_its_modules_is_no_cycle(tmp_path):
    package = _package(tmp_path, {
        "__init__.py": "from pkg import a, b\nfrom pkg.b import VALUE\n",
        "a.py": "from pkg import b\nfrom pkg.errors import Failure\n",
        "b.py": "from . import errors\nVALUE = errors.Failure\n",
        "errors.py": "class Failure(Exception):\n    pass\n",
    })
    assert module_imports.cycles(package) == []
    assert {edge.target for edge in module_imports.graph(package)["pkg"]} == {"pkg.a", "pkg.b"}
