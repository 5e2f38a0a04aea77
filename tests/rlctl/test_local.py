"""The local backend's runner: whatever a job leaves in its session ends with the job."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlctl.backends import local
from rlctl.backends.local import LocalBackend
from rlctl.job.prepared import Prepared, Rendered
from rlctl.job.spec import JobPaths, JobSpec, Layout
from rlctl.planner.images import default_image

REPO = Path(__file__).resolve().parents[2]


def submit(tmp_path: Path, monkeypatch, script: str) -> dict:
    """Submit ``script`` as the job's run.sh through the backend's real runner."""
    cpu = Layout(
        nodes=1, devices_per_node=1, accelerator=None, accelerator_named=False, cpus_per_worker=1
    )
    spec = JobSpec(
        recipe=None,  # type: ignore[arg-type]
        paths=JobPaths(str(tmp_path / "job")),
        layout=cpu,
        engine_yaml="",
        setup=(),
        image=default_image(None, "hf"),
        extras=("engine",),
        max_restarts=0,
    )
    prepared = Prepared("t-1", None, None, spec, Rendered({"run.sh": script}, ()))  # type: ignore[arg-type]
    return LocalBackend().submit(SimpleNamespace(id="t-1"), prepared, {})  # type: ignore[arg-type]


def wait_exit_code(handle: dict, timeout: float) -> str:
    exit_file = Path(handle["root"]) / local.EXIT_CODE
    deadline = time.monotonic() + timeout
    while not exit_file.exists():
        assert time.monotonic() < deadline, (Path(handle["log"]).read_text()[-2000:],)
        time.sleep(0.1)
    return exit_file.read_text().strip()


def test_processes_left_in_the_session_end_with_the_job(tmp_path, monkeypatch):
    """A helper that ignores SIGTERM (as Ray's agents do once their raylet is gone) and
    outlives the script: SIGKILLed before the exit code is written."""
    script = "(trap '' TERM; exec sleep 300) &\necho started\nexit 3\n"
    handle = submit(tmp_path, monkeypatch, script)
    try:
        assert wait_exit_code(handle, timeout=30) == "3"
        assert local._session_pids(handle["sid"]) == []
    finally:
        local._signal_session(handle["sid"], signal.SIGKILL)


DRIVER = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
from engine.config import load_config
from engine.runtime import init_ray
init_ray(load_config(["actor_rollout_ref.model.path=x", "data.train_files=x",
                      "trainer.device=cpu", "trainer.n_gpus_per_node=1"], check=False))
print("ray is up", flush=True)
import time; time.sleep(600)
"""


@pytest.mark.slow
def test_ray_agents_do_not_outlive_a_killed_driver(tmp_path, monkeypatch):
    """kill -9 of the engine's driver left Ray's dashboard and runtime-env agents running
    (reparented to init) on the local backend."""
    (tmp_path / "driver.py").write_text(DRIVER)
    handle = submit(tmp_path, monkeypatch, f"exec {sys.executable} {tmp_path / 'driver.py'}\n")
    sid = handle["sid"]
    log = Path(handle["log"])
    try:
        deadline = time.monotonic() + 120
        while "ray is up" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        names = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in local._session_pids(sid)}
        assert any(b"RuntimeEnvAgent" in cmd or b"runtime_env" in cmd for cmd in names.values())
        driver = local._session_pids(sid, parent=sid)
        assert len(driver) == 1
        os.kill(driver[0], signal.SIGKILL)
        assert wait_exit_code(handle, timeout=60) == "137"
        assert local._session_pids(sid) == []
    finally:
        local._signal_session(sid, signal.SIGKILL)
