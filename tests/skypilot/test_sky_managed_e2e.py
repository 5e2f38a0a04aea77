"""A SkyPilot managed job recovered after its Slurm allocation is cancelled (opt-in).

``rlctl launch RECIPE --cloud slurm/rlctl-local`` without ``--cluster`` is a managed job
(``sky.jobs.launch``): SkyPilot's jobs controller, here in the API server itself
(SkyPilot 0.14's consolidation mode), provisions a Slurm allocation over SSH on this
host's Slurm (tests/skypilot/sky_slurm_setup.sh with RLCTL_SKY_MANAGED=1), runs the task
and watches it. The engine checkpoints to an S3 bucket (moto's server on loopback). Once
the step-4 checkpoint is complete in the bucket the test cancels the allocation
(``scancel``: what a preempted or lost node looks like to SkyPilot); SkyPilot recovers
the job on a new allocation, the engine resumes from the bucket, and the run's every
step equals a straight run of the same engine config.

    RLCTL_TEST_SKY_MANAGED=1 .venv/bin/python -m pytest tests/skypilot/test_sky_managed_e2e.py -v -s

Needs what test_sky_slurm_e2e.py needs (root, a python3.10, the package index), and
CAP_NET_ADMIN (the setup puts the two addresses SkyPilot's monitor probes on the loopback
device). About 10 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.loop.metrics import MACHINE_METRICS
from tests.skypilot.sky_harness import BASE, sky_slurm

OPT_IN = "RLCTL_TEST_SKY_MANAGED"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.cluster,
    pytest.mark.skipif(
        os.environ.get(OPT_IN) != "1",
        reason=f"a real SkyPilot managed job on a local Slurm over SSH (minutes, needs root):"
        f" set {OPT_IN}=1 to run it",
    ),
]

REPO = Path(__file__).resolve().parents[2]
CLI = "from rlctl.cli import main; main()"
INFRA = f"slurm/{os.environ.get('RLCTL_SKY_SLURM', 'rlctl-local')}"
SLURM_ENV = {**os.environ, "SLURM_CONF": "/tmp/rlctl-slurm/slurm.conf"}
STEPS, CUT_AT = 8, 4
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret"}


@pytest.fixture(scope="module")
def sky_env():
    with sky_slurm(managed=True) as env:
        yield env


@pytest.fixture
def bucket():
    """An S3-compatible server (moto) on loopback with one bucket, ``ckpt``."""
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **_keys())
    client.create_bucket(Bucket="ckpt")
    client.endpoint = endpoint
    yield client
    server.stop()


def _keys() -> dict[str, str]:
    return {k.lower(): v for k, v in KEYS.items()}


@pytest.fixture
def uv_seeded():
    """SkyPilot runs ``$HOME/.local/bin/uv`` in each cluster's directory, or fetches it
    from astral.sh (unreachable here); a managed job's cluster is named by the controller
    (``<job>-<id>``), so uv is copied into each cluster directory as it appears."""
    clusters = BASE / "remote" / ".sky_clusters"
    uv = BASE / "uv" / "bin" / "uv"
    stop = threading.Event()

    def seed() -> None:
        while not stop.wait(0.1):
            for cluster in clusters.glob("*/") if clusters.is_dir() else []:
                target = cluster / ".local" / "bin" / "uv"
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(uv, target)

    thread = threading.Thread(target=seed, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


def by_step(metrics: Path) -> dict[int, dict]:
    """The last record of each step, without what measures the machine."""
    records = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        records[record["step"]] = {
            k: v for k, v in record.items() if not k.startswith(MACHINE_METRICS)
        }
    return records


def wait_for_key(bucket, key: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            bucket.head_object(Bucket="ckpt", Key=key)
            return
        except bucket.exceptions.ClientError:
            assert time.monotonic() < deadline, f"{key} never appeared in the bucket"
            time.sleep(0.5)


def cancel_allocation_when(bucket, key: str, job_id: str, timeout: float = 900) -> str:
    """Wait for ``key`` in the bucket, then cancel the Slurm allocation of the job's
    cluster (its Slurm job is named after the cluster, which SkyPilot names after the
    job); returns what squeue showed."""
    wait_for_key(bucket, key, timeout)
    jobs = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                          env=SLURM_ENV).stdout  # fmt: skip
    ours = [line.split()[0] for line in jobs.splitlines() if line.split()[1].startswith(job_id)]
    assert len(ours) == 1, jobs
    subprocess.run(["scancel", ours[0]], check=True, env=SLURM_ENV)
    return jobs


@pytest.fixture
def managed(sky_env, bucket, uv_seeded, tmp_path):
    """``launch(name, **engine_keys) -> (job_id, rlctl)``: the quickstart as a managed job
    on the local Slurm, checkpoints in the bucket under runs/NAME; every job launched is
    stopped and its node directory removed after the test."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "skypilot.yaml").write_text(
        json.dumps({INFRA: {"image": "none",
                            "prelude": [f"export PATH={Path(sys.executable).parent}:$PATH"]}})
    )  # fmt: skip
    env = {**sky_env, "RLCTL_HOME": str(home), **KEYS}
    launched: list[str] = []

    def rlctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=tmp_path)  # fmt: skip

    def launch(name: str, **engine: object) -> tuple[str, object]:
        keys = {
            "trainer.total_training_steps": STEPS,
            "trainer.save_freq": 2,
            "trainer.test_freq": -1,
            "trainer.val_before_train": "false",
            "trainer.default_local_dir": f"s3://ckpt/runs/{name}",
            **engine,
        }
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(
            f"extends: {REPO / 'recipes' / 'quickstart.yaml'}\n"
            f"name: sky-{name}\n"
            f"secrets: [{', '.join(KEYS)}]\n"
            f"env: {{AWS_ENDPOINT_URL: '{bucket.endpoint}', AWS_DEFAULT_REGION: us-east-1}}\n"
            "engine:\n" + "".join(f"  {k}: {v}\n" for k, v in keys.items())
        )
        out = rlctl("launch", str(recipe), "--cloud", INFRA, timeout=900)  # managed: default
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        job_id = out.stdout.split("launched ", 1)[1].split()[0]
        launched.append(job_id)
        return job_id, rlctl

    launch.env = env  # type: ignore[attr-defined]
    yield launch
    for job_id in launched:
        rlctl("stop", job_id, timeout=300)
        shutil.rmtree(Path("/tmp/rlctl") / job_id, ignore_errors=True)


