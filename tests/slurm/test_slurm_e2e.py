"""`rlctl launch --backend slurm` against real Slurm daemons (two emulated nodes on this
host, see conftest.py): a two-node Ray cluster forms, the engine trains, the job's states,
logs and stop work through the CLI, and nothing of Ray outlives a job."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlctl import __version__
from rlctl.store.jobs import JobStore

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
# The CLI as users run it.
CLI = "from rlctl.cli import main; main()"


def write_profile(home: Path, jobs: Path, **extra: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    venv_bin = Path(sys.executable).parent
    # the job's nodes run this Python (with ray and the engine) first on their PATH; a
    # test's own prelude replaces this one (a profile names each key once)
    extra.setdefault(
        "prelude", f"[{json.dumps('export PATH=' + shlex.quote(str(venv_bin)) + ':$PATH')}]"
    )
    lines = [
        f"job_root: {jobs}",
        "ray_wait_s: 180",
        *(f"{key}: {value}" for key, value in extra.items()),
    ]
    (home / "slurm.yaml").write_text("\n".join(lines) + "\n")


@pytest.fixture
def rlctl(tmp_path, slurm_cluster):
    home = tmp_path / "home"
    write_profile(home, tmp_path / "jobs")
    env = {
        **os.environ,
        **slurm_cluster.env,
        "RLCTL_HOME": str(home),
    }
    # sbatch passes the launcher's environment on: no checkout on the job's PYTHONPATH,
    # so the job runs the wheel rlctl ships with it (the CLI itself runs the installed rlctl)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != REPO
    )

    def run(*args: str, timeout: float = 120, home_dir: Path = home) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", CLI, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**env, "RLCTL_HOME": str(home_dir)},
            cwd=tmp_path,
        )

    run.home = home
    return run


def recipe(tmp_path: Path, name: str, steps: int, **engine) -> Path:
    path = tmp_path / f"{name}.yaml"
    extra = "".join(f"  {key}: {value}\n" for key, value in engine.items())
    path.write_text(
        f"extends: {REPO / 'recipes' / 'quickstart.yaml'}\n"
        f"name: {name}\n"
        "hardware: {accelerators: 'cpu:1', nodes: 2}\n"
        "engine:\n"
        f"  trainer.total_training_steps: {steps}\n"
        "  data.train_batch_size: 8\n"
        "  actor_rollout_ref.actor.ppo_mini_batch_size: 8\n"
        "  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: 32\n"
        "  trainer.test_freq: -1\n"
        "  trainer.val_before_train: false\n" + extra
    )
    return path


def launch(rlctl, path: Path) -> str:
    launched = rlctl("launch", str(path), "--backend", "slurm")
    assert launched.returncode == 0, launched.stderr
    return launched.stdout.split()[1]


def handle(rlctl, job_id: str) -> dict:
    return JobStore(rlctl.home / "jobs.db").get(job_id).handle


def wait_slurm_done(slurm_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-j", slurm_id], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, f"job {slurm_id} still in squeue"
        time.sleep(0.5)


def ray_temp_prefix(slurm_id: str) -> str:
    """What names this job's Ray nodes in their command lines: their temp dirs are
    /tmp/rlray-<id>-<node>."""
    return f"/tmp/rlray-{slurm_id}-"


def test_two_node_job_succeeds(rlctl, tmp_path, wait_state, find_processes):
    started = time.monotonic()
    job_id = launch(rlctl, recipe(tmp_path, "slurm2", steps=2))
    done = wait_state(rlctl, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"})
    logs = rlctl("logs", job_id).stdout
    assert done["state"] == "SUCCEEDED", logs[-3000:]
    assert done["exit_code"] == 0
    print(f"two-node job: {time.monotonic() - started:.0f} s from launch to SUCCEEDED")
    assert "rlctl: ray cluster ready: 2 nodes" in logs  # both nodes joined
    # each node's pre-flight passed before Ray started (its all-reduce spans both nodes)
    checked = sorted(line for line in logs.splitlines() if line.endswith(": every check passed"))
    assert checked == ["doctor: n1: every check passed", "doctor: n2: every check passed"], logs
    assert logs.index("every check passed") < logs.index("rlctl: ray cluster ready")
    assert "step 2/2 | score" in logs
    # it ran the rlctl wheel shipped with the job, installed in the job's environment
    root = Path(handle(rlctl, job_id)["root"])
    site = next((root / "env" / "lib").glob("python3*/site-packages"))
    assert (root / f"rlctl-{__version__}-py3-none-any.whl").is_file()
    assert f"rlctl: job environment installed: rlctl {__version__} from {site}/engine/" in logs
    assert f"engine: running {site / 'engine'} with {root / 'env' / 'bin' / 'python'}" in logs
    # the engine trained on both nodes: the plan asked for 2 nodes × 1 worker (cpu:1,
    # nodes: 2), and the engine placed one rank on each
    root = Path(handle(rlctl, job_id)["root"])
    trainer = yaml.safe_load((root / "engine.yaml").read_text())["trainer"]
    assert (trainer["nnodes"], trainer["n_gpus_per_node"]) == (2, 1), trainer
    tables = list(root.rglob("workers.json"))
    assert len(tables) == 1, tables
    ranks = json.loads(tables[0].read_text())
    assert [w["rank"] for w in ranks] == [0, 1]
    # which Ray node ran each rank: its worker log lies in that node's temp dir
    slurm_id = handle(rlctl, job_id)["slurm_job_id"]
    homes = {
        w["rank"]: sorted(
            log.relative_to("/tmp").parts[0]
            for log in Path("/tmp").glob(
                f"rlray-{slurm_id}-*/session_latest/logs/worker-*-{w['pid']}.out"
            )
        )
        for w in ranks
    }
    # one rank on each Ray node (in either order)
    assert sorted(homes.values()) == [[f"rlray-{slurm_id}-0"], [f"rlray-{slurm_id}-1"]], homes
    followed = rlctl("logs", job_id, "-f", timeout=60)  # ends: the job ended
    assert followed.returncode == 0 and "step 2/2" in followed.stdout
    wait_slurm_done(slurm_id)
    assert find_processes(ray_temp_prefix(slurm_id)) == {}


def test_failing_job_reports_exit_code_and_log_tail(rlctl, tmp_path, wait_state, find_processes):
    path = recipe(
        tmp_path, "slurmfail", steps=2, **{"actor_rollout_ref.model.path": "/nonexistent/model"}
    )
    path.write_text(path.read_text() + "preflight: false\n")  # the engine's own failure
    job_id = launch(rlctl, path)
    done = wait_state(rlctl, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"})
    assert done["state"] == "FAILED", done
    assert done["exit_code"] not in (None, 0)
    assert f"exit code {done['exit_code']}" in done["reason"]
    assert "nonexistent" in done["reason"]  # the tail of the job's log
    slurm_id = handle(rlctl, job_id)["slurm_job_id"]
    wait_slurm_done(slurm_id)
    assert find_processes(ray_temp_prefix(slurm_id)) == {}


def test_a_failing_preflight_ends_the_job_before_ray(rlctl, tmp_path, wait_state):
    """Each node's pre-flight finds the model's config unreadable: the job ends with exit
    2, both nodes' lines (node, check, fix) in its log, before Ray, the driver or the
    supervisor; no requeue follows."""
    model = {"actor_rollout_ref.model.path": "/nonexistent/model"}
    job_id = launch(rlctl, recipe(tmp_path, "slurmpf", steps=2, **model))
    done = wait_state(rlctl, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"})
    logs = rlctl("logs", job_id).stdout
    assert (done["state"], done["exit_code"]) == ("FAILED", 2), (done, logs[-3000:])
    failed = sorted(line.removeprefix("doctor: FAILED ").split(": ")[:2]
                    for line in logs.splitlines() if line.startswith("doctor: FAILED"))  # fmt: skip
    assert failed == [["n1", "model"], ["n2", "model"]], logs
    assert (
        "cannot read the config of /nonexistent/model" in logs
        and "rlctl: pre-flight failed" in logs
    )
    root = Path(handle(rlctl, job_id)["root"])
    assert (root / "exit_code").read_text().strip() == "2"
    assert "ray cluster ready" not in logs and not list(root.glob("ray-node-*.log"))
    assert not (root / "driver.log").exists() and not (root / "restarts.json").exists()
    wait_slurm_done(handle(rlctl, job_id)["slurm_job_id"])  # ended, not requeued
    assert rlctl("status", job_id, "--json").returncode == 0


def test_bad_partition_is_a_clear_error(rlctl, tmp_path):
    home = tmp_path / "badhome"
    write_profile(home, tmp_path / "jobs", partition="nosuch")
    result = rlctl("launch", str(recipe(tmp_path, "slurmbad", steps=1)), "--backend", "slurm",
                   home_dir=home)  # fmt: skip
    assert result.returncode != 0
    assert "invalid partition" in result.stderr and "Traceback" not in result.stderr
    jobs = json.loads(rlctl("list", "--json", home_dir=home).stdout)
    assert [(j["state"], "nosuch" in (j["reason"] or "")) for j in jobs] == [("FAILED", True)]


def _pending_reason(slurm_id: str) -> str:
    """squeue's reason for a pending job ("" when it is not pending)."""
    out = subprocess.run(
        ["squeue", "-h", "-j", slurm_id, "-t", "PENDING", "-o", "%r"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def test_preempted_job_requeues_and_resumes(rlctl, tmp_path, job_state, find_processes):
    """SIGTERM to the batch shell (what Slurm's --signal=B:TERM@... sends before a time limit
    or preemption): the engine saves and exits 75, its supervisor records a requeue, the
    script requeues the job, and the requeued run resumes from the checkpoint; then `rlctl
    stop` ends it for good, and `rlctl status` lists the two attempts."""
    write_profile(rlctl.home, tmp_path / "jobs", requeue="true")
    path = recipe(tmp_path, "slurmrq", steps=500, **{"trainer.save_freq": 1})
    job_id = launch(rlctl, path)
    slurm_id = handle(rlctl, job_id)["slurm_job_id"]
    deadline = time.monotonic() + 300
    while "step 2/500" not in rlctl("logs", job_id).stdout:
        assert time.monotonic() < deadline, rlctl("logs", job_id).stdout[-3000:]
        time.sleep(2)
    subprocess.run(["scancel", "--batch", "--signal=TERM", slurm_id], check=True)
    deadline = time.monotonic() + 400
    released = False
    while "resumed from" not in (logs := rlctl("logs", job_id).stdout):
        assert time.monotonic() < deadline, logs[-3000:]
        # Slurm holds a requeued job for about 2 minutes (reason BeginTime); an admin's
        # release saves the test that wait and changes nothing it checks.
        if not released and _pending_reason(slurm_id) == "BeginTime":
            update = ["scontrol", "update", f"JobId={slurm_id}", "StartTime=now"]
            released = subprocess.run(update, capture_output=True).returncode == 0
        time.sleep(3)
    assert "requeueing job" in logs
    assert job_state(rlctl, job_id)["state"] == "RUNNING"
    # `rlctl stop` of the resumed run (what test_stop_running_job checked on a job of its
    # own): graceful, the engine finishing its step and exiting 75, recorded CANCELLED,
    # and no requeue after it (requeue is on): the job leaves squeue, its Ray with it.
    root = Path(handle(rlctl, job_id)["root"])
    (root / "exit_code").unlink()  # the preempted run's 75: the stop must write its own
    stopped = rlctl("stop", job_id, "--grace", "60")
    assert stopped.returncode == 0, stopped.stderr
    assert job_state(rlctl, job_id)["state"] == "CANCELLED"
    wait_slurm_done(slurm_id)
    assert find_processes(ray_temp_prefix(slurm_id)) == {}
    logs = rlctl("logs", job_id).stdout
    assert logs.count("rlctl: stopping the engine (SIGTERM)") == 2, logs[-3000:]  # preempt, stop
    assert (root / "exit_code").read_text().strip() == "75", logs[-3000:]
    # The supervisor's record: the preemption requeued (within trainer.max_restarts), the
    # user's stop not; rlctl status lists both with their reasons.
    attempts = json.loads((root / "restarts.json").read_text())["attempts"]
    assert [(a["exit_code"], a["reason"], a["next"]) for a in attempts] == [
        (75, "preempted", "requeue"),
        (75, "preempted", "stop"),
    ], attempts
    assert attempts[0]["why"] == "restart 1 of 3: the scheduler requeues the job"
    status = rlctl("status", job_id).stdout
    assert "restarts: 1 of 3 (trainer.max_restarts)" in status, status
    assert "  1. exit 75, preempted: stopped on SIGTERM after saving" in status, status
