"""A package's import graph, lazy imports included, and its circles: shared by the tests
that keep rlctl and the engine free of them (tests/rlctl/test_import_graph.py,
tests/engine/test_engine_import_graph.py)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def module_names(package: Path) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:``: never run, so never an import."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None) if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            skip |= {id(x) for sub in node.body for x in ast.walk(sub)}
    return skip


def import_graph(package: Path, runtime_only: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its body (``runtime_only``:
    not those under ``if TYPE_CHECKING:``). ``from pkg import mod`` counts as importing
    ``pkg.mod``; a module's own parent packages are left out (Python runs them first
    whatever the module does)."""
    modules = module_names(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_only(tree) if runtime_only else set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in targets if t in modules] or [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target in modules and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_graph(graph: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The module graph seen from its packages: each module becomes its first ``depth``
    name parts (``engine.algo.kl`` -> ``engine.algo``), and imports inside one go."""
    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        source = ".".join(name.split(".")[:depth])
        out.setdefault(source, set())
        for target in targets:
            target = ".".join(target.split(".")[:depth])
            out.setdefault(target, set())
            if target != source:
                out[source].add(target)
    return out


def private_imports(package: Path) -> list[str]:
    """Every ``from <package>.x import _name`` in the package: a module's _name is its own."""
    found = []
    for name, path in module_names(package).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package.name):
                found += [
                    f"{name}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return found
