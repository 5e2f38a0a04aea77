"""The quickstart through the real CLI on the local backend: launch, status, logs, stop, list."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[2]


@pytest.fixture
def rlctl(tmp_path):
    env = {**os.environ, "RLCTL_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}

    def run(*args: str, timeout: float = 120, extra_env=None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", "from rlctl.cli import main; main()", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**env, **(extra_env or {})},
            cwd=tmp_path,
        )

    return run


def short_quickstart(tmp_path: Path, steps: int) -> Path:
    path = tmp_path / f"quick{steps}.yaml"
    path.write_text(
        f"extends: {REPO / 'recipes' / 'quickstart.yaml'}\n"
        f"name: quick{steps}\n"
        "engine:\n"
        f"  trainer.total_training_steps: {steps}\n"
        "  data.train_batch_size: 8\n"
        "  actor_rollout_ref.actor.ppo_mini_batch_size: 8\n"
        "  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: 32\n"
        "  trainer.test_freq: -1\n"
        "  trainer.val_before_train: false\n"
    )
    return path


def test_quickstart_through_the_cli(rlctl, tmp_path, job_state, wait_state):
    assert rlctl("validate", "quickstart").returncode == 0
    plan = rlctl("plan", "quickstart")
    assert plan.returncode == 0, plan.stderr
    assert "-m engine.supervisor --max-restarts 3" in plan.stdout  # the job script is shown

    recipe = short_quickstart(tmp_path, steps=3)
    launched = rlctl("launch", str(recipe))
    assert launched.returncode == 0, launched.stderr
    job_id = launched.stdout.split()[1]
    assert job_id.startswith("quick3-")

    done = wait_state(rlctl, job_id, {"SUCCEEDED", "FAILED"}, poll_s=1)
    logs = rlctl("logs", job_id)
    assert done["state"] == "SUCCEEDED", logs.stdout[-3000:]
    assert "step 3/3 | score" in logs.stdout
    assert ": every check passed" in logs.stdout  # the pre-flight ran before the engine
    # each role's peak memory against the plan's figure (CPU: resident memory vs RAM)
    shown = rlctl("status", job_id).stdout
    assert "memory:   peak against the plan, of " in shown, shown
    memory = json.loads(rlctl("status", job_id, "--json").stdout)[0]["progress"]["memory"]
    roles = {r["role"]: r for r in memory["roles"]}
    assert {"actor", "rollout"} <= set(roles) and memory["cpu"] is True, memory
    assert roles["actor"]["peak_gib"] > 0 and roles["actor"]["plan_gib"] > 0
    assert roles["actor"]["above_plan"] is False  # never on CPU: RSS against tensors
    assert rlctl("logs", job_id, "-f", timeout=30).returncode == 0  # ends: the job ended

    # A second, long run, stopped while it trains: graceful, then recorded CANCELLED.
    long_run = short_quickstart(tmp_path, steps=500)
    second = rlctl("launch", str(long_run)).stdout.split()[1]
    deadline = time.monotonic() + 300
    while "step 1/500" not in rlctl("logs", second).stdout:
        assert time.monotonic() < deadline, rlctl("logs", second).stdout[-2000:]
        time.sleep(1)
    stopped = rlctl("stop", second, "--grace", "60")
    assert stopped.returncode == 0, stopped.stderr
    assert job_state(rlctl, second)["state"] == "CANCELLED"
    handle_sid = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from rlctl.store.jobs import JobStore; import json, sys; "
                f"print(json.dumps(JobStore().get('{second}').handle))",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "RLCTL_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)},
        ).stdout
    )["sid"]
    from rlctl.backends.local import _session_pids

    assert _session_pids(handle_sid) == []  # nothing of the job survives, Ray included
    # the engine ran under its supervisor: the stop reached the engine (75) and no
    # restart followed it; the finished job's one attempt finished
    jobs = tmp_path / "home" / "jobs"
    attempts = json.loads((jobs / second / "restarts.json").read_text())["attempts"]
    assert [(a["exit_code"], a["reason"], a["next"]) for a in attempts] == [
        (75, "preempted", "stop")
    ], attempts
    first = json.loads((jobs / job_id / "restarts.json").read_text())["attempts"]
    assert [(a["exit_code"], a["next"]) for a in first] == [(0, "stop")]

    listed = rlctl("list", "--json")
    states = {j["id"]: j["state"] for j in json.loads(listed.stdout)}
    assert states == {job_id: "SUCCEEDED", second: "CANCELLED"}


def test_bad_recipe_is_refused_before_anything_is_recorded(rlctl, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"extends: {REPO / 'recipes' / 'quickstart.yaml'}\nengine:\n  data.train_batch_sise: 8\n"
    )
    result = rlctl("launch", str(bad))
    assert result.returncode == 2
    assert "data.train_batch_sise" in result.stderr and "Traceback" not in result.stderr
    assert json.loads(rlctl("list", "--json").stdout) == []


def test_secrets_reach_the_job_and_nothing_else(rlctl, tmp_path, wait_state, read_metrics):
    """Secrets named in the recipe are read from the launching environment, reach the
    job's processes (the reward function sees one), and are written nowhere: not in the
    job store (the recipe keeps their names), the job's directory, what the engine wrote,
    nor Ray's session directories (HF_TOKEN among them: libraries log what they see)."""
    from tests.security.secret_files import files_holding, ray_dirs_since

    sentinel = "sk-test-5ecr3t-value"
    canaries = {"RLCTL_TEST_TOKEN": sentinel, "HF_TOKEN": "hf_canary_7f3a9c1e5b"}
    reward = tmp_path / "secret_reward.py"
    digest = hashlib.sha256(sentinel.encode()).hexdigest()  # the value is in no file
    reward.write_text(
        "import hashlib, os\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    seen = os.environ.get('RLCTL_TEST_TOKEN', '').encode()\n"
        f"    return 1.0 if hashlib.sha256(seen).hexdigest() == {digest!r} else 0.0\n"
    )
    recipe = short_quickstart(tmp_path, steps=1)
    recipe.write_text(
        recipe.read_text()
        + f"secrets: [{', '.join(canaries)}]\nreward:\n  custom: {{path: {reward}}}\n"
    )
    missing = rlctl("launch", str(recipe), extra_env={"HF_TOKEN": canaries["HF_TOKEN"]})
    assert missing.returncode == 2 and "RLCTL_TEST_TOKEN" in missing.stderr
    assert json.loads(rlctl("list", "--json").stdout) == []  # nothing recorded

    started = time.time()
    launched = rlctl("launch", str(recipe), extra_env=canaries)
    assert launched.returncode == 0, launched.stderr
    job_id = launched.stdout.split()[1]
    done = wait_state(rlctl, job_id, {"SUCCEEDED", "FAILED"}, poll_s=1)
    assert done["state"] == "SUCCEEDED", rlctl("logs", job_id).stdout[-3000:]

    home = tmp_path / "home"
    metrics = read_metrics(home / "jobs" / job_id / "run")
    assert metrics[-1]["critic/score/mean"] == 1.0  # the job saw the secret
    from rlctl.store.jobs import JobStore

    assert "RLCTL_TEST_TOKEN" in JobStore(home / "jobs.db").get(job_id).recipe_yaml  # by name
    time.sleep(1)  # Ray's log monitor flushes as it stops
    values = tuple(canaries.values())
    assert files_holding([tmp_path, *ray_dirs_since(started)], values) == []


