"""What every bundled recipe renders for every backend, and its plan, kept under
tests/rlctl/golden/: a refactor of the launcher's path from recipe to job must leave these
unchanged, or change them on purpose (regenerate, read the diff, say why in the commit).

    RLCTL_UPDATE_GOLDEN=1 scripts/test.sh tests/rlctl/test_golden_renders.py

A refusal is a render too: a recipe a backend cannot run keeps its error text.
Machine-specific parts are fixed before rendering: the home directory (and so
``RLCTL_HOME`` and Slurm's default job root) is ``/golden/home``, and the Python that
local jobs run is ``/opt/venv/bin/python``.

A render is kept whole once per kind of backend: local, Slurm, and SkyPilot on
``KEPT_CLOUD``. SkyPilot on another cloud differs from it only in the task's
``resources:`` block (the infra, the accelerators the cloud offers): that block is the
cloud's golden (``resources.yaml``), and the rest of its render must equal the kept
cloud's golden. A refusal is the cloud's own (``error.txt``), and so is a whole render
where the kept cloud refuses.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from rlctl import api
from rlctl.errors import RlctlError

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("RLCTL_UPDATE_GOLDEN") == "1"
BACKENDS = {  # the kept cloud before the others: they are checked against its golden
    "local": ("local", {}),
    "slurm": ("slurm", {}),
    "skypilot-gcp": ("skypilot", {"cloud": "gcp"}),
    "skypilot-aws": ("skypilot", {"cloud": "aws"}),
    "skypilot-azure": ("skypilot", {"cloud": "azure"}),
}
KEPT_CLOUD = "skypilot-gcp"
RECIPES = sorted(p.stem for p in api.BUNDLED_RECIPES.glob("*.yaml"))
FAKE_HOME = "/golden/home"
FAKE_PYTHON = "/opt/venv/bin/python"


def render(recipe_name: str, backend: str, options: dict, tmp_path: Path) -> dict[str, str]:
    """File name -> text: the rendered files and plan.json, or error.txt."""
    recipe = api.load_recipe(api.find_recipe(recipe_name))
    try:
        prepared = api.prepare(recipe, backend, job_id="golden", **options)
    except RlctlError as exc:
        out = {"error.txt": str(exc) + "\n"}
    else:
        out = dict(prepared.files)
        out["plan.json"] = json.dumps(prepared.plan.to_json(), indent=1, sort_keys=True) + "\n"
    home = str(tmp_path / "home")
    return {name: text.replace(home, FAKE_HOME) for name, text in out.items()}


@pytest.fixture
def fixed_machine(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RLCTL_HOME", str(home / ".rlctl"))
    monkeypatch.setattr(sys, "executable", FAKE_PYTHON)
    return tmp_path


def split_resources(files: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """A SkyPilot render in two: the task's ``resources:`` block (``resources.yaml``),
    and the rest (the task without that block, the other files as they are)."""
    lines = files["task.yaml"].splitlines(keepends=True)
    start = lines.index("resources:\n")
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines)
    )
    rest = {**files, "task.yaml": "".join(lines[:start] + lines[end:])}
    return {"resources.yaml": "".join(lines[start:end])}, rest


def read_golden(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*") if p.is_file()
    }


def assert_same(got: dict[str, str], want: dict[str, str], what: str) -> None:
    assert sorted(got) == sorted(want), f"{what}: files differ"
    for name in sorted(want):
        if got[name] != want[name]:
            diff = difflib.unified_diff(
                want[name].splitlines(), got[name].splitlines(), "golden", "now", lineterm=""
            )
            pytest.fail(f"{what}, {name}:\n" + "\n".join(list(diff)[:80]))


@pytest.mark.parametrize("backend_key", list(BACKENDS))
@pytest.mark.parametrize("recipe_name", RECIPES)
def test_render_matches_golden(recipe_name, backend_key, fixed_machine):
    backend, options = BACKENDS[backend_key]
    got = render(recipe_name, backend, options, fixed_machine)
    shared = kept = None
    if backend == "skypilot" and backend_key != KEPT_CLOUD:
        kept = read_golden(GOLDEN / recipe_name / KEPT_CLOUD)
        # A refusal here, or a render where the kept cloud refuses, is this cloud's alone
        if "error.txt" not in got and "error.txt" not in kept:
            got, shared = split_resources(got)
    folder = GOLDEN / recipe_name / backend_key
    if UPDATE:
        if folder.exists():
            shutil.rmtree(folder)
        for name, text in got.items():  # a shipped file's name may have folders (tools/)
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    assert folder.is_dir(), f"no golden renders for {recipe_name} on {backend_key}: {__doc__}"
    assert_same(got, read_golden(folder), f"{recipe_name} on {backend_key}")
    if shared is not None:  # the rest is the kept cloud's, byte for byte
        assert_same(
            shared,
            split_resources(kept)[1],
            f"{recipe_name} on {backend_key} beyond its resources, against {KEPT_CLOUD}",
        )


def test_every_bundled_recipe_has_goldens():
    """A new recipe gets goldens, and a removed one takes its own along."""
    assert sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()) == RECIPES
