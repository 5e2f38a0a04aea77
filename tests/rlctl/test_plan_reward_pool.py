"""The reward model on devices of its own (reward_model.enable_resource_pool): the job asks
for its devices beside the training's (the plan's layout and the launchers' requests), its
memory leaves the training devices, and a pool the recipe's hardware cannot hold is
refused with the fix."""

from __future__ import annotations

import json

import pytest

from rlctl import api
from rlctl.errors import RlctlError
from rlctl.planner.plan import Plan

RECIPE = """\
name: rm-pool
algorithm: grpo
model: Qwen/Qwen2.5-7B-Instruct
data: {{prepare: gsm8k}}
hardware: {{accelerators: "H100:8"{nodes}}}
engine:
  reward_model.enable: true
  reward_model.model.path: Qwen/Qwen2.5-1.5B-Instruct
{extra}"""
OWN = "  reward_model.enable_resource_pool: true\n  reward_model.nnodes: 1\n"
TRAIN_4 = "  trainer.nnodes: 1\n  trainer.n_gpus_per_node: 4\n"


@pytest.fixture
def recipe_of(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / ".rlctl"))

    def make(extra: str, nodes: int | None = 1):
        path = tmp_path / "rm.yaml"
        where = f", nodes: {nodes}" if nodes else ""
        path.write_text(RECIPE.format(nodes=where, extra=extra))
        return api.load_recipe(path)

    return make


def test_a_pool_sharing_the_node_is_asked_for_and_the_training_keeps_its_size(recipe_of):
    recipe = recipe_of(TRAIN_4 + OWN + "  reward_model.n_gpus_per_node: 4\n")
    slurm = api.prepare(recipe, "slurm", job_id="rm")
    # 4 training + 4 reward model devices ≤ 8: one node, all 8 of its devices
    assert (slurm.spec.layout.nodes, slurm.spec.layout.devices_per_node) == (1, 8)
    assert (slurm.plan.nodes, slurm.plan.devices_per_node) == (1, 8)
    assert "#SBATCH --nodes=1\n" in slurm.files["job.sbatch"]
    assert "#SBATCH --gres=gpu:h100:8\n" in slurm.files["job.sbatch"]
    overrides = slurm.plan.engine_overrides()
    assert (overrides["trainer.nnodes"], overrides["trainer.n_gpus_per_node"]) == (1, 4)
    (line,) = [r for r in slurm.plan.reasoning if r.startswith("reward model on devices")]
    assert "1 node(s) × 4" in line and "share the nodes" in line and "1 node(s) × 8" in line
    assert "on each of its own 4 device(s)" in line
    # its memory is on its own devices, none on the training ones
    assert slurm.plan.memory.reward_model_gib == 0.0
    assert Plan.from_json(json.loads(json.dumps(slurm.plan.to_json()))) == slurm.plan
    sky = api.prepare(recipe, "skypilot", job_id="rm", cloud="gcp")
    task = sky.files["task.yaml"]
    assert "num_nodes: 1\n" in task and "accelerators: H100:8" in task


def test_the_same_reward_model_on_the_training_devices_counts_there(recipe_of):
    plan = api.prepare(recipe_of(TRAIN_4, nodes=None), "slurm", job_id="rm").plan
    assert plan.reward_pool is None and plan.memory.reward_model_gib > 0
    assert (plan.nodes, plan.devices_per_node) == (1, 4)


@pytest.mark.parametrize(("per_node", "shares"), [(2, True), (8, False)])
def test_auto_sizing_asks_for_the_training_and_the_pool(recipe_of, per_node, shares):
    recipe = recipe_of(OWN + f"  reward_model.n_gpus_per_node: {per_node}\n", nodes=None)
    slurm = api.prepare(recipe, "slurm", job_id="rm")
    pool = slurm.plan.reward_pool
    assert pool is not None and (pool.nodes, pool.devices_per_node) == (1, per_node)
    t_nodes, t_per_node = pool.train_nodes, pool.train_devices_per_node
    assert (t_per_node + per_node <= 8) is shares
    # beside the training on its nodes, or a node of its own
    want = (max(t_nodes, 1), t_per_node + per_node) if shares else (t_nodes + 1, 8)
    assert (slurm.plan.nodes, slurm.plan.devices_per_node) == want
    assert (slurm.spec.layout.nodes, slurm.spec.layout.devices_per_node) == want
    assert f"#SBATCH --nodes={want[0]}\n" in slurm.files["job.sbatch"]
    assert f"#SBATCH --gres=gpu:h100:{want[1]}\n" in slurm.files["job.sbatch"]


def test_a_pool_the_hardware_cannot_hold_is_refused_with_the_fix(recipe_of):
    recipe = recipe_of(OWN + "  reward_model.n_gpus_per_node: 2\n")
    with pytest.raises(RlctlError) as info:
        api.prepare(recipe, "slurm", job_id="rm")
    assert "reward_model.enable_resource_pool" in str(info.value)
    assert "hardware.nodes: 2" in info.value.hint
    assert "trainer.n_gpus_per_node" in info.value.hint
