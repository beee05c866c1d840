"""fedflex's own import graph, read from the source (nothing is imported or run).

    python scripts/import_graph.py             # folder -> folder edges as a Mermaid graph
    python scripts/import_graph.py --modules   # module -> module edges, one per line
    python scripts/import_graph.py --check     # exit 1 on an import cycle or a private name
                                               # imported from another module

Modules are those of the packages fedflex installs: fedflex/ and the top-level folders
strategies/ and clients/, which install as fedflex.strategies and fedflex.clients
(pyproject.toml's package-dir). Every import counts, at module level or inside a
function, except those under ``if TYPE_CHECKING:`` (annotations only). tests/test_imports.py
runs the check.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: folder -> the package name it installs as
PACKAGES = {"fedflex": "fedflex", "strategies": "fedflex.strategies", "clients": "fedflex.clients"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Return every module name of the installed packages -> its file."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST):
    """Yield the import statements of a module, skipping ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                stack.extend(child.orelse)  # type: ignore[attr-defined]
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def edges(root: Path = ROOT) -> tuple[dict[str, set[str]], list[str]]:
    """Return ``module -> modules it imports`` (fedflex's own only) and the private names that
    a module imports from another (``"importer: module._name"``).
    """
    known = modules(root)
    graph: dict[str, set[str]] = defaultdict(set)
    private = []
    for name, path in known.items():
        graph[name]
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in known)
                continue
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in known:
                    graph[name].add(target)
                elif base in known:
                    graph[name].add(base)
                    if alias.name.startswith("_") and base != name:
                        private.append(f"{name}: {base}.{alias.name}")
    graph = {k: {t for t in v if t != k} for k, v in graph.items()}
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def folder_of(module: str) -> str:
    """Return the folder a module sits in: ``fedflex.launch.deploy.x`` -> ``fedflex/launch/deploy``."""
    for folder, package in sorted(PACKAGES.items(), key=lambda kv: -len(kv[1])):
        if module == package or module.startswith(package + "."):
            rest = [part for part in module[len(package) :].split(".") if part]
            path = modules()[module]
            depth = len(rest) if path.name == "__init__.py" else len(rest) - 1
            return "/".join([folder, *rest[:depth]])
    raise KeyError(module)


def folder_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], int]:
    """Return ``(folder, folder) -> number of module imports`` between different folders."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for source, targets in graph.items():
        for target in targets:
            pair = (folder_of(source), folder_of(target))
            if pair[0] != pair[1]:
                counts[pair] += 1
    return dict(counts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="module -> module edges")
    parser.add_argument("--check", action="store_true", help="exit 1 on a cycle or a private import")
    args = parser.parse_args(argv)
    graph, private = edges()
    if args.check:
        problems = [f"cycle: {' <-> '.join(c)}" for c in cycles(graph)] + [f"private: {p}" for p in private]
        print("\n".join(problems) or f"{len(graph)} modules: no import cycle, no private name imported")
        return 1 if problems else 0
    if args.modules:
        for source in sorted(graph):
            for target in sorted(graph[source]):
                print(f"{source} -> {target}")
        return 0
    print("graph TD")
    for (source, target), n in sorted(folder_edges(graph).items()):
        print(f'  {source.replace("/", "_")}["{source}/"] -->|{n}| {target.replace("/", "_")}["{target}/"]')
    return 0


if __name__ == "__main__":
    sys.exit(main())
