"""The layer rules of DESIGN.md, checked on the source: imports only point downward."""

import ast
from pathlib import Path

import tunecl

ROOT = Path(tunecl.__file__).parent

# package prefix -> prefixes it must never import
FORBIDDEN = {
    "tunecl.problems": ("tunecl.", "torch", "pyopencl", "sqlalchemy", "optuna"),
    "tunecl.fingerprint": ("tunecl.", "torch", "pyopencl", "sqlalchemy", "optuna"),
    "tunecl.precision": ("tunecl.", "torch", "pyopencl", "sqlalchemy", "optuna"),  # torch's flags are passed in
    "tunecl.runtime": ("tunecl.kernels", "tunecl.search", "tunecl.db", "tunecl.backend", "tunecl.tune",
                       "tunecl.cli", "torch", "sqlalchemy", "optuna"),
    "tunecl.kernels": ("tunecl.db", "tunecl.search", "tunecl.backend", "tunecl.tune", "tunecl.cli",
                       "optuna", "sqlalchemy", "torch"),
    "tunecl.db": ("tunecl.kernels", "tunecl.search", "tunecl.backend", "tunecl.tune", "torch", "pyopencl"),
    "tunecl.search": ("tunecl.db", "tunecl.backend", "tunecl.tune", "tunecl.cli"),
    "tunecl.tune": ("tunecl.backend", "tunecl.cli"),
    "tunecl.backend": ("tunecl.search", "tunecl.cli"),
    "tunecl.tools": ("tunecl.cli",),
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_imports_only_point_downward():
    broken = []
    for path in sorted(ROOT.rglob("*.py")):
        module = "tunecl." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for prefix, forbidden in FORBIDDEN.items():
            if module == prefix or module.startswith(prefix + "."):
                for name in _imports(path):
                    if any(name == f.rstrip(".") or name.startswith(f if f.endswith(".") else f + ".")
                           or name == f for f in forbidden):
                        broken.append(f"{module} imports {name}")
    assert not broken, "layer violations:\n" + "\n".join(broken)
