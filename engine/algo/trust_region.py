"""Policy losses that replace PPO's ratio clip with another trust region: SAPO's soft
gate and DPPO's divergence masks (registered in ``POLICY_LOSSES``, run by
``engine.algo.policy_loss.compute_policy_loss``; notation as in that module).

PPO keeps a token's update while its ratio r_t stays inside [1 − ε_low, 1 + ε_high] and
drops its gradient outside. SAPO fades the gradient out smoothly as r_t leaves 1; DPPO
keeps the gradient unclipped but drops it where the old and new policies have moved
apart by more than a divergence threshold, measured on the token's probability rather
than on the ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engine.algo.aggregate import LossScale
from engine.algo.policy_loss_base import (
    PG_CLIPFRAC,
    PG_CLIPFRAC_LOWER,
    POLICY_LOSSES,
    PPO_KL,
    PolicyLossInputs,
    PolicyLossOutput,
    aggregate,
    clamped_log_ratio,
    fraction,
    masked_logprobs,
    ppo_kl,
    valid_tokens,
    weighted_advantages,
)

if TYPE_CHECKING:
    from engine.config import ActorConfig

# Added to 1 − π and 1 − π_old in DPPO's binary KL, so that a probability of 1 gives a
# large finite divergence instead of a division by zero.
BINARY_KL_EPS = 1e-8


@POLICY_LOSSES.register("sapo")
def sapo(inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None) -> PolicyLossOutput:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", Qwen): a smooth,
    temperature-controlled gate on the token ratio instead of a hard clip::

        f_τ(r)  = (4/τ) · σ(τ (r − 1))
        L_t     = −A_t · f_{τ_t}(r_t),     τ_t = τ_pos if A_t > 0, else τ_neg

    Its gradient is the policy gradient scaled by the gate's slope::

        ∂L_t/∂log π_θ(o_t) = −A_t · r_t · 4 σ_t (1 − σ_t) = −A_t · r_t · sech²(τ_t (r_t − 1) / 2)

    with σ_t = σ(τ_t (r_t − 1)). On-policy (r = 1) the slope is exactly 1 whatever τ, so
    the first update is the plain policy gradient; as r moves away from 1 the weight
    decays smoothly to 0 (a soft trust region of width about 1/τ) instead of dropping to
    0 at a clip boundary. A larger τ_neg makes the region narrower for negative
    advantages, whose updates the paper finds less stable. The value at r = 1 is
    −2A/τ, a constant offset that carries no gradient.

    Always aggregated as ``seq-mean-token-mean`` (whatever ``loss_agg_mode`` says), as
    in the paper and in verl. There is no clip: ``clip_ratio*`` are not read and
    ``pg_clipfrac`` is always 0.

    Keys: ``tau_pos`` (default 1.0), ``tau_neg`` (default 1.05), both > 0.
    Metrics: ``pg_clipfrac`` (0), ``ppo_kl``.
    """
    adv = weighted_advantages(inputs)
    ratio = torch.exp(clamped_log_ratio(inputs))
    positive = torch.where(valid_tokens(inputs), inputs.advantages_BT, 0.0) > 0
    tau = torch.where(
        positive,
        torch.full_like(ratio, cfg.tau_pos),
        torch.full_like(ratio, cfg.tau_neg),
    )
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss_BT = -adv * gate
    return PolicyLossOutput(
        loss=aggregate(loss_BT, inputs, cfg, scale, mode="seq-mean-token-mean"),
        metrics={PG_CLIPFRAC: 0.0, PPO_KL: ppo_kl(inputs)},
    )


# ---------------------------------------------------------------------------
# DPPO

# (π_θ(o_t), π_old(o_t), log π_θ(o_t), log π_old(o_t), δ) -> the tokens inside the
# trust region on one side: "up" for A > 0 (π may grow), "down" for A ≤ 0.
_KeepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def _dppo(
    inputs: PolicyLossInputs,
    cfg: ActorConfig,
    scale: LossScale | None,
    keep_up: _KeepFn,
    keep_down: _KeepFn,
) -> PolicyLossOutput:
    """The DPPO loss with the trust region given by ``keep_up`` / ``keep_down``."""
    mask = inputs.response_mask_BT
    valid = valid_tokens(inputs)
    ratio = torch.exp(clamped_log_ratio(inputs)).detach()
    weight = ratio.clamp(max=cfg.clip_ratio_c)
    with torch.no_grad():
        # A log-prob above 0 is not a probability: read it as 0 (π = 1), so π stays in
        # [0, 1] even for garbage inputs. Padding is replaced before anything is computed.
        logp = torch.where(valid, inputs.logprobs_BT, 0.0).clamp(max=0.0)
        old_logp = torch.where(valid, inputs.old_logprobs_BT, 0.0).clamp(max=0.0)
        prob, old_prob = torch.exp(logp), torch.exp(old_logp)
        positive = torch.where(valid, inputs.advantages_BT, 0.0) > 0
        keep = torch.where(
            positive,
            keep_up(prob, old_prob, logp, old_logp, cfg.clip_high),
            keep_down(prob, old_prob, logp, old_logp, cfg.clip_low),
        )
        keep = keep & valid
    pg = -weighted_advantages(inputs) * weight * masked_logprobs(inputs)
    loss_BT = torch.where(keep, pg, torch.zeros_like(pg))
    return PolicyLossOutput(
        loss=aggregate(loss_BT, inputs, cfg, scale),
        metrics={
            PG_CLIPFRAC: fraction(valid & ~keep, mask),
            PG_CLIPFRAC_LOWER: fraction(keep & (ratio > cfg.clip_ratio_c), mask),
            PPO_KL: ppo_kl(inputs),
        },
    )


