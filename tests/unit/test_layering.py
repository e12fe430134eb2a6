"""The layer rules of docs/architecture.md, checked on the source (tests/module_imports.py): imports only
point downward."""

from pathlib import Path

import module_imports

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
    # the kernel wings: conv's GEMM-backed families run the GEMM core's plans; the shared host modules,
    # the GEMM wing and the backend's libraries import no wing above them
    "tunecl.kernels.gemm": ("tunecl.kernels.conv", "tunecl.kernels.ops", "tunecl.kernels.attention"),
    "tunecl.kernels.conv": ("tunecl.kernels.ops", "tunecl.kernels.attention"),
    "tunecl.kernels.ops": ("tunecl.kernels.gemm", "tunecl.kernels.conv", "tunecl.kernels.attention"),
    "tunecl.kernels.base": ("tunecl.kernels.gemm", "tunecl.kernels.conv", "tunecl.kernels.ops"),
    "tunecl.kernels.sizes": ("tunecl.kernels.gemm", "tunecl.kernels.conv", "tunecl.kernels.ops"),
    "tunecl.kernels.strided": ("tunecl.kernels.gemm", "tunecl.kernels.conv", "tunecl.kernels.ops"),
    "tunecl.kernels.launches": ("tunecl.kernels.gemm", "tunecl.kernels.conv", "tunecl.kernels.ops"),
    "tunecl.db": ("tunecl.kernels", "tunecl.search", "tunecl.backend", "tunecl.tune", "torch", "pyopencl"),
    "tunecl.search": ("tunecl.db", "tunecl.backend", "tunecl.tune", "tunecl.cli"),
    "tunecl.tune": ("tunecl.backend", "tunecl.cli"),
    "tunecl.backend": ("tunecl.search", "tunecl.cli"),
    "tunecl.tools": ("tunecl.cli",),
}


def test_imports_only_point_downward():
    broken = []
    edges = module_imports.graph(ROOT)
    for module, path in module_imports.modules(ROOT).items():
        # `from tunecl import tune` names the module tunecl.tune as well as the package tunecl
        names = {imp.base for imp in module_imports.imports(path, module)} | {e.target for e in edges[module]}
        for prefix, forbidden in FORBIDDEN.items():
            if module == prefix or module.startswith(prefix + "."):
                for name in sorted(names):
                    if any(name == f.rstrip(".") or name.startswith(f if f.endswith(".") else f + ".")
                           or name == f for f in forbidden):
                        broken.append(f"{module} imports {name}")
    assert not broken, "layer violations:\n" + "\n".join(broken)
