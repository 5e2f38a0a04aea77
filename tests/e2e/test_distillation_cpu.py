"""On-policy distillation on CPU: a tiny student learns to match a teacher (another tiny
model of the same vocabulary, its distribution made sharp) on the student's own samples,
with the distillation loss alone (use_task_rewards=false, forward_kl_topk: the supervised
form). The KL to the teacher over its top-k tokens falls by a wide margin in 8 steps; a
student that never saw the teacher's scores would not move it. Once with the teacher on
the training workers beside the actor (distillation.nnodes=0), once on a worker of its
own (distillation.nnodes=1). The estimator forms (k1 as a reward, k3) are checked against
hand-computed values in tests/engine/test_distillation.py: from a random student over a
2,048-token vocabulary they need far more steps than a test can spend to show a trend."""

import pytest

pytestmark = pytest.mark.slow

STEPS = 8
TOPK = [
    "distillation.distillation_loss.loss_mode=forward_kl_topk",
    "distillation.distillation_loss.topk=8",
]
LOCAL = ["distillation.nnodes=0", *TOPK]
OWN_POOL = [
    "trainer.n_gpus_per_node=1",
    "distillation.nnodes=1",
    "distillation.n_gpus_per_node=1",
    *TOPK,
]


@pytest.fixture(scope="module")
def sharp_teacher(tmp_path_factory):
    """A tiny model of the student's vocabulary whose next-token distribution is sharp
    (its final norm scaled up), so that a random student starts far from it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("teacher"), seed=3)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.model.norm.weight.mul_(30.0)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(path).save_pretrained(path)
    return path


@pytest.mark.parametrize("placement", [LOCAL, OWN_POOL], ids=["beside_actor", "own_pool"])
def test_student_moves_toward_the_teacher(
    placement, tiny_model_dir, sharp_teacher, synthetic_data, tmp_path, run_engine
):
    train, _ = synthetic_data
    run = run_engine(
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={train}",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.logger=[]",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "distillation.enabled=true",
        f"distillation.teacher_models.teacher_model.model_path={sharp_teacher}",
        "distillation.teacher_models.teacher_model.inference.name=hf",
        "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=1",
        "distillation.distillation_loss.use_task_rewards=false",
        *placement,
    )
    # each role's peak memory is logged per phase, the teacher's scoring among them
    last = run.steps[-1]
    assert last["memory/peak_gib/teacher.score"] > 0 and last["memory/limit_gib"] > 0
    assert last["memory/peak_gib/actor.update"] > 0
    losses = [r["distillation/divergence"] for r in run.steps]
    assert len(losses) == STEPS
    first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    assert first > 3.0, losses  # the sharp teacher is far from the random student
    assert last < 0.75 * first, losses
