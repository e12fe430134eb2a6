"""A package's imports read from its source with ``ast``, nothing imported: what each module imports, and
the import cycles between its modules.

Every import statement counts, at module level, under ``if TYPE_CHECKING:`` or inside a function.
Relative imports are resolved. ``from a.b import c`` is an edge to ``a.b.c`` when that is a module of
the package, else to ``a.b``, so a package's ``__init__`` that re-exports its submodules is no cycle by
itself.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """One imported module: ``base`` is the module an ``import``/``from`` statement names (resolved),
    ``names`` what a ``from`` statement takes from it."""

    base: str
    names: tuple[str, ...]
    line: int
    text: str


@dataclass(frozen=True)
class Edge:
    """An import of module ``target`` by ``source`` at ``path:line`` (``path`` relative to the package's
    parent folder)."""

    source: str
    target: str
    path: Path
    line: int
    text: str


def modules(root: Path) -> dict[str, Path]:
    """Module name -> source file of every module in the package whose folder is ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        name = ".".join((root.name, *path.relative_to(root).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, module: str) -> list[Import]:
    """Every import in ``path`` (the source of ``module``), relative ones resolved."""
    source = path.read_text()
    lines = source.splitlines()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        text = lines[node.lineno - 1].strip() if isinstance(node, (ast.Import, ast.ImportFrom)) else ""
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, (), node.lineno, text) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - (node.level - 1)])
                base = f"{anchor}.{base}" if base else anchor
            found.append(Import(base, tuple(alias.name for alias in node.names), node.lineno, text))
    return sorted(found, key=lambda imp: imp.line)


def graph(root: Path) -> dict[str, list[Edge]]:
    """Module -> its imports of other modules of the package at ``root``."""
    known = modules(root)
    edges: dict[str, list[Edge]] = {name: [] for name in known}
    for module, path in known.items():
        for imp in imports(path, module):
            targets = {f"{imp.base}.{name}" for name in imp.names} & known.keys()
            if len(targets) < len(imp.names) or not imp.names:
                targets.add(imp.base)
            for target in sorted(targets & known.keys() - {module}):
                edges[module].append(Edge(module, target, path.relative_to(root.parent), imp.line, imp.text))
    return edges


def cycles(root: Path) -> list[list[Edge]]:
    """The strongly connected components of more than one module, each as the imports between its
    modules (Tarjan's algorithm), sorted by module name."""
    edges = graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for edge in edges[module]:
            if edge.target not in index:
                visit(edge.target)
                low[module] = min(low[module], low[edge.target])
            elif edge.target in on_stack:
                low[module] = min(low[module], index[edge.target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            components.append(component)

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(([edge for member in sorted(component) for edge in edges[member] if edge.target in component]
                   for component in components if len(component) > 1), key=lambda cycle: cycle[0].source)


def describe(found: list[list[Edge]]) -> str:
    """Each cycle's modules, then the import lines that join them."""
    parts = []
    for cycle in found:
        members = sorted({edge.source for edge in cycle})
        parts.append("cycle: " + " <-> ".join(members))
        parts.extend(f"  {edge.source} -> {edge.target}  ({edge.path}:{edge.line}: {edge.text})"
                     for edge in cycle)
    return "\n".join(parts)
