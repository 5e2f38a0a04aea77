"""A real SkyPilot launch of the task rlctl renders, on SkyPilot's Slurm infra (opt-in).

SkyPilot 0.14 provisions on a Slurm cluster by SSHing to its login node: here the login
node is this machine (a private sshd on 127.0.0.1) and the cluster is the local Slurm of
tests/slurm/start_slurm.sh (two emulated nodes). ``sky_slurm_setup.sh`` makes that
(packages, sshd, ~/.slurm/config in a private HOME, a private SkyPilot API server);
``sky_slurm_teardown.sh`` undoes it. Everything goes through rlctl's CLI (or its Python
API where the CLI has no flag): ``rlctl launch RECIPE --cloud slurm/rlctl-local
--cluster NAME`` renders the task (rlctl/backends/skypilot.py, templates/skypilot/),
SkyPilot provisions a Slurm allocation, runs the rendered setup (tiny model, synthetic
data) and run (Ray bootstrap, the engine) on it; ``rlctl status/logs/stop`` observe and
stop it through SkyPilot's SDK.

Cluster mode; managed jobs and their recovery are test_sky_managed_e2e.py's.

    RLCTL_TEST_SKY_SLURM=1 .venv/bin/python -m pytest tests/skypilot/test_sky_slurm_e2e.py -v -s

Needs root (packages, sshd, Slurm daemons), a python3.10 (pyenv's will do) and the package
index (SkyPilot installs its runtime on the "nodes" with uv). About 10 minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.store.jobs import JobStore
from tests.skypilot.sky_harness import sky_slurm

OPT_IN = "RLCTL_TEST_SKY_SLURM"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.cluster,
    pytest.mark.skipif(
        os.environ.get(OPT_IN) != "1",
        reason=f"a real SkyPilot launch on a local Slurm over SSH (minutes, needs root):"
        f" set {OPT_IN}=1 to run it",
    ),
]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CLI = "from rlctl.cli import main; main()"
SLURM_NAME = os.environ.get("RLCTL_SKY_SLURM", "rlctl-local")
INFRA = f"slurm/{SLURM_NAME}"
ONE_NODE, TWO_NODES = "rlctl-e2e-one", "rlctl-e2e-two"  # SkyPilot cluster names
SECRET_NAME = "RLCTL_SKY_TEST_SECRET"
SECRET_VALUE = "sky-s3cr3t-$(touch /tmp/rlctl-sky-pwned) `id` ; 'q' \"d\" \\"
DONE = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture(scope="module")
def sky_env():
    """This host as a SkyPilot Slurm cluster (tests/skypilot/sky_harness.py)."""
    with sky_slurm(ONE_NODE, TWO_NODES) as env:
        yield env


@pytest.fixture
def rlctl(tmp_path, sky_env):
    """The rlctl CLI as a user runs it, with its own RLCTL_HOME. The site profile tells
    rlctl that this Slurm has no Pyxis (no container: image none) and that the nodes
    run this checkout's virtualenv; its prelude also records a digest of the secret each
    script sees (never the value)."""
    home = tmp_path / "home"
    home.mkdir()
    prelude = [
        f"export PATH={Path(sys.executable).parent}:$PATH",
        f'printf %s "${SECRET_NAME}" | sha256sum >>{tmp_path}/secret.sha256',
    ]
    (home / "skypilot.yaml").write_text(
        json.dumps({INFRA: {"image": "none", "prelude": prelude}}, indent=1)
    )
    env = {**sky_env, "RLCTL_HOME": str(home), SECRET_NAME: SECRET_VALUE}

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=tmp_path)  # fmt: skip

    run.home = home
    run.env = env
    roots: list[Path] = []
    run.roots = roots  # the jobs' directories on the "nodes" (/tmp/rlctl/<job>)
    yield run
    for root in roots:  # and their Ray temp dirs (the run section leaves Ray's logs)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(ray_dir(root.name), ignore_errors=True)
    with contextlib.suppress(OSError):  # the backend's remote root, if nothing else uses it
        Path("/tmp/rlctl").rmdir()


def recipe(tmp_path: Path, name: str, steps: int, hardware: str = "") -> Path:
    """The bundled quickstart (tiny model built on the node, synthetic data, CPU), for
    ``steps`` steps."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"extends: {REPO / 'recipes' / 'quickstart.yaml'}\n"
        f"name: {name}\n"
        f"secrets: [{SECRET_NAME}]\n"
        + (f"hardware: {hardware}\n" if hardware else "")
        + "engine:\n"
        f"  trainer.total_training_steps: {steps}\n"
        f"  trainer.test_freq: {steps}\n"
    )
    return path