def test_a_cancelled_allocation_is_recovered_and_resumes_from_the_bucket(
    managed, bucket, tmp_path, wait_state, follow_logs
):
    started = time.monotonic()
    job_id, rlctl = managed("recover")
    node_dir = Path("/tmp/rlctl") / job_id
    # `rlctl logs -f` from the start: it follows the job across its recovery (once a
    # managed job has ended, SkyPilot 0.14 answers only that it has)
    with follow_logs(job_id, managed.env, tmp_path) as follow:
        squeue = cancel_allocation_when(
            bucket, f"runs/recover/global_step_{CUT_AT}/COMPLETE", job_id
        )
        cut = time.monotonic() - started
        done = wait_state(rlctl, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=900,
                          poll_s=5)  # fmt: skip
        logs, _ = follow.communicate(timeout=300)
    assert done["state"] == "SUCCEEDED", (done, logs[-4000:])
    print(f"\nmanaged job {job_id}: allocation cancelled after {cut:.0f} s ({squeue.strip()}),"
          f" SUCCEEDED after {time.monotonic() - started:.0f} s")  # fmt: skip
    print("\n".join(line for line in logs.splitlines() if "step " in line or "rlctl:" in line
                    or "resumed" in line or "supervisor" in line))  # fmt: skip
    assert done["reason"] == "recovered 1 time"  # SkyPilot's count, in rlctl status
    assert f"resumed from s3://ckpt/runs/recover/global_step_{CUT_AT} at step {CUT_AT}" in logs
    assert f"step {STEPS}/{STEPS} | score" in logs
    # The supervisor's record: the attempt its allocation took with it is not counted
    # (a preemption, as SkyPilot counts it), the second finished.
    record = json.loads((node_dir / "restarts.json").read_text())
    assert [a["next"] for a in record["attempts"]] == ["recovered", "stop"], record

    # The same engine config straight through, with the job's own Python, here.
    straight = subprocess.run(
        [str(node_dir / "env" / "bin" / "python"), "-m", "engine.main",
         "--config", str(node_dir / "engine.yaml"),
         f"trainer.default_local_dir={tmp_path / 'straight'}"],
        capture_output=True, text=True, cwd=node_dir, timeout=900,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )  # fmt: skip
    assert straight.returncode == 0, straight.stderr[-3000:]
    expected = by_step(next((tmp_path / "straight").rglob("metrics.jsonl")))
    # both attempts logged here (one host): steps 1-4 from the first, 5-8 the second
    got = by_step(next((node_dir / "runs").rglob("metrics.jsonl")))
    assert sorted(expected) == sorted(got) == list(range(1, STEPS + 1))
    for step in expected:
        assert got[step] == expected[step], f"step {step} differs from the straight run"

    # rlctl status reads the run's progress from the bucket (this machine's keys for it):
    # the whole curve, across the recovery, the straight run's scores
    env = {**managed.env, "AWS_ENDPOINT_URL": bucket.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
    seen = subprocess.run([sys.executable, "-c", CLI, "status", job_id, "--json"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)  # fmt: skip
    progress = json.loads(seen.stdout)[0]["progress"]
    assert (progress["step"], progress["total_steps"], progress["note"]) == (STEPS, STEPS, None)
    assert progress["scores"] == [[k, expected[k]["critic/score/mean"]] for k in sorted(expected)]


def test_a_dead_worker_is_handed_back_to_skypilot_and_the_job_resumes(
    managed, bucket, tmp_path, wait_state, follow_logs
):
    """A worker process killed mid-run (as the OOM killer would) with the allocation up:
    the engine stops with the dead rank, the supervisor hands the restart to SkyPilot
    (exit 75), which starts the job again on its cluster; the engine resumes from the
    bucket, and the supervisor's record counts the restart."""
    job_id, rlctl = managed("handback")
    node_dir = Path("/tmp/rlctl") / job_id
    with follow_logs(job_id, managed.env, tmp_path) as follow:
        wait_for_key(bucket, "runs/handback/global_step_2/COMPLETE")
        workers = json.loads(next(node_dir.rglob("workers.json")).read_text())
        os.kill(workers[1]["pid"], signal.SIGKILL)
        done = wait_state(rlctl, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=900,
                          poll_s=5)  # fmt: skip
        logs, _ = follow.communicate(timeout=300)
    print("\n".join(line for line in logs.splitlines() if "step " in line or "rlctl:" in line
                    or "resumed" in line or "supervisor" in line))  # fmt: skip
    assert done["state"] == "SUCCEEDED", (done, logs[-4000:])
    assert done["reason"] == "recovered 1 time"
    assert "restart 1 of 3: SkyPilot starts the job again" in logs
    # SkyPilot 0.14's stream of a job started again on the same cluster ends with the
    # first run (its "Job finished (status: FAILED)"); `rlctl logs` afterwards has the
    # second (or, once the cluster is gone, the jobs controller's log, which has both)
    after = rlctl("logs", job_id, timeout=300).stdout
    assert "resumed from s3://ckpt/runs/handback/global_step_" in after, after[-3000:]
    record = json.loads((node_dir / "restarts.json").read_text())
    attempts = [(a["reason"], a["next"]) for a in record["attempts"]]
    assert attempts == [("worker_died", "requeue"), ("finished", "stop")], record
    got = by_step(next((node_dir / "runs").rglob("metrics.jsonl")))
    assert sorted(got) == list(range(1, STEPS + 1))


def test_a_failed_preflight_is_never_retried(managed, tmp_path, wait_state):
    """The pre-flight on the nodes finds the checkpoint bucket missing (exit 2): the
    managed job fails at once, not recovered."""
    job_id, rlctl = managed("nobucket", **{"trainer.default_local_dir": "s3://absent/x"})
    done = wait_state(rlctl, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=900,
                      poll_s=5)  # fmt: skip
    logs = rlctl("logs", job_id).stdout
    print(done, logs[-2000:])
    assert done["state"] == "FAILED", done
    assert "recovered" not in done["reason"], done