def test_a_failing_preflight_ends_the_job_before_anything_starts(rlctl, tmp_path, wait_state):
    """The job's pre-flight (engine.doctor on the node) finds a secret set but empty: the
    job ends with exit 2 and the doctor's line in its log, before the setup steps, the
    supervisor or the engine; `preflight: false` skips the check."""
    recipe = short_quickstart(tmp_path, steps=1)
    recipe.write_text(recipe.read_text() + "secrets: [RLCTL_PREFLIGHT_TOKEN]\n")
    launched = rlctl("launch", str(recipe), extra_env={"RLCTL_PREFLIGHT_TOKEN": ""})
    assert launched.returncode == 0, launched.stderr  # set: launch takes it
    job_id = launched.stdout.split()[1]
    done = wait_state(rlctl, job_id, {"SUCCEEDED", "FAILED"}, poll_s=1)
    log = rlctl("logs", job_id).stdout
    assert done["state"] == "FAILED" and done["exit_code"] == 2, (done, log)
    failed = [line for line in log.splitlines() if line.startswith("doctor: FAILED")]
    assert len(failed) == 1 and ": secrets: not set: RLCTL_PREFLIGHT_TOKEN: export" in failed[0]
    assert "rlctl: pre-flight failed" in log
    assert "supervisor" not in log and "step 1/1" not in log
    job_dir = tmp_path / "home" / "jobs" / job_id
    assert sorted(p.name for p in job_dir.iterdir()) == [
        "engine.yaml",
        "exit_code",
        "job.log",
        "run.sh",
    ]

    skipped = tmp_path / "skipped.yaml"
    skipped.write_text(recipe.read_text() + "preflight: false\n")
    plan = rlctl("plan", str(skipped))
    assert plan.returncode == 0 and "engine.doctor" not in plan.stdout, plan.stdout
