"""A secret's value never lands in a file: canary values for the secrets a recipe names,
then every file the job, rlctl and Ray leave behind is read for them. Per backend: the
local one (the engine on a real local Ray cluster; a whole job through the CLI is
tests/e2e/test_cli_local.py's secrets test),
Slurm (the submission with a stand-in sbatch; the real daemons in tests/slurm) and
SkyPilot (the render, the task it is handed, everything rlctl writes)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import rlctl.api
from rlctl.store.jobs import JobStore
from tests.security.secret_files import files_holding, ray_dirs_since

REPO = Path(__file__).resolve().parents[2]
CANARY = {"HF_TOKEN": "hf_canary_7f3a9c1e5b", "RLCTL_CANARY_API_KEY": "canary-d41d8cd98f"}
VALUES = tuple(CANARY.values())


def recipe(tmp_path: Path, **engine) -> Path:
    path = tmp_path / "canary.yaml"
    extra = "".join(f"  {key}: {value}\n" for key, value in engine.items())
    path.write_text(
        f"extends: {REPO / 'recipes' / 'quickstart.yaml'}\n"
        "name: canary\n"
        f"secrets: [{', '.join(CANARY)}]\n"
        "engine:\n"
        "  trainer.total_training_steps: 1\n"
        "  data.train_batch_size: 8\n"
        "  actor_rollout_ref.actor.ppo_mini_batch_size: 8\n"
        "  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: 32\n"
        "  trainer.test_freq: -1\n"
        "  trainer.val_before_train: false\n" + extra
    )
    return path


# ---------------------------------------------------------------------------
# the engine's Ray runtime_env


@pytest.mark.parametrize("address", [None, "10.0.0.1:6379"])
def test_no_environment_value_goes_into_rays_runtime_env(monkeypatch, address):
    """Ray logs a job's runtime_env (runtime_env_agent.log): it held every HF_* value."""
    import ray

    from engine import runtime
    from engine.config import EngineConfig

    for name, value in {**CANARY, "HF_HOME": "/data/hf", "TRANSFORMERS_CACHE": "/c"}.items():
        monkeypatch.setenv(name, value)
    if address:
        monkeypatch.setenv("RAY_ADDRESS", address)
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(runtime, "check_node_secrets", lambda names: seen.update(names=names))
    monkeypatch.setenv(runtime.SECRET_NAMES_ENV, ",".join(CANARY))
    for name in runtime.WORKER_ENV:
        monkeypatch.delenv(name, raising=False)  # restored after the test
    runtime.init_ray(EngineConfig())
    assert not any(v in repr(seen) for v in CANARY.values())
    if address:  # a joined cluster: the constants through the job's runtime_env
        assert seen["runtime_env"] == {"env_vars": runtime.WORKER_ENV}
        assert seen["names"] == list(CANARY)  # and the nodes are checked for the names
    else:  # a cluster started here: its node inherits them from this process
        assert "runtime_env" not in seen
        assert {n: os.environ[n] for n in runtime.WORKER_ENV} == runtime.WORKER_ENV


@pytest.mark.slow
def test_a_local_ray_cluster_gets_the_secrets_and_writes_none(monkeypatch):
    """The engine's own local cluster (ray.init here, as the local backend runs it): the
    workers inherit the values from the node, and Ray's files never hold them."""
    import ray

    from engine.config import load_config
    from engine.errors import EngineError
    from engine.runtime import WORKER_ENV, check_node_secrets, init_ray

    for name, value in CANARY.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for name in WORKER_ENV:
        monkeypatch.delenv(name, raising=False)  # init_ray sets them; restored after
    ray.shutdown()
    started = time.time()
    cfg = load_config(
        ["actor_rollout_ref.model.path=x", "data.train_files=x", "trainer.device=cpu",
         "trainer.n_gpus_per_node=1"],
        check=False,
    )  # fmt: skip
    init_ray(cfg)
    try:

        @ray.remote(num_cpus=0)
        def sees() -> dict[str, str]:
            digest = {n: hashlib.sha256(os.environ.get(n, "").encode()).hexdigest() for n in CANARY}
            return digest

        expected = {n: hashlib.sha256(v.encode()).hexdigest() for n, v in CANARY.items()}
        assert ray.get(sees.remote()) == expected

        @ray.remote(num_cpus=0)
        def settings() -> dict[str, str | None]:
            return {n: os.environ.get(n) for n in WORKER_ENV}

        assert ray.get(settings.remote()) == WORKER_ENV  # from the node, no runtime_env
        check_node_secrets(list(CANARY))  # every node has them
        with pytest.raises(EngineError, match="lacks the secrets RLCTL_NOT_SET"):
            check_node_secrets(["RLCTL_NOT_SET"])
    finally:
        ray.shutdown()
    time.sleep(1)  # Ray's log monitor flushes as it stops
    assert files_holding(ray_dirs_since(started), VALUES) == []


