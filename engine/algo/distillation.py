"""On-policy distillation's loss: how far the student is from the teacher on the student's
own samples, per response token, and how that enters the actor's loss
(``distillation.distillation_loss``; docs/distillation.md).

Per token, with s = log π_student(o_t) and t = log π_teacher(o_t) of the sampled token:

* an estimator of the reverse KL(π_student ‖ π_teacher) (engine.algo.kl's table with the
  teacher in the reference's place): k1 = s − t, k2 = ½(s − t)², k3 = e^{t−s} − 1 − (s − t),
  abs = |s − t|;
* ``forward_kl_topk``: KL(π_teacher ‖ π_student) restricted to the teacher's k most likely
  tokens v at the position, Σ_v e^{t_v}(t_v − s_v); the restricted sums do not add to 1,
  so a value below 0 is possible and is raised to 0.

Each token's value is clamped to ±``loss_max_clamp``. Then either it is the loss itself,
aggregated like the policy loss (``loss_agg_mode``), its gradient flowing through s (the
supervised form, Agarwal et al. 2024, "On-Policy Distillation of Language Models"), or,
with ``use_policy_gradient``, minus it is each token's advantage in PPO's clipped
surrogate (the reward form: Lu & Thinking Machines 2025, "On-Policy Distillation").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.algo.aggregate import LossScale, aggregate_loss
from engine.algo.kl import kl_penalty
from engine.algo.masked import masked_mean
from engine.algo.names import DISTILLATION_TOPK_MODE as TOPK_MODE
from engine.algo.policy_loss import POLICY_LOSSES
from engine.algo.policy_loss_base import PolicyLossInputs

if TYPE_CHECKING:
    from engine.config import ActorConfig
    from engine.config.distillation import DistillationLossConfig


@dataclass
class Divergence:
    """Per-token divergence from the teacher (B, T), and what the top-k form also
    measures: the probability mass the teacher's top-k tokens hold under each model."""

    per_token_BT: torch.Tensor
    student_mass_BT: torch.Tensor | None = None
    teacher_mass_BT: torch.Tensor | None = None


def sampled_token_divergence(
    mode: str, student_logprobs_BT: torch.Tensor, teacher_logprobs_BT: torch.Tensor
) -> Divergence:
    """The ``mode`` estimate of KL(student ‖ teacher) from the sampled tokens."""
    return Divergence(kl_penalty(mode, student_logprobs_BT, teacher_logprobs_BT))


def forward_kl_topk(
    student_at_topk_BTK: torch.Tensor,
    teacher_topk_BTK: torch.Tensor,
    log_prob_min_clamp: float | None = None,
) -> Divergence:
    """Σ_k p_teacher(v_k)(log p_teacher(v_k) − log p_student(v_k)) over the teacher's top-k
    tokens v_k, at least 0; log-probs first raised to ``log_prob_min_clamp`` if given (the
    masses are measured before that)."""
    student, teacher = student_at_topk_BTK.float(), teacher_topk_BTK.float()
    student_mass, teacher_mass = student.exp().sum(-1), teacher.exp().sum(-1)
    if log_prob_min_clamp is not None:
        student = student.clamp_min(log_prob_min_clamp)
        teacher = teacher.clamp_min(log_prob_min_clamp)
    kl = (teacher.exp() * (teacher - student)).sum(-1).clamp_min(0.0)
    return Divergence(kl, student_mass.detach(), teacher_mass.detach())


def distillation_loss(
    divergence: Divergence,
    inputs: PolicyLossInputs,
    loss_cfg: DistillationLossConfig,
    actor_cfg: ActorConfig,
    scale: LossScale | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation term of a micro-batch's loss (before ``distillation_loss_coef``)
    and its metrics; ``inputs``: the policy loss's, whose log-probs and mask it uses.
    ``scale``: the whole mini-batch's normalisers, as the policy loss takes them."""
    mask = inputs.response_mask_BT
    per_token = divergence.per_token_BT
    # the divergence itself whichever form the loss takes (with use_policy_gradient the
    # loss is a surrogate): for k1 and forward_kl_topk a mean of the KL's estimates
    metrics = {"distillation/divergence": float(masked_mean(per_token.detach(), mask))}
    for name, mass in (
        ("student_mass", divergence.student_mass_BT),
        ("teacher_mass", divergence.teacher_mass_BT),
    ):
        if mass is not None:
            metrics[f"distillation/{name}"] = float(masked_mean(mass, mask))
    if loss_cfg.loss_max_clamp is not None:
        c = loss_cfg.loss_max_clamp
        per_token = per_token.clamp(-c, c)  # k1 can be below 0
    if not loss_cfg.use_policy_gradient:
        loss = aggregate_loss(
            per_token, mask, actor_cfg.loss_agg_mode, scale, actor_cfg.loss_scale_factor
        )
        return loss, metrics
    # the reward form: −divergence as each token's advantage, PPO's clip with the
    # distillation section's own ranges
    clip_cfg = dataclasses.replace(
        actor_cfg,
        clip_ratio=loss_cfg.clip_ratio,
        clip_ratio_low=loss_cfg.clip_ratio_low,
        clip_ratio_high=loss_cfg.clip_ratio_high,
    )
    pg_inputs = dataclasses.replace(inputs, advantages_BT=-per_token.detach())
    out = POLICY_LOSSES.get(loss_cfg.policy_loss_mode)(pg_inputs, clip_cfg, scale)
    for k, v in out.metrics.items():
        metrics[f"distillation/{k.removeprefix('actor/')}"] = float(v)
    return out.loss, metrics


def needs_topk(loss_cfg: DistillationLossConfig) -> bool:
    return loss_cfg.loss_mode == TOPK_MODE
