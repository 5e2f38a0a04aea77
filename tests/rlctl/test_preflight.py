"""The job's pre-flight (rlctl/job/preflight.py): the doctor's checks the plan implies, on
every backend's job script, and `preflight: false` leaving it out."""

from __future__ import annotations

import pytest

from rlctl import api
from rlctl.recipe.load import RecipeError, parse_recipe

BASE = {
    "name": "pf",
    "algorithm": "grpo",
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "data": {"prepare": "gsm8k"},
    "hardware": {"accelerators": "H100:2", "nodes": 2},
    "rollout": "vllm",
}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / ".rlctl"))


def spec(backend: str = "slurm", **fields):
    recipe = parse_recipe({**BASE, **fields})
    return api.prepare(
        recipe, backend, job_id="pf", **({"cloud": "gcp"} if backend == "skypilot" else {})
    )


def test_the_checks_follow_the_plan():
    s = spec(
        trainer="megatron",
        checkpoints="s3://ckpt/runs",
        secrets=["HF_TOKEN", "WANDB_API_KEY"],
        engine={"actor_rollout_ref.model.trust_remote_code": True},
    ).spec
    assert s.preflight == (
        "python", "-m", "engine.doctor", "--devices=cuda:2", "--rollout=vllm",
        "--backend=megatron", "--bucket=s3://ckpt/runs", "--secrets=HF_TOKEN,WANDB_API_KEY",
        "--model=Qwen/Qwen2.5-0.5B-Instruct", "--trust-remote-code",
    )  # fmt: skip
    # no bucket: room on disk for two checkpoints where they are written
    disk = [a for a in spec().spec.preflight if a.startswith("--disk=")]
    assert len(disk) == 1 and disk[0].startswith(f"--disk={spec().spec.paths.run_dir}:")


def test_skypilot_checks_the_bucket_as_its_nodes_mount_it():
    run = spec("skypilot", checkpoints="s3://ckpt/runs").files["run.sh"]
    assert "--bucket=/checkpoints/runs " in run and "s3://ckpt" not in run.split("pre-flight")[1]
    assert 'network=(--rendezvous="$head_ip:29511")' in run
    # before Ray starts on the node
    assert run.index("-m engine.doctor") < run.index("trap rlctl_ray_stop EXIT")


@pytest.mark.parametrize("backend", ["local", "slurm", "skypilot"])
def test_preflight_false_leaves_it_out(backend):
    files = spec(backend).files
    off = spec(backend, preflight=False)
    assert any("-m engine.doctor " in text for text in files.values())
    assert not any("-m engine.doctor " in text for text in off.files.values())
    assert off.spec.preflight == () and "preflight: false" in off.recipe.to_yaml()


def test_preflight_takes_true_or_false():
    with pytest.raises(RecipeError, match="preflight: expected true or false, got 'no'"):
        parse_recipe({**BASE, "preflight": "no"})
