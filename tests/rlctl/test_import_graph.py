"""rlctl's modules import each other without a circle, lazy imports included: a circle
(api -> backends -> skypilot -> api, once) means two rooms that each need the other,
and an order of imports that works only by accident."""

from __future__ import annotations

import ast
from pathlib import Path

import tests.import_graph as shared
from tests.import_graph import circles

PACKAGE = Path(__file__).resolve().parents[2] / "rlctl"


def module_names() -> dict[str, Path]:
    return shared.module_names(PACKAGE)


def import_graph() -> dict[str, set[str]]:
    return shared.import_graph(PACKAGE)


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


# The launcher's stages, each importing only those before it (and the shared modules at
# the top of rlctl/: errors, hardware, models, yamlfile, home, bundled).
STAGES = ["rlctl.recipe", "rlctl.planner", "rlctl.job", "rlctl.backends", "rlctl.api", "rlctl.cli"]


def test_each_stage_imports_only_the_stages_before_it():
    """recipe -> planner -> job -> backends -> api -> cli: no stage reaches a later one,
    the stages before the backends keep out of the job store, and no two packages of
    rlctl import each other."""
    packages = shared.package_graph(shared.import_graph(PACKAGE, runtime_only=True))
    for i, stage in enumerate(STAGES):
        assert packages[stage] & set(STAGES[i + 1 :]) == set(), stage
    for stage in STAGES[:3]:
        assert "rlctl.store" not in packages[stage], stage
    both = sorted((a, b) for a in packages for b in packages[a] if a < b and a in packages[b])
    assert both == []


def test_no_module_imports_another_modules_private_name():
    """What a module gives others is public; ``_name`` stays in its own module."""
    assert shared.private_imports(PACKAGE) == []
