"""The launcher as a laptop gets it: ``pip install rlctl`` with its own dependencies only
(no engine extras: no torch, Ray or transformers, and no click beside typer's own), then
its CLI through the errors users make and a plan on each backend. The suite's venv has
every extra and so would hide an import the base install lacks (as it hid click)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("base")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(root / "dist"), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (root / "dist").glob("rlctl-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    return venv


def rlctl(venv: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(venv / "bin/rlctl"), *args], capture_output=True, text=True, timeout=120,
        cwd=home, env={**env, "RLCTL_HOME": str(home / "state")},
    )  # fmt: skip


def test_the_base_install_has_none_of_the_engines_packages(base_venv):
    probe = "import importlib.util as u; print([m for m in ('torch', 'ray', 'transformers'," \
        " 'sky') if u.find_spec(m)])"  # fmt: skip
    out = subprocess.run([str(base_venv / "bin/python"), "-c", probe], capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["plan", "no_such_recipe"], "no recipe at 'no_such_recipe'"),
        (["validate", "no_such_recipe"], "no recipe at 'no_such_recipe'"),
        (["launch", "no_such_recipe"], "no recipe at 'no_such_recipe'"),
        (["plan", "quickstart", "--backend", "kubernetes"], "kubernetes"),
        (["plan", "quickstart", "--cloud", "nocloud"], "nocloud"),
        (["launch", "bad.yaml"], "trainer.total_epochs_typo"),
        (["validate", "bad.yaml"], "trainer.total_epochs_typo"),
        (["logs", "no-such-job"], "no-such-job"),
        (["stop", "no-such-job"], "no-such-job"),
        (["status", "no-such-job"], "no-such-job"),
        (["list", "--bogus"], "No such option: --bogus"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_every_error_is_a_message_with_exit_2_and_nothing_recorded(
    base_venv, tmp_path, args, expected
):
    (tmp_path / "bad.yaml").write_text(
        "name: bad\nalgorithm: grpo\nmodel: rlctl:tiny\ndata:\n  prepare: synthetic\n"
        "hardware:\n  accelerators: cpu:2\nengine:\n  trainer.total_epochs_typo: 3\n"
    )
    result = rlctl(base_venv, tmp_path, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert expected in result.stdout + result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    listed = rlctl(base_venv, tmp_path, "list", "--all", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []  # no half-made job


@pytest.mark.parametrize(
    "backend",
    [[], ["--backend", "slurm", "--partition", "gpu"], ["--cloud", "gcp"]],
    ids=["local", "slurm", "skypilot-gcp"],
)
def test_a_bundled_recipe_plans_on_each_backend(base_venv, tmp_path, backend):
    result = rlctl(base_venv, tmp_path, "plan", "grpo-qwen05b-gsm8k", "--json", *backend)
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout)
    assert plan, result.stdout[:500]


def test_every_listed_recipe_name_is_accepted(base_venv, tmp_path):
    listed = rlctl(base_venv, tmp_path, "recipes")
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    assert "quickstart" in names and "dapo-qwen32b" in names
    for name in names:
        result = rlctl(base_venv, tmp_path, "validate", name)
        assert result.returncode == 0, (name, result.stderr[-1000:])