def launch(rlctl, path: Path, cluster: str) -> str:
    out = rlctl("launch", str(path), "--cloud", INFRA, "--cluster", cluster, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    job_id = out.stdout.split("launched ", 1)[1].split()[0]
    rlctl.roots.append(Path("/tmp/rlctl") / job_id)
    return job_id


def sky_down(rlctl, cluster: str) -> None:
    """Tear a cluster down with SkyPilot's own CLI (a test's cleanup, whatever happened)."""
    sky = Path(sys.executable).parent / "sky"
    subprocess.run([str(sky), "down", "-y", cluster], env=rlctl.env, capture_output=True,
                   timeout=300)  # fmt: skip


def slurm_jobs(cluster: str) -> list[str]:
    """The Slurm allocations SkyPilot holds for a cluster (its job is named after it)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                         env={**os.environ, "SLURM_CONF": "/tmp/rlctl-slurm/slurm.conf"})  # fmt: skip
    return [line for line in out.stdout.splitlines() if f" {cluster}" in line]


def ray_dir(job_id: str) -> str:
    """The job's Ray temp dir on the node (run.sh.j2: the id's last 12 letters/digits)."""
    return f"/tmp/rlctl-ray-{job_id.replace('-', '')[-12:]}"


def assert_no_secret_kept(rlctl, tmp_path: Path, job_id: str) -> None:
    digest = hashlib.sha256(SECRET_VALUE.encode()).hexdigest()
    seen = (tmp_path / "secret.sha256").read_text().split()
    assert seen and set(seen[::2]) == {digest}, seen  # setup and run both saw the value
    for f in rlctl.home.rglob("*"):
        if f.is_file():
            assert b"s3cr3t" not in f.read_bytes(), f
    assert "s3cr3t" not in repr(JobStore(rlctl.home / "jobs.db").get(job_id).handle)
    assert not Path("/tmp/rlctl-sky-pwned").exists()


def test_quickstart_trains_on_slurm_through_skypilot(
    rlctl, tmp_path, wait_state, follow_logs, find_processes
):
    """Launch provisions a Slurm allocation, setup builds the model and data, the run
    section forms Ray and the engine trains; status says SUCCEEDED, logs show the steps."""
    Path("/tmp/rlctl-sky-pwned").unlink(missing_ok=True)
    path = recipe(tmp_path, "sky-quickstart", steps=3)
    plan = rlctl("plan", str(path), "--cloud", INFRA, "--cluster", ONE_NODE, "--json")
    task = json.loads(plan.stdout)["files"]["task.yaml"]
    assert "image_id" not in task and "export PATH=" in task  # the site profile applied
    try:
        started = time.monotonic()
        job_id = launch(rlctl, path, ONE_NODE)
        launched = time.monotonic() - started
        with follow_logs(job_id, rlctl.env, tmp_path) as follow:
            done = wait_state(rlctl, job_id, DONE, timeout=600, poll_s=5)
            finished = time.monotonic() - started
            followed, _ = follow.communicate(timeout=120)
        logs = rlctl("logs", job_id)
        assert logs.returncode == 0, logs.stderr
        assert done["state"] == "SUCCEEDED", (done, logs.stdout[-4000:])
        print(f"one node: launch returned after {launched:.0f} s, SUCCEEDED after {finished:.0f} s")
        for text in (logs.stdout, followed):
            assert "rlctl: ray cluster ready: 1 nodes, 0 GPU, 0 NPU, 2 CPU" in text
            assert "step 3/3 | score" in text
            assert "rlctl: the engine exited with code 0" in text
            # the run used the wheel of this rlctl that the task shipped (file mount) and
            # the setup installed in the job's environment, not the checkout
            node = f"/tmp/rlctl/{job_id}"
            assert f"engine: running {node}/env/lib/python3." in text
            assert f"/site-packages/engine with {node}/env/bin/python" in text
        assert follow.returncode == 0  # `logs -f` ended by itself with the job
        assert_no_secret_kept(rlctl, tmp_path, job_id)
        assert find_processes(ray_dir(job_id)) == {}
        assert slurm_jobs(ONE_NODE), "the cluster keeps its allocation until it is downed"
    except BaseException:
        sky_down(rlctl, ONE_NODE)
        raise


def test_stop_cancels_the_job_and_downs_the_cluster(rlctl, tmp_path, job_state, find_processes):
    """A long run on the cluster (launched through the Python API, which takes
    ``down=True``), stopped while it trains: the job is CANCELLED, its Ray is gone, and the
    cluster's Slurm allocation is released."""
    path = recipe(tmp_path, "sky-long", steps=500)
    code = (
        "from rlctl import api; "
        f"job = api.launch({str(path)!r}, backend='skypilot', cloud={INFRA!r}, "
        f"cluster={ONE_NODE!r}, down=True); print(job.id)"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=900, env=rlctl.env, cwd=tmp_path)  # fmt: skip
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        job_id = out.stdout.split()[-1]
        rlctl.roots.append(Path("/tmp/rlctl") / job_id)
        deadline = time.monotonic() + 300
        while "step 2/500" not in (logs := rlctl("logs", job_id)).stdout:
            assert time.monotonic() < deadline, logs.stdout[-3000:]
            assert job_state(rlctl, job_id)["state"] == "RUNNING", logs.stdout[-3000:]
            time.sleep(5)
        assert find_processes(ray_dir(job_id)), "the job's Ray runs on the node"
        started = time.monotonic()
        stopped = rlctl("stop", job_id, timeout=300)
        assert stopped.returncode == 0, stopped.stderr
        print(f"stop: {time.monotonic() - started:.0f} s")
        assert job_state(rlctl, job_id)["state"] == "CANCELLED"
        deadline = time.monotonic() + 60
        while find_processes(ray_dir(job_id)) or slurm_jobs(ONE_NODE):
            assert time.monotonic() < deadline, (
                find_processes(ray_dir(job_id)),
                slurm_jobs(ONE_NODE),
            )
            time.sleep(1)
        # rlctl's status of a cancelled job stays cancelled once the cluster is gone
        assert job_state(rlctl, job_id)["state"] == "CANCELLED"
    finally:
        sky_down(rlctl, ONE_NODE)


def test_two_nodes_form_one_ray_cluster(rlctl, tmp_path, wait_state):
    """Two Slurm nodes: rank 0 starts the Ray head, rank 1 joins it, the engine's two
    workers train across both."""
    path = recipe(tmp_path, "sky-two", steps=2, hardware="{accelerators: 'cpu:1', nodes: 2}")
    try:
        started = time.monotonic()
        job_id = launch(rlctl, path, TWO_NODES)
        done = wait_state(rlctl, job_id, DONE, timeout=600, poll_s=5)
        logs = rlctl("logs", job_id).stdout
        assert done["state"] == "SUCCEEDED", (done, logs[-4000:])
        print(f"two nodes: SUCCEEDED after {time.monotonic() - started:.0f} s")
        assert "rlctl: ray cluster ready: 2 nodes, 0 GPU, 0 NPU, 4 CPU" in logs
        assert "worker on" in logs and "joining" in logs
        assert "step 2/2 | score" in logs
        assert "rlctl: the head at" in logs  # the worker saw the head go and stopped
        assert len(slurm_jobs(TWO_NODES)) == 1
    finally:
        sky_down(rlctl, TWO_NODES)
    assert slurm_jobs(TWO_NODES) == []
