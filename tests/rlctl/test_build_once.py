"""The launcher builds a job once: ``rlctl launch`` of a bundled recipe, on each backend,
makes the job's engine config, its spec and (on SkyPilot) its task once, decides the
image once and parses no YAML of the engine config back (issue 31).

The calls are counted by their code objects (``sys.setprofile``), so a second build is
seen however the function is reached. The clusters are stand-ins: the local job's
process is not started, Slurm's commands answer from a fake shell and the ``sky``
module records the launch; everything up to them is the real path."""

from __future__ import annotations

import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

import pytest
import yaml

from rlctl import api
from rlctl.backends import local, slurm
from rlctl.backends.skypilot import SkyPilotBackend
from rlctl.backends.skypilot_task import SkyTask
from rlctl.job.spec import JobSpec, job_engine_config
from rlctl.planner.images import JobImage
from rlctl.store.jobs import JobStore

RLCTL = str(Path(api.__file__).parent)
RECIPE = "dapo_qwen32b"  # checkpoints in a bucket: SkyPilot mounts it


def _counted() -> dict[object, str]:
    from engine.config.load import load

    return {
        load.__code__: "engine config composed",
        job_engine_config.__code__: "engine config built",
        JobSpec.__init__.__code__: "job spec built",
        SkyTask.__init__.__code__: "SkyPilot task built",
        JobImage.check_pullable.__code__: "image checked",
        yaml.load.__code__: "engine YAML parsed",
    }


def _from_rlctl_on_engine_yaml(frame: types.FrameType) -> bool:
    """A YAML parse rlctl asked for (not SkyPilot's own) of an engine config."""
    caller = frame.f_back
    while caller is not None and "/yaml/" in caller.f_code.co_filename:
        caller = caller.f_back
    stream = frame.f_locals.get("stream")
    return (
        caller is not None
        and caller.f_code.co_filename.startswith(RLCTL)
        and isinstance(stream, str)
        and "default_local_dir:" in stream
    )


def count_calls(run) -> Counter:
    counted = _counted()
    seen: Counter = Counter()

    def profile(frame, event, _arg):
        if event != "call" or frame.f_code not in counted:
            return
        label = counted[frame.f_code]
        if label != "engine YAML parsed" or _from_rlctl_on_engine_yaml(frame):
            seen[label] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_API_KEY", "not-a-key")  # the recipe's secret
    return tmp_path


class _NoProcess:
    """The local job's process, not started."""

    pid = 424242

    def __init__(self, *args, **kwargs):
        pass


def _slurm_answers(self, argv, input=None, check=False, timeout=60):
    return subprocess.CompletedProcess(argv, 0, b"4242\n", b"")


def _fake_sky() -> types.ModuleType:
    real = pytest.importorskip("sky", reason="skypilot is not installed")
    fake = types.ModuleType("sky")
    fake.Task = real.Task
    fake.jobs = types.SimpleNamespace(launch=lambda task, name: "request-1")
    fake.stream_and_get = lambda request: ([7], None)
    return fake


BACKENDS = {
    "local": {},
    "slurm": {"job_root": "{tmp}/slurm-jobs"},
    "skypilot": {"cloud": "gcp"},
}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_launch_builds_the_job_once(backend, home, monkeypatch):
    monkeypatch.setattr(local.subprocess, "Popen", _NoProcess)
    monkeypatch.setattr(slurm.Shell, "run", _slurm_answers)
    if backend == "skypilot":
        monkeypatch.setitem(sys.modules, "sky", _fake_sky())
        monkeypatch.setattr(SkyPilotBackend, "_enabled_clouds", lambda self: ["gcp"])
    options = {k: v.format(tmp=home) for k, v in BACKENDS[backend].items()}
    store = JobStore(home / "jobs.db")

    seen = count_calls(lambda: api.launch(RECIPE, backend, store=store, **options))

    (job,) = store.list()
    assert job.handle, "submitted"
    want = {
        "engine config composed": 2,  # the recipe's keys for the planner, then the job's
        "engine config built": 1,
        "job spec built": 1,
        "image checked": 1 if backend == "skypilot" else 0,  # Slurm: no container here
        "SkyPilot task built": 1 if backend == "skypilot" else 0,
    }
    # and no engine YAML parsed back
    assert dict(seen) == {k: v for k, v in want.items() if v}, f"counted {dict(seen)}"
