"""Import cycles between our modules and between our folders: layers must only look down;
and no frontend surface importing another.

Reads every ``.py`` file of the package with ``ast`` (imports inside functions and under
``TYPE_CHECKING`` count: a cycle hidden in a function is still a cycle), names each file as
the editable install does (``setup.py``'s ``package_dir``: ``engine/`` is
``tinyserve.engine``, ``frontend/`` is ``tinyserve.frontend``), and resolves ``from a.b import
c`` to the module ``a.b.c`` when that is one of ours, else to ``a.b``. A folder is a package;
a module's imports are its folder's. Prints every strongly connected group of more than one
module, then of folders, then every import from one surface's folder (``SURFACES``) into
another's: each surface is a codec over the layers below it (``chat``, ``request``, ...), so
what two surfaces share belongs there. Exits 1 if there is any (``make lint`` runs it).

    .venv/bin/python bench/import_cycles.py [--verbose]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {
    "tinyserve": ROOT / "tinyserve",
    "tinyserve.engine": ROOT / "engine",
    "tinyserve.frontend": ROOT / "frontend",
    "tinyserve_native": ROOT / "tinyserve_native",
}

# The frontend's API surfaces: folders of tinyserve.frontend that must not import each other.
SURFACES = frozenset(
    {"anthropic", "responses", "openai", "native", "embeddings", "tokenize", "dashboard"}
)

Graph = dict[str, set[str]]


def modules() -> dict[str, Path]:
    """Our module names and their files, as installed."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imports(name: str, path: Path, ours: dict[str, Path]) -> set[str]:
    """The modules of ours that ``name`` (its file ``path``) imports."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(_ours(alias.name, ours) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in ours else _ours(base, ours))
    targets.discard("")
    targets.discard(name)
    return targets


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _ours(module: str, ours: dict[str, Path]) -> str:
    """The longest name of ours that ``module`` is or lies in; "" if none."""
    while module and module not in ours:
        module = module.rpartition(".")[0]
    return module


def module_graph() -> Graph:
    ours = modules()
    return {name: imports(name, path, ours) for name, path in ours.items()}


def folder_of(name: str, graph: Graph) -> str:
    """A package is its own folder; a module's folder is its package."""
    is_package = any(other.startswith(name + ".") for other in graph)
    return name if is_package else name.rpartition(".")[0]


def folder_graph(graph: Graph) -> Graph:
    folders: Graph = defaultdict(set)
    for name, targets in graph.items():
        here = folder_of(name, graph)
        folders[here] |= {folder_of(t, graph) for t in targets} - {here}
    return dict(folders)


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def surface_of(module: str) -> str | None:
    """The surface whose folder ``module`` lies in, if it lies in one."""
    parts = module.split(".")
    if parts[:2] == ["tinyserve", "frontend"] and len(parts) > 2 and parts[2] in SURFACES:
        return parts[2]
    return None


def surface_crossings(graph: Graph) -> list[tuple[str, str]]:
    """Every import (importer, imported) from one surface's folder into another's."""
    return sorted(
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if surface_of(name) is not None and surface_of(target) not in (None, surface_of(name))
    )


def show(title: str, groups: Iterable[list[str]], graph: Graph, verbose: bool) -> int:
    groups = list(groups)
    print(f"{title}: {len(groups)}")
    for group in groups:
        print("  " + ", ".join(group))
        if verbose:
            members = set(group)
            for node in group:
                for target in sorted(graph.get(node, set()) & members):
                    print(f"    {node} -> {target}")
    return len(groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="the edges inside each cycle")
    args = parser.parse_args()
    graph = module_graph()
    folders = folder_graph(graph)
    found = show("module cycles", cycles(graph), graph, args.verbose)
    found += show("folder cycles", cycles(folders), folders, args.verbose)
    crossings = surface_crossings(graph)
    print(f"imports from one surface into another: {len(crossings)}")
    for name, target in crossings:
        print(f"  {name} -> {target}")
    sys.exit(1 if found or crossings else 0)


if __name__ == "__main__":
    main()
