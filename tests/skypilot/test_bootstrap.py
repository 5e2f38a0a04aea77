"""The run section's Ray bootstrap, for real: a two-node SkyPilot task simulated on this
machine by two processes that get the variables SkyPilot sets on each node.

Both "nodes" run the same rendered setup and run sections (templates/skypilot/, with
templates/ray/ray_cluster.sh inlined). Rank 0 starts the head, waits for both nodes,
writes the engine config and runs the engine command; rank 1 joins and stays until the
head is gone. The engine command here is a small script (rendered through the same
template) that joins RAY_ADDRESS and records what it sees; everything must stop after.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from rlctl.api import find_recipe, plan_recipe
from rlctl.backends.skypilot import SkyPilotBackend, SkyPilotOptions
from rlctl.job.spec import Layout, build_spec
from rlctl.job.wheel import build_wheel
from rlctl.recipe.load import load_recipe

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

PROBE = textwrap.dedent(
    """
    import json, os, sys
    import ray
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    alive = [n for n in ray.nodes() if n["Alive"]]
    out = {
        "address": os.environ["RAY_ADDRESS"],
        "nodes": len(alive),
        "cpus": ray.cluster_resources().get("CPU", 0),
        "config_exists": os.path.exists(sys.argv[2]),
        "cwd": os.getcwd(),
        "env": os.environ.get("RLCTL_TEST_ENV"),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    print("probe: ray cluster of", len(alive), "nodes", flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job_env(root: Path) -> None:
    """The job's Python as the setup makes it on a node: the wheel of this rlctl in the
    job's directory (SkyPilot's file mount) installed over this venv (rlctl/node/jobenv.py).
    Made once here: the "nodes" of these tests share one file system, and the setup's own
    install line then finds it made from the same wheel (kept)."""
    root.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(root)
    made = subprocess.run(
        [sys.executable, "-m", "rlctl.node.jobenv", str(root / "env"), str(wheel), "--extras", "engine"],
        env={**os.environ, "PYTHONPATH": str(wheel), "PIP_NO_INDEX": "1"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr


def test_two_node_task_forms_a_ray_cluster_and_runs_the_engine(tmp_path, find_processes):
    recipe = load_recipe(find_recipe("quickstart"))
    root = tmp_path / "job"
    backend = SkyPilotBackend(SkyPilotOptions(cloud="k8s", remote_root=str(tmp_path)))
    spec = build_spec(recipe, plan_recipe(recipe), backend.paths("job", recipe.checkpoints))
    spec = dataclasses.replace(  # setup steps replaced by a marker each "node" writes
        spec,
        setup=(("python", "-c", "import socket; open('setup-done', 'a').write('x')"),),
        env={"RLCTL_TEST_ENV": "it's $quoted"},
        secrets=(),
    )
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    result = tmp_path / "result.json"
    port = _free_port()
    token = secrets.token_hex(16)
    _job_env(root)
    setup = backend._setup("job", spec)  # its steps run with the job's Python
    run = backend._run(
        "job",
        spec,
        Layout(
            nodes=2,
            devices_per_node=1,
            accelerator=None,
            accelerator_named=False,
            cpus_per_worker=1,
        ),
        spec.env,
        engine_command=(sys.executable, str(probe), str(result), spec.paths.engine_config),
        ray_port=port,
        join_timeout_s=120,
    )
    temp_dirs = [tempfile.mkdtemp(prefix=f"rr{rank}", dir="/tmp") for rank in (0, 1)]
    bin_dir = str(Path(sys.executable).parent)
    procs = []
    t0 = time.monotonic()
    try:
        for rank in (0, 1):
            env = {
                **os.environ,
                "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "SKYPILOT_NODE_RANK": str(rank),
                "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1",
                "SKYPILOT_NUM_NODES": "2",
                "SKYPILOT_NUM_GPUS_PER_NODE": "0",
                "RLCTL_NUM_CPUS": "1",
                "RLCTL_RAY_TEMP_DIR": temp_dirs[rank],
                "RLCTL_RAY_POLL_S": "1",
                "RAY_AUTH_TOKEN": token,
                "RAY_ADDRESS": "127.0.0.1:6380",  # SkyPilot's: the run section must ignore it
            }
            if rank == 1:  # a second raylet on this host: its agent needs ports of its own
                env["RLCTL_RAY_EXTRA_ARGS"] = (
                    f"--dashboard-agent-listen-port={_free_port()} "
                    f"--metrics-export-port={_free_port()}"
                )
            log = (tmp_path / f"node{rank}.log").open("w")
            script = f"{setup}\n{run}"
            procs.append(
                subprocess.Popen(
                    ["bash", "-c", script],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        codes = [p.wait(timeout=240) for p in procs]
        elapsed = time.monotonic() - t0
        logs = [(tmp_path / f"node{r}.log").read_text() for r in (0, 1)]
        assert codes == [0, 0], "\n\n".join(logs)
        seen = json.loads(result.read_text())
        assert seen["nodes"] == 2, logs[0]
        assert seen["cpus"] == 2
        assert seen["address"] == f"127.0.0.1:{port}"
        assert seen["config_exists"]
        assert seen["cwd"] == str(root)
        assert seen["env"] == "it's $quoted"
        assert (root / "setup-done").read_text() == "xx"  # setup ran on both nodes
        # both "nodes" ran the setup's install line: the job's Python, made from the wheel
        assert all("rlctl: job environment kept: rlctl" in log for log in logs), logs[0]
        assert "ray cluster ready: 2 nodes" in logs[0]
        assert "the engine exited with code 0" in logs[0]
        assert "the head at" in logs[1]
        engine_cfg = yaml.safe_load((root / "engine.yaml").read_text())
        assert engine_cfg == yaml.safe_load(spec.engine_yaml)
        deadline = time.monotonic() + 30
        while find_processes(*temp_dirs) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert find_processes(*temp_dirs) == {}, "Ray processes left behind"
        print(f"two-node bootstrap: {elapsed:.1f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
        for pid in find_processes(*temp_dirs):
            os.kill(pid, 9)
        for d in temp_dirs:
            shutil.rmtree(d, ignore_errors=True)


def test_engine_failure_is_the_task_exit_code(tmp_path, find_processes):
    """Rank 0 returns the engine's exit code (75 = stopped on SIGTERM) and still stops Ray."""
    recipe = load_recipe(find_recipe("quickstart"))
    backend = SkyPilotBackend(SkyPilotOptions(remote_root=str(tmp_path)))
    spec = build_spec(recipe, plan_recipe(recipe), backend.paths("job", recipe.checkpoints))
    _job_env(Path(spec.paths.root))
    run = backend._run(
        "job",
        spec,
        Layout(
            nodes=1,
            devices_per_node=1,
            accelerator=None,
            accelerator_named=False,
            cpus_per_worker=1,
        ),
        {},
        engine_command=(sys.executable, "-c", "raise SystemExit(75)"),
        ray_port=_free_port(),
    )
    temp_dir = tempfile.mkdtemp(prefix="rr", dir="/tmp")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NODE_IPS": "127.0.0.1",
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",
        "RLCTL_NUM_CPUS": "1",
        "RLCTL_RAY_TEMP_DIR": temp_dir,
        "RLCTL_RAY_POLL_S": "1",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
    }
    try:
        proc = subprocess.run(
            ["bash", "-c", run], env=env, capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == 75, proc.stdout + proc.stderr
        deadline = time.monotonic() + 30
        while find_processes(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert find_processes(temp_dir) == {}
    finally:
        for pid in find_processes(temp_dir):
            os.kill(pid, 9)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_wrong_node_count_fails_before_ray(tmp_path):
    recipe = load_recipe(find_recipe("quickstart"))
    backend = SkyPilotBackend(SkyPilotOptions(remote_root=str(tmp_path)))
    spec = build_spec(recipe, plan_recipe(recipe), backend.paths("job", recipe.checkpoints))
    run = backend._run("job", spec, Layout(2, 1, None, False, 1), {})
    env = {
        **os.environ,
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NODE_IPS": "127.0.0.1",
        "SKYPILOT_NUM_NODES": "1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",
        "RLCTL_RAY": "false",  # no Ray may start
        "RAY_AUTH_TOKEN": "t",
    }
    proc = subprocess.run(["bash", "-c", run], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "the plan needs 2 x 1" in proc.stderr


def test_a_worker_whose_ray_stopped_leaves_the_decision_to_the_head(tmp_path):
    """A worker node's Ray stops while the head is up: the node waits for the head (whose
    supervisor hands the restart to SkyPilot, exit 75) and leaves with 0, since a
    non-zero exit of its own would fail the managed job before the head could say
    anything. Ray is a stand-in here (its `ray start` returns at once): only the run
    section's shell is under test."""
    recipe = dataclasses.replace(load_recipe(find_recipe("quickstart")), preflight=False)
    backend = SkyPilotBackend(SkyPilotOptions(remote_root=str(tmp_path)))
    spec = build_spec(recipe, plan_recipe(recipe), backend.paths("job", recipe.checkpoints))
    ray = Path(spec.paths.env) / "bin" / "ray"
    ray.parent.mkdir(parents=True)
    ray.write_text("#!/bin/sh\necho 'fake ray: stopped'\n")
    ray.chmod(0o755)
    head = socket.socket()  # the head's Ray port, as the worker polls it
    head.bind(("127.0.0.1", 0))
    head.listen(16)
    layout = Layout(2, 1, None, False, 1)
    run = backend._run("job", spec, layout, {}, ray_port=head.getsockname()[1])
    env = {
        **os.environ,
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.2",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",
        "RLCTL_NUM_CPUS": "1",
        "RAY_AUTH_TOKEN": "t",
    }
    proc = subprocess.Popen(
        ["bash", "-c", run], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=8)  # the head is still up: the worker waits for it
        head.close()
        assert proc.wait(timeout=30) == 0
        out = proc.stdout.read() if proc.stdout else ""
        assert "fake ray: stopped" in out
        assert "this node's Ray stopped while the head is still up: the head decides" in out
    finally:
        head.close()
        if proc.poll() is None:
            proc.kill()