def binary_kl(
    prob: torch.Tensor, old_prob: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor
) -> torch.Tensor:
    """KL(Bernoulli(π_old) ‖ Bernoulli(π)) of the binary distribution {o_t, not o_t}::

    π_old (log π_old − log π) + (1 − π_old) log((1 − π_old + 1e-8) / (1 − π + 1e-8))
    """
    rest = torch.log((1.0 - old_prob + BINARY_KL_EPS) / (1.0 - prob + BINARY_KL_EPS))
    return old_prob * (old_logp - logp) + (1.0 - old_prob) * rest


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv(
    inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None
) -> PolicyLossOutput:
    """DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement
    Learning"): the trust region is the total variation between the old and the new
    policy, approximated on the binary distribution {o_t, not o_t}, where it is
    |π_θ(o_t) − π_old(o_t)|.

    A ratio clip judges a token by how much its probability changed relative to its
    size: it stops the gradient of a rare token that moved little in absolute terms and
    lets a likely token move a lot. DPPO keeps the unclipped policy gradient and masks
    only the tokens that left the divergence region on the side their advantage pushes::

        M_t = [π_θ(o_t) − π_old(o_t) ≤ δ_high]    if A_t > 0
        M_t = [π_θ(o_t) − π_old(o_t) ≥ −δ_low]    if A_t ≤ 0
        L_t = −A_t · sg[min(r_t, C)] · log π_θ(o_t) · M_t,    C = clip_ratio_c

    so ∂L_t/∂log π_θ(o_t) = −A_t · min(r_t, C) on kept tokens (PPO's unclipped gradient,
    with the ratio truncated at C instead of dual-clip) and 0 on masked ones. The value
    is this score-function form, not PPO's surrogate, so ``pg_loss`` is not comparable
    with ``vanilla``'s; its gradient is.

    δ_low / δ_high are ``clip_ratio_low`` / ``clip_ratio_high`` (default ``clip_ratio``):
    probability differences here, not ratio ranges (verl's example: 0.15 for both, with
    ``clip_ratio_c=10000`` and ``loss_agg_mode=seq-mean-token-sum-norm``; the paper
    recommends a large truncation C). Aggregated with ``loss_agg_mode``.

    Metrics: ``pg_clipfrac`` (valid tokens masked out), ``pg_clipfrac_lower`` (kept
    tokens whose ratio was truncated at C), ``ppo_kl``.
    """

    def up(prob, old_prob, logp, old_logp, delta):
        return prob - old_prob <= delta

    def down(prob, old_prob, logp, old_logp, delta):
        return prob - old_prob >= -delta

    return _dppo(inputs, cfg, scale, up, down)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl(
    inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None
) -> PolicyLossOutput:
    """DPPO-Binary-KL (Qi et al. 2026, same paper as ``dppo_tv``): the trust region is
    the KL divergence of the binary distribution {o_t, not o_t}::

        D_t = π_old log(π_old / π_θ) + (1 − π_old) log((1 − π_old) / (1 − π_θ))

    (``binary_kl``, π for π(o_t), 1e-8 added to both 1 − π). A token is masked when D_t
    exceeds the threshold and it moved the way its advantage pushes::

        M_t = [D_t ≤ δ_high  or  π_θ(o_t) ≤ π_old(o_t)]    if A_t > 0
        M_t = [D_t ≤ δ_low   or  π_θ(o_t) ≥ π_old(o_t)]    if A_t ≤ 0
        L_t = −A_t · sg[min(r_t, C)] · log π_θ(o_t) · M_t,    C = clip_ratio_c

    Gradient, value, keys and metrics as in ``dppo_tv``; δ_low / δ_high are KL
    thresholds here (verl's example: 0.05).
    """

    def up(prob, old_prob, logp, old_logp, delta):
        return (binary_kl(prob, old_prob, logp, old_logp) <= delta) | (prob <= old_prob)

    def down(prob, old_prob, logp, old_logp, delta):
        return (binary_kl(prob, old_prob, logp, old_logp) <= delta) | (prob >= old_prob)

    return _dppo(inputs, cfg, scale, up, down)