# ---------------------------------------------------------------------------
# Slurm: what rlctl stages and runs (the real daemons: tests/slurm/test_secrets_e2e.py)


def test_slurm_submission_passes_values_in_sbatchs_environment_only(tmp_path, monkeypatch):
    """A stand-in sbatch records a digest of each value it sees in its environment, and
    its argv: the values reach it there, and nowhere in the staged files or the store."""
    bin_dir, jobs, home, out = (tmp_path / d for d in ("bin", "jobs", "home", "out"))
    for d in (bin_dir, home, out):
        d.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        "#!/usr/bin/env bash\n"
        f'for n in {" ".join(CANARY)}; do printf "%s" "${{!n}}" | sha256sum | cut -c1-64; done'
        f" > {out}/digests\n"
        f'printf "%s\\n" "$@" > {out}/argv\n'
        "echo 4242\n"
    )
    sbatch.chmod(0o755)
    (home / "slurm.yaml").write_text(f"job_root: {jobs}\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("RLCTL_HOME", str(home))
    for name, value in CANARY.items():
        monkeypatch.setenv(name, value)
    store = JobStore(home / "jobs.db")
    job = rlctl.api.launch(str(recipe(tmp_path)), backend="slurm", store=store)
    assert store.get(job.id).handle["slurm_job_id"] == "4242"
    digests = (out / "digests").read_text().split()
    assert digests == [hashlib.sha256(v.encode()).hexdigest() for v in CANARY.values()]
    script = (jobs / job.id / "job.sbatch").read_text()
    assert f"export RLCTL_SECRET_NAMES={','.join(CANARY)}" in script
    assert files_holding([jobs, home, out], VALUES) == []


# ---------------------------------------------------------------------------
# SkyPilot: the render, the task SkyPilot gets, what rlctl keeps


class FakeSky(SimpleNamespace):
    """The ``sky`` module's calls rlctl makes, with SkyPilot's real ``Task``."""

    def __init__(self) -> None:
        import sky

        launched: list = []
        super().__init__(
            Task=sky.Task,
            launched=launched,
            jobs=SimpleNamespace(launch=lambda task, name: launched.append(task) or "req-1"),
            stream_and_get=lambda request: ([9], None),
        )


def test_skypilot_task_carries_values_as_secrets_only(tmp_path, monkeypatch):
    pytest.importorskip("sky", reason="skypilot is not installed")
    from rlctl.backends import skypilot

    fake = FakeSky()
    monkeypatch.setattr(skypilot, "import_sky", lambda: fake)
    monkeypatch.setattr(skypilot.SkyPilotBackend, "preflight", lambda self: None)
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    for name, value in CANARY.items():
        monkeypatch.setenv(name, value)
    path = recipe(tmp_path)
    store = JobStore(tmp_path / "home" / "jobs.db")
    job = rlctl.api.launch(str(path), backend="skypilot", store=store, cloud="k8s")
    assert store.get(job.id).handle["job_id"] == 9
    (task,) = fake.launched
    plain = {k: getattr(v, "get_secret_value", lambda v=v: v)() for k, v in task.secrets.items()}
    assert {k: plain[k] for k in CANARY} == CANARY  # they reach SkyPilot, as secrets
    assert not any(v in repr(task.envs) + task.run + task.setup for v in CANARY.values())
    assert "RLCTL_SECRET_NAMES=" in task.run
    redacted = repr(task.to_yaml_config(use_user_specified_yaml=True))
    assert not any(v in redacted for v in CANARY.values())
    emitted = tmp_path / "task.yaml"
    plan = subprocess.run(
        [sys.executable, "-c", "from rlctl.cli import main; main()", "plan", str(path),
         "--cloud", "k8s", "--emit-yaml", str(emitted)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    assert "secrets:" in emitted.read_text()
    assert files_holding([tmp_path], VALUES) == []
