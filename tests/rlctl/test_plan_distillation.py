"""On-policy distillation in the plan: the teachers' own pool asked for beside the
training (the job's layout, Slurm's and SkyPilot's requests), each teacher's weights
checked on its devices, a pool or a teacher that cannot fit refused with the fix, and
teachers beside the actor said to be uncounted."""

from __future__ import annotations

import json

import pytest

from rlctl import api
from rlctl.errors import RlctlError
from rlctl.planner.plan import Plan

RECIPE = """\
name: opd
algorithm: grpo
model: Qwen/Qwen3-8B
data: {{prepare: gsm8k}}
hardware: {{accelerators: "H100:{per_node}", nodes: {nodes}}}
engine:
  trainer.nnodes: 1
  trainer.n_gpus_per_node: 4
  distillation.enabled: true
  distillation.distillation_loss.loss_mode: forward_kl_topk
  distillation.teacher_models.teacher_model.model_path: Qwen/Qwen3-32B
  distillation.teacher_models.teacher_model.inference.name: vllm
{extra}"""
POOL = "  distillation.nnodes: 1\n  distillation.n_gpus_per_node: 4\n"


@pytest.fixture
def recipe_of(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / ".rlctl"))

    def make(extra: str, per_node: int = 8, nodes: int = 1):
        path = tmp_path / "opd.yaml"
        path.write_text(RECIPE.format(per_node=per_node, nodes=nodes, extra=extra))
        return api.load_recipe(path)

    return make


def test_the_bundled_recipe_asks_for_the_teachers_devices_beside_the_training():
    recipe = api.load_recipe("recipes/opd_qwen3_8b_from_32b.yaml")
    job = api.prepare(recipe, "slurm", job_id="opd")
    plan = job.plan
    # 4 training + 4 teacher devices share one node of 8
    assert (plan.nodes, plan.devices_per_node) == (1, 8)
    assert (job.spec.layout.nodes, job.spec.layout.devices_per_node) == (1, 8)
    assert "#SBATCH --gres=gpu:h100:8\n" in job.files["job.sbatch"]
    overrides = plan.engine_overrides()
    assert (overrides["trainer.nnodes"], overrides["trainer.n_gpus_per_node"]) == (1, 4)
    (line,) = [r for r in plan.reasoning if r.startswith("teachers on devices of their own")]
    assert "Qwen/Qwen3-32B, 32.8B) on vllm, 2 × TP 2: bf16 weights 30.5 GiB a device" in line
    assert "of the 64.0 GiB its engine takes (gpu_memory_utilization 0.8)" in line
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    sky = api.prepare(recipe, "skypilot", job_id="opd", cloud="gcp")
    assert "accelerators: H100:8" in sky.files["task.yaml"]


def test_a_teacher_too_big_for_its_share_is_refused_with_the_fix(recipe_of):
    tp1 = "  distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size: 1\n"
    with pytest.raises(RlctlError) as info:
        api.prepare(recipe_of(POOL + tp1), "slurm", job_id="opd")
    message = str(info.value)
    assert "teacher teacher_model (Qwen/Qwen3-32B) needs 61.0 GiB" in message
    assert "over the 40.0 GiB it may use" in message  # vLLM's default fraction 0.5
    assert "tensor_model_parallel_size" in info.value.hint


def test_a_pool_the_hardware_cannot_hold_is_refused_with_the_fix(recipe_of):
    with pytest.raises(RlctlError) as info:
        api.prepare(recipe_of(POOL, per_node=4, nodes=1), "slurm", job_id="opd")
    assert "need 2 node(s) of 4; the recipe's hardware has 1" in str(info.value)
    assert "hardware.nodes: 2" in info.value.hint
    # with two nodes the teachers take a node of their own
    job = api.prepare(recipe_of(POOL, per_node=4, nodes=2), "slurm", job_id="opd")
    assert (job.plan.nodes, job.plan.devices_per_node) == (2, 4)
    assert "#SBATCH --nodes=2\n" in job.files["job.sbatch"]


def test_teachers_beside_the_actor_are_said_to_be_uncounted(recipe_of):
    tp1 = "  distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size: 1\n"
    plan = api.prepare(recipe_of(tp1, per_node=4), "slurm", job_id="opd").plan
    assert plan.teacher_pool is None and (plan.nodes, plan.devices_per_node) == (1, 4)
    assert any("their memory is not in this estimate" in r for r in plan.reasoning)


def test_a_typo_inside_a_teacher_entry_is_refused_by_name(recipe_of):
    """A recipe's dotted keys inside a mapping value are read (the teacher's entry), and
    the engine checks their shape: a misspelt one is named with the entry's keys."""
    typo = "  distillation.teacher_models.teacher_model.modle_path: Qwen/Qwen3-32B\n"
    with pytest.raises(RlctlError) as info:
        api.prepare(recipe_of(POOL + typo), "slurm", job_id="opd")
    assert "unknown key 'modle_path'; did you mean" in str(info.value)
    assert "teacher_models.teacher_model.model_path" in str(info.value)
