"""The CLI's contract: fast start (no heavy imports), one error boundary, help with examples."""

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "ray", "sky", "transformers", "vllm")


def run_cli(args: list[str], home, extra_code: str = "") -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        "from rlctl.cli import main\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        f"    heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "    print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "RLCTL_HOME": str(home)},
        timeout=60,
    )


@pytest.mark.parametrize(
    "args", [["--help"], ["status"], ["list"], ["--version"], ["launch", "--help"]]
)
def test_no_heavy_imports(args, tmp_path):
    result = run_cli(args, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "HEAVY=\n" in result.stderr or result.stderr.rstrip().endswith("HEAVY=")


def test_help_shows_examples(tmp_path):
    result = run_cli(["plan", "--help"], tmp_path)
    assert "rlctl plan recipes/dapo_qwen32b.yaml" in result.stdout


def test_user_errors_print_the_fix_without_a_traceback(tmp_path):
    result = run_cli(["status", "nope"], tmp_path)
    assert result.returncode == 2
    assert "no job matches 'nope'" in result.stderr
    assert "fix: `rlctl list` shows your jobs" in result.stderr
    assert "Traceback" not in result.stderr
    missing = run_cli(["plan", "no_such_recipe"], tmp_path)
    assert missing.returncode == 2 and "bundled one: " in missing.stderr


def test_debug_variable_shows_the_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "from rlctl.cli import main; main()", "status", "nope"],
        capture_output=True,
        text=True,
        env={**os.environ, "RLCTL_HOME": str(tmp_path), "RLCTL_DEBUG": "1"},
    )
    assert "Traceback" in result.stderr


def test_plan_json_is_machine_readable(tmp_path):
    result = run_cli(["plan", "quickstart", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["plan"]["devices_per_node"] == 2 and data["plan"]["accelerator"] is None
    assert "run.sh" in data["files"] and "engine.yaml" in data["files"]
    assert not (tmp_path / "jobs").exists()  # plan has no side effects


def test_recipes_lists_the_bundled_ones(tmp_path):
    result = run_cli(["recipes"], tmp_path)
    assert result.returncode == 0, result.stderr
    for name in ("quickstart", "dapo-qwen32b", "grpo-qwen7b-ascend"):
        assert name in result.stdout


def test_every_name_recipes_lists_is_accepted(tmp_path):
    listed = [line.split()[0] for line in run_cli(["recipes"], tmp_path).stdout.splitlines()]
    assert "dapo-qwen32b" in listed
    names = [*listed, "dapo_qwen32b"]  # the file's own name too
    # One process plans them all, through the CLI's own entry point (a process each
    # spent most of its second starting Python).
    code = (
        "import contextlib, io, json, sys\n"
        "from rlctl.cli import main\n"
        "codes = {}\n"
        "for name in sys.argv[1:]:\n"
        "    sys.argv = ['rlctl', 'plan', name, '--json']\n"
        "    out = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(out):\n"
        "            main()\n"
        "        codes[name] = 0\n"
        "    except SystemExit as exc:\n"
        "        codes[name] = exc.code\n"
        "    if codes[name] == 0:\n"
        "        plan = json.loads(out.getvalue())['plan']\n"
        "        codes[name] = 0 if plan['nodes'] >= 1 else 'no nodes'\n"
        "print(json.dumps(codes))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *names],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "RLCTL_HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    codes = json.loads(result.stdout.splitlines()[-1])
    assert codes == dict.fromkeys(names, 0), result.stderr


def test_errors_need_no_click(tmp_path):
    """typer >= 0.29 no longer installs click: the error boundary must not import it (a
    laptop install of the launcher alone has none)."""
    blocked = "import sys; sys.modules['click'] = None\n"
    for args, code, text in (
        (["plan", "no_such_recipe"], 2, "error: no recipe at 'no_such_recipe'"),
        (["list", "--bogus"], 2, "No such option: --bogus"),
        (["--help"], 0, "Usage: rlctl"),
    ):
        result = subprocess.run(
            [sys.executable, "-c", blocked + "from rlctl.cli import main; main()", *args],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "RLCTL_HOME": str(tmp_path)},
        )  # fmt: skip
        assert result.returncode == code, (args, result.stderr)
        assert text in result.stdout + result.stderr and "Traceback" not in result.stderr


def test_list_all_lists_every_job(tmp_path):
    from rlctl.store.jobs import JobStore

    store = JobStore(tmp_path / "jobs.db")
    for i in range(3):
        store.create(
            name=f"r{i}", recipe_path="r.yaml", recipe_yaml="", plan_json="{}", backend="local"
        )
    every = run_cli(["list", "--all", "--json"], tmp_path)
    assert every.returncode == 0, every.stderr
    assert len(json.loads(every.stdout)) == 3
    assert len(json.loads(run_cli(["list", "-a", "--limit", "1", "--json"], tmp_path).stdout)) == 3
    assert len(json.loads(run_cli(["list", "--limit", "1", "--json"], tmp_path).stdout)) == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["list", "--bogus"], "No such option: --bogus"),
        (["launch"], "Missing argument"),
        (["list", "--limit", "0"], "Invalid value for '--limit'"),
    ],
)
def test_usage_errors_show_usage_and_exit_2(tmp_path, args, expected):
    """Not `error: NoSuchOption: ...` with exit 1: typer carries its own copy of click."""
    result = run_cli(args, tmp_path)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Usage: rlctl" in result.stderr
    assert "NoSuchOption" not in result.stderr and "Traceback" not in result.stderr
