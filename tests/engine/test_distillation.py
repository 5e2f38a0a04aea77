"""On-policy distillation: the losses against hand-computed values, the student's
log-probs at the teacher's tokens against a plain forward, the config's rules, and how
samples are routed to several teachers."""

import math

import pytest
import torch

from engine.algo.aggregate import LossScale
from engine.algo.distillation import (
    Divergence,
    distillation_loss,
    forward_kl_topk,
    sampled_token_divergence,
)
from engine.algo.policy_loss_base import PolicyLossInputs
from engine.config import ActorConfig, load_config
from engine.config.distillation import DistillationLossConfig
from engine.errors import ConfigError

LN = math.log


def test_forward_kl_topk_by_hand():
    teacher = torch.tensor([[[LN(0.5), LN(0.3)], [LN(0.1), LN(0.05)]]])
    student = torch.tensor([[[LN(0.25), LN(0.25)], [LN(0.5), LN(0.4)]]])
    d = forward_kl_topk(student, teacher)
    # 0.5 ln 2 + 0.3 ln 1.2; the second position's restricted sum is below 0: raised to 0
    assert d.per_token_BT[0, 0].item() == pytest.approx(0.5 * LN(2) + 0.3 * LN(1.2), abs=1e-6)
    assert d.per_token_BT[0, 1].item() == 0.0
    assert d.teacher_mass_BT[0].tolist() == pytest.approx([0.8, 0.15])
    assert d.student_mass_BT[0].tolist() == pytest.approx([0.5, 0.9])


def test_forward_kl_topk_clamps_tiny_logprobs_first():
    teacher = torch.tensor([[[LN(0.9)]]])
    student = torch.tensor([[[-30.0]]])
    d = forward_kl_topk(student, teacher, log_prob_min_clamp=-10.0)
    assert d.per_token_BT.item() == pytest.approx(0.9 * (LN(0.9) + 10.0), abs=1e-5)


def test_sampled_token_estimators_by_hand():
    s, t = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    k1 = sampled_token_divergence("k1", s, t).per_token_BT
    assert k1[0].tolist() == pytest.approx([0.5, -1.0])
    k3 = sampled_token_divergence("k3", s, t).per_token_BT
    # e^{t-s} - 1 - (t - s)
    assert k3[0].tolist() == pytest.approx([math.exp(-0.5) - 1 + 0.5, math.e - 1 - 1.0])


def _inputs(logp, mask, old=None):
    return PolicyLossInputs(
        logprobs_BT=logp,
        old_logprobs_BT=logp.detach() if old is None else old,
        advantages_BT=torch.zeros_like(logp),
        response_mask_BT=mask,
    )


def test_supervised_form_is_the_token_mean_of_the_clamped_divergence():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    div = torch.tensor([[3.0, 20.0, 7.0]]) * logp / logp.detach()  # the values, a graph
    cfg = DistillationLossConfig(loss_mode="k3", loss_max_clamp=10.0)
    loss, metrics = distillation_loss(
        Divergence(div),
        _inputs(logp, mask),
        cfg,
        ActorConfig(loss_agg_mode="token-mean"),
        LossScale.of(mask),
    )
    assert loss.item() == pytest.approx((3.0 + 10.0) / 2)  # 20 clamped to 10, padding out
    assert metrics["distillation/divergence"] == pytest.approx((3.0 + 20.0) / 2)
    loss.backward()
    # d/dlogp of 3·logp/logp₀ at the first token, /2 tokens; the clamped one has none
    assert logp.grad[0].tolist() == pytest.approx([3.0 / -1.0 / 2, 0.0, 0.0])


def test_reward_form_uses_minus_the_divergence_as_advantage():
    """use_policy_gradient: PPO's surrogate with A = −divergence; on the policy that
    sampled (ratio 1) the loss is the token mean of the divergence and its gradient
    −A/N = divergence/N through log π."""
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask = torch.ones(1, 2)
    div = sampled_token_divergence("k1", logp, torch.tensor([[-1.5, -1.0]]))  # 0.5, -1.0
    cfg = DistillationLossConfig(loss_mode="k1", use_policy_gradient=True)
    loss, _ = distillation_loss(
        div, _inputs(logp, mask), cfg, ActorConfig(loss_agg_mode="token-mean"), LossScale.of(mask)
    )
    assert loss.item() == pytest.approx((0.5 - 1.0) / 2)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.25, -0.5])


# -- config ---------------------------------------------------------------------------

BASE = [
    "actor_rollout_ref.model.path=/m",
    "data.train_files=t.parquet",
    "distillation.enabled=true",
]
TEACHER = "distillation.teacher_models.teacher_model"


