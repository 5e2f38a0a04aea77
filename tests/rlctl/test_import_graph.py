"""rlctl's modules import each other without a circle, lazy imports included: a circle
(api -> backends -> skypilot -> api, once) means two rooms that each need the other,
and an order of imports that works only by accident."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rlctl"


def module_names() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the rlctl modules it imports anywhere in its body. ``from pkg import
    mod`` counts as importing ``pkg.mod``; a module's own parent packages are left out
    (Python runs them first whatever the module does)."""
    modules = module_names()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
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


def test_rlctl_has_no_import_circle():
    assert circles(import_graph()) == []


def test_the_check_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert "rlctl.api" in import_graph()["rlctl.cli.launch"]  # lazy imports count


def engine_imports() -> dict[str, set[str]]:
    """rlctl module -> the engine modules it imports, anywhere in its body."""
    out: dict[str, set[str]] = {}
    for name, path in module_names().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target == "engine" or target.startswith("engine."):
                    out.setdefault(name, set()).add(target)
    return out


def test_rlctl_uses_the_engine_through_engine_schema_only():
    used = engine_imports()
    assert used, "rlctl reads the engine's config schema: the check sees nothing?"
    others = {module: targets - {"engine.schema"} for module, targets in used.items()}
    assert {m: t for m, t in others.items() if t} == {}


def test_engine_schema_imports_neither_torch_nor_ray():
    import subprocess
    import sys

    probe = (
        "import sys, engine.schema; "
        "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE.parent,
    )
    assert out.stdout.strip() == "[]"
