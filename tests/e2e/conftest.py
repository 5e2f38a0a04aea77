"""Shared by the whole-run tests: the synthetic task's files, built once per module; the
engine overrides the CPU runs start from, their local Ray cluster and their metrics."""

import json
from pathlib import Path

import pytest

# Two CPU workers, the synthetic task, short responses: a few seconds a step.
BASE = (
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=2",
    "data.max_prompt_length=64",
    "data.max_response_length=8",
    "reward_model.num_workers=1",
    "actor_rollout_ref.actor.optim.lr=2e-3",
    "trainer.val_before_train=false",
)


def _read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def synthetic_data(tmp_path_factory):
    from engine.data.synthetic import write_synthetic_dataset

    return write_synthetic_dataset(tmp_path_factory.mktemp("synthetic"), n_train=512, n_val=32)


@pytest.fixture(scope="session")
def base_overrides() -> list[str]:
    """The engine overrides a CPU run starts from (two workers, short responses)."""
    return list(BASE)


@pytest.fixture(scope="session")
def read_metrics():
    """``read_metrics(run_dir) -> list[dict]``: a run's ``metrics.jsonl``, a record a line."""
    return _read_metrics


@pytest.fixture(scope="module")
def ray_cluster(base_overrides):
    """A local Ray cluster for the module's in-process runs, sized by ``base_overrides``."""
    import ray

    from engine.config import load_config
    from engine.runtime import init_ray

    init_ray(load_config(["actor_rollout_ref.model.path=x", "data.train_files=x", *base_overrides]))
    yield
    ray.shutdown()