def _problems(*overrides):
    with pytest.raises(ConfigError) as info:
        load_config([*BASE, *overrides])
    return "\n".join(info.value.problems)


def test_one_teacher_takes_the_whole_pool():
    cfg = load_config(
        [
            *BASE,
            f"{TEACHER}.model_path=/t",
            f"{TEACHER}.inference.name=vllm",
            "distillation.nnodes=2",
            "distillation.n_gpus_per_node=8",
            "distillation.distillation_loss.use_policy_gradient=true",
        ]
    )
    (teacher,) = cfg.distillation.teachers("vllm", cfg.distillation.pool_size(cfg.world_size))
    assert (teacher.key, teacher.tp, teacher.num_replicas) == ("default", 2, 8)


def test_k1_backpropagated_directly_is_refused_with_the_fix():
    p = _problems(f"{TEACHER}.model_path=/t", "distillation.distillation_loss.loss_mode=k1")
    assert "use_policy_gradient=true" in p


def test_teachers_must_fill_their_pool_exactly():
    p = _problems(
        "distillation.nnodes=1",
        "distillation.n_gpus_per_node=8",
        "+distillation.teacher_models.a.key=math",
        "+distillation.teacher_models.a.model_path=/a",
        "+distillation.teacher_models.a.num_replicas=1",
        "+distillation.teacher_models.b.key=geo",
        "+distillation.teacher_models.b.model_path=/b",
        "+distillation.teacher_models.b.num_replicas=2",
        "actor_rollout_ref.rollout.name=vllm",  # the teachers' engine where they name none
        "distillation.distillation_loss.loss_mode=k3",
    )
    assert "1×2 (a) + 2×2 (b) = 6 devices, which must equal" in p


def test_the_default_teacher_set_beside_named_ones_is_refused_not_dropped():
    p = _problems(
        f"{TEACHER}.model_path=/t",
        "+distillation.teacher_models.b.key=geo",
        "+distillation.teacher_models.b.model_path=/b",
    )
    assert "give it a name of its own" in p


def test_an_hf_teacher_is_one_device_per_copy():
    p = _problems(f"{TEACHER}.model_path=/t", f"{TEACHER}.inference.name=hf")
    assert "tensor_model_parallel_size=2: the hf teacher holds a whole copy" in p


def test_samples_go_to_their_teachers_ranks():
    from engine.loop.distill import route
    from engine.types import SampleMeta

    cfg = load_config(
        [
            *BASE,
            "trainer.n_gpus_per_node=4",
            "+distillation.teacher_models.a.key=math",
            "+distillation.teacher_models.a.model_path=/a",
            "+distillation.teacher_models.a.num_replicas=3",
            "+distillation.teacher_models.a.inference.tensor_model_parallel_size=1",
            "+distillation.teacher_models.a.inference.name=hf",
            "+distillation.teacher_models.b.key=geo",
            "+distillation.teacher_models.b.model_path=/b",
            "+distillation.teacher_models.b.num_replicas=1",
            "+distillation.teacher_models.b.inference.tensor_model_parallel_size=1",
            "+distillation.teacher_models.b.inference.name=hf",
        ]
    )
    sources = ["math", "geo", "math", "math", "geo", "math"]
    meta = SampleMeta(list(range(6)), sources, [None] * 6, [{}] * 6)
    # a on ranks 0-2 (its 4 samples split 1/1/2), b on rank 3
    assert route(cfg, meta, 4) == [[0], [2], [3, 5], [1, 4]]
    meta.data_source[0] = "code"
    with pytest.raises(Exception, match="data_source='code' have no teacher"):
        route(cfg, meta, 4)


# -- the student's log-probs at the teacher's tokens ------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_logprobs_at_the_teachers_tokens_match_a_plain_forward(tiny_model_dir, packed):
    from transformers import AutoModelForCausalLM

    from engine.train.forward import response_logprobs_at, response_topk
    from engine.types import TokenBatch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts, responses = [[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]]
    tokens = TokenBatch.from_ragged(prompts, responses, 0)
    _, values, ids = response_topk(model, tokens, torch.device("cpu"), 3)
    logp, _, at = response_logprobs_at(model, tokens, torch.device("cpu"), ids, packed=packed)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        with torch.no_grad():
            full = torch.log_softmax(model(torch.tensor([p + r])).logits[0].float(), -1)
        for j, token in enumerate(r):
            row = full[len(p) + j - 1]
            assert logp[i, j].item() == pytest.approx(row[token].item(), abs=1e-4)
            best = row.topk(3)
            assert ids[i, j].tolist() == best.indices.tolist()
            assert at[i, j].tolist() == pytest.approx(best.values.tolist(), abs=1e-4)
        assert ids[i, len(r) :].eq(0).all() and values[i, len(r) :].eq(0).all()  # padding
