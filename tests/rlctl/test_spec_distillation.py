"""On-policy distillation with the teachers on a pool of their own: the job asks for the
pool's devices beside the training's, as for a reward model's own pool (the planner does
not size the teachers yet: docs/distillation.md)."""

from __future__ import annotations

from rlctl import api

RECIPE = """\
name: opd
algorithm: grpo
model: Qwen/Qwen2.5-7B-Instruct
data: {prepare: gsm8k}
hardware: {accelerators: "H100:4", nodes: 1}
engine:
  trainer.nnodes: 1
  trainer.n_gpus_per_node: 4
  distillation.enabled: true
  distillation.nnodes: 1
  distillation.n_gpus_per_node: 4
  distillation.distillation_loss.loss_mode: forward_kl_topk
  distillation.teacher_models.teacher_model.model_path: Qwen/Qwen2.5-32B-Instruct
"""


def test_the_teachers_pool_is_asked_for_beside_the_training(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / ".rlctl"))
    path = tmp_path / "opd.yaml"
    path.write_text(RECIPE)
    job = api.prepare(api.load_recipe(path), "slurm", job_id="opd")
    # 4 training devices, and the teachers' 4 on a node of their own
    assert (job.spec.layout.nodes, job.spec.layout.devices_per_node) == (2, 4)
    assert "#SBATCH --nodes=2\n" in job.files["job.sbatch"]
    assert "distillation:\n  enabled: true" in job.files["engine.yaml"]
