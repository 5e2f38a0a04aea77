"""The bundled vision-language recipe (recipes/grpo_qwen25vl7b_geo3k.yaml) in the plan:
Qwen2.5-VL-7B sized with its vision tower, Geometry3K prepared where the job runs, and
the engine keys a vision-language actor runs with (packed rows, the HF rollout)."""

from __future__ import annotations

import yaml

from rlctl import api

RECIPE = "recipes/grpo_qwen25vl7b_geo3k.yaml"


def test_the_recipe_is_sized_with_the_vision_tower(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / ".rlctl"))
    job = api.prepare(api.load_recipe(RECIPE), "slurm", job_id="vl")
    plan = job.plan
    assert (plan.nodes, plan.devices_per_node) == (1, 8)
    model = plan.model
    assert round(model.num_params / 1e9, 2) == 8.29
    assert round(model.vision_params / 1e9, 2) == 0.68  # in memory, not in compute
    assert model.compute_params == model.num_params - model.vision_params
    (line,) = [r for r in plan.reasoning if r.startswith("model:")]
    assert "a vision tower of 0.68B" in line
    memory = plan.memory
    assert max(memory.train_peak_gib, memory.rollout_peak_gib) <= memory.budget_gib
    engine = yaml.safe_load(job.spec.engine_yaml)
    assert engine["actor_rollout_ref"]["model"]["use_remove_padding"] is True
    assert engine["actor_rollout_ref"]["rollout"]["name"] == "hf"
    assert engine["data"]["image_key"] == "images"
    assert "engine.data.prepare geo3k --out" in job.files["job.sbatch"]
