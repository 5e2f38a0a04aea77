"""Policy (actor) losses: one registered function per variant, one shared signature.

Every loss takes the current and sampling-time log-probabilities of the response
tokens, their advantages and the response mask, and returns the scalar the optimizer
minimises plus a few diagnostics::

    fn(inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None) -> PolicyLossOutput

This module runs the one a config names (``compute_policy_loss``) and holds PPO and its
relatives (vanilla, GSPO, GPG, CISPO, the covariance losses, GMPO); the losses that
replace PPO's ratio clip with another trust region (SAPO, DPPO) are in
``engine.algo.trust_region``, and what they all share (the inputs, the registry, the
clamped log-ratio, the metrics) in ``engine.algo.policy_loss_base``.

Notation used in the docstrings: l_t = log π_θ(o_t) − log π_old(o_t) is the token
log-ratio, r_t = exp(l_t) the token ratio, A_t the advantage, ε_low = ``cfg.clip_low``
and ε_high = ``cfg.clip_high`` (``clip_ratio_low``/``clip_ratio_high``, both defaulting
to ``clip_ratio``), sg[·] stop-gradient. Per-token losses are reduced with
``aggregate_loss(..., cfg.loss_agg_mode, scale, cfg.loss_scale_factor)`` so that
micro-batches sum to the mini-batch loss; the sequence-level losses (GSPO, GMPO, SAPO)
say how they aggregate.

The log-ratio is clamped to ±``MAX_LOG_RATIO`` before it is exponentiated, so a
policy that drifted far from the sampler (or a padding slot with garbage log-probs)
gives a large but finite loss, never inf or NaN. Past the clamp the ratio has no
gradient; every clipped loss has already stopped that token's gradient long before.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from engine.algo import trust_region  # noqa: F401  (registers SAPO's and DPPO's losses)
from engine.algo.aggregate import LossScale
from engine.algo.masked import masked_mean
from engine.algo.policy_loss_base import (
    MAX_LOG_RATIO,
    PG_CLIPFRAC,
    PG_CLIPFRAC_LOWER,
    POLICY_LOSSES,
    PPO_KL,
    PolicyLossInputs,
    PolicyLossOutput,
    aggregate,
    clamped_log_ratio,
    clipped_surrogate,
    fraction,
    masked_logprobs,
    ppo_kl,
    valid_tokens,
    weighted_advantages,
)

if TYPE_CHECKING:
    from engine.config import ActorConfig

__all__ = [
    "CLIP_COV_FRAC",
    "KL_COV_FRAC",
    "MAX_LOG_RATIO",
    "PG_CLIPFRAC",
    "PG_CLIPFRAC_LOWER",
    "POLICY_LOSSES",
    "PPO_KL",
    "PolicyLossInputs",
    "PolicyLossOutput",
    "compute_policy_loss",
]

CLIP_COV_FRAC = "actor/clip_cov_frac"
KL_COV_FRAC = "actor/kl_cov_frac"


def compute_policy_loss(
    inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None = None
) -> PolicyLossOutput:
    """The loss named by ``cfg.policy_loss.loss_mode`` (see ``POLICY_LOSSES``).

    ``scale`` holds the normalisers of the whole mini-batch this micro-batch belongs
    to; None takes the micro-batch as the whole batch.
    """
    shapes = {
        tuple(t.shape)
        for t in (
            inputs.logprobs_BT,
            inputs.old_logprobs_BT,
            inputs.advantages_BT,
            inputs.response_mask_BT,
            inputs.is_weights_BT,
        )
        if t is not None
    }
    if len(shapes) != 1:
        raise ValueError(f"policy loss inputs must share one (B, T) shape, got {sorted(shapes)}")
    return POLICY_LOSSES.get(cfg.policy_loss.loss_mode)(inputs, cfg, scale)


# ---------------------------------------------------------------------------
# shared by the covariance losses


def _centred_covariance(inputs: PolicyLossInputs) -> torch.Tensor:
    """cov_t = (A_t − mean A)(log π_θ(o_t) − mean log π_θ), means over the valid tokens
    of this micro-batch; detached, 0 on padding."""
    mask = inputs.response_mask_BT
    with torch.no_grad():
        adv = torch.where(valid_tokens(inputs), inputs.advantages_BT, 0.0)
        logp = masked_logprobs(inputs)
        cov = (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))
        return torch.where(valid_tokens(inputs), cov, torch.zeros_like(cov))


def _count_to_select(ratio: float, num_valid: int) -> int:
    """ratio·N tokens, rounded stochastically (global torch RNG) so that the expected
    count is exactly ratio·N even when a micro-batch has fewer than 1/ratio tokens."""
    expected = ratio * num_valid
    count = math.floor(expected)
    if expected > count and float(torch.rand(())) < expected - count:
        count += 1
    return min(count, num_valid)


# ---------------------------------------------------------------------------
# the losses


@POLICY_LOSSES.register("vanilla")
def vanilla(
    inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None
) -> PolicyLossOutput:
    """PPO's clipped surrogate with clip-higher and dual-clip.

    Per token (Schulman et al. 2017, "Proximal Policy Optimization Algorithms")::

        L_t = max(−A_t r_t, −A_t clip(r_t, 1 − ε_low, 1 + ε_high))

    with separate lower and upper ranges (DAPO's clip-higher, Yu et al. 2025), and for
    A_t < 0 the dual-clip bound (Ye et al. 2020, "Mastering Complex Control in MOBA
    Games with Deep RL")::

        L_t = min(L_t, −A_t c),   c = clip_ratio_c > 1

    which caps the loss of a negative-advantage token whose ratio exploded; where the
    bound is active the token has no gradient. Aggregated with ``loss_agg_mode``.

    Metrics: ``pg_clipfrac`` (valid tokens where the clipped term was active),
    ``pg_clipfrac_lower`` (valid tokens where dual-clip was active), ``ppo_kl``.
    """
    mask = inputs.response_mask_BT
    s = clipped_surrogate(inputs, cfg)
    return PolicyLossOutput(
        loss=aggregate(s.loss_BT, inputs, cfg, scale),
        metrics={
            PG_CLIPFRAC: fraction(s.clipped_BT, mask),
            PG_CLIPFRAC_LOWER: fraction(s.dual_clipped_BT, mask),
            PPO_KL: ppo_kl(inputs),
        },
    )


@POLICY_LOSSES.register("gspo")
def gspo(inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None) -> PolicyLossOutput:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"), token form.

    The ratio is the length-normalised sequence likelihood ratio::

        s_i = exp( (1/|o_i|) Σ_t l_{i,t} )

    carried to each token so that the gradient flows token by token (GSPO-token)::

        s_{i,t} = sg[s_i] · π_θ(o_t) / sg[π_θ(o_t)]      (value s_i, ∂s_{i,t}/∂log π_θ(o_t) = s_i)
        L_{i,t} = max(−A_{i,t} s_{i,t}, −A_{i,t} clip(s_{i,t}, 1 − ε_low, 1 + ε_high))

    and, as in the paper, averaged over each sequence's tokens and then over sequences:
    the aggregation is always ``seq-mean-token-mean`` (whatever ``loss_agg_mode`` says),
    so a token of sequence i gets gradient −A_i s_i / (|o_i| · |S|) while unclipped.
    With a sequence-constant advantage this is exactly the sequence-level GSPO objective.
    The paper's ranges are tiny (ε_low = 3e-4, ε_high = 4e-4): set them with
    ``clip_ratio_low`` / ``clip_ratio_high``. No dual-clip.

    Metrics: ``pg_clipfrac`` (valid tokens whose sequence ratio was clipped), ``ppo_kl``.
    """
    mask = inputs.response_mask_BT
    adv = weighted_advantages(inputs)
    token_log_ratio = inputs.logprobs_BT - inputs.old_logprobs_BT
    token_log_ratio = torch.where(valid_tokens(inputs), token_log_ratio, torch.zeros_like(adv))
    seq_log_ratio_B = masked_mean(token_log_ratio, mask, dim=-1).clamp(
        -MAX_LOG_RATIO, MAX_LOG_RATIO
    )
    logp = masked_logprobs(inputs)
    log_s_BT = seq_log_ratio_B.detach().unsqueeze(-1) + (logp - logp.detach())
    ratio = torch.exp(log_s_BT)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss_BT = torch.maximum(unclipped, clipped)
    return PolicyLossOutput(
        loss=aggregate(loss_BT, inputs, cfg, scale, mode="seq-mean-token-mean"),
        metrics={PG_CLIPFRAC: fraction(clipped > unclipped, mask), PPO_KL: ppo_kl(inputs)},
    )


@POLICY_LOSSES.register("gpg")
def gpg(inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None) -> PolicyLossOutput:
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline
    for Model Reasoning"): the plain policy gradient, no ratio and no clip::

        L_t = −A_t log π_θ(o_t)

    Aggregated with ``loss_agg_mode``. On-policy by construction (one update per batch);
    ``pg_clipfrac`` is always 0.
    """
    loss_BT = -weighted_advantages(inputs) * masked_logprobs(inputs)
    return PolicyLossOutput(
        loss=aggregate(loss_BT, inputs, cfg, scale),
        metrics={PG_CLIPFRAC: 0.0, PPO_KL: ppo_kl(inputs)},
    )


@POLICY_LOSSES.register("cispo")
def cispo(inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None) -> PolicyLossOutput:
    """CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with
    Lightning Attention"): clip the importance-sampling weight, not the update::

        L_t = −sg[clip(r_t, 1 − ε_low, 1 + ε_high)] · A_t · log π_θ(o_t)

    The weight is detached, so every token keeps a gradient (−ŵ_t A_t w.r.t. its
    log-prob), unlike PPO, which drops the gradient of clipped tokens. The range comes
    from ``clip_ratio_low`` / ``clip_ratio_high`` (default ``clip_ratio``); the paper
    effectively leaves the lower side open and tunes only the upper one: a
    ``clip_ratio_low`` of 1 or more (verl's example gives 10). Aggregated with
    ``loss_agg_mode`` (the paper uses token-mean).

    Metrics: ``pg_clipfrac`` (valid tokens whose weight was truncated), ``ppo_kl``.
    """
    mask = inputs.response_mask_BT
    ratio = torch.exp(clamped_log_ratio(inputs)).detach()
    weight = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss_BT = -weight * weighted_advantages(inputs) * masked_logprobs(inputs)
    return PolicyLossOutput(
        loss=aggregate(loss_BT, inputs, cfg, scale),
        metrics={PG_CLIPFRAC: fraction(weight != ratio, mask), PPO_KL: ppo_kl(inputs)},
    )


@POLICY_LOSSES.register("clip_cov")
def clip_cov(
    inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None
) -> PolicyLossOutput:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models"): stop the gradient of a few high-covariance tokens.

    Entropy falls in proportion to the covariance between a token's log-prob and its
    advantage. Per valid token of this micro-batch::

        cov_t = (A_t − mean A) · (log π_θ(o_t) − mean log π_θ)

    From the tokens with ``clip_cov_lb`` ≤ cov_t ≤ ``clip_cov_ub``, pick uniformly at
    random (torch's global RNG: seed it for reproducibility) ``clip_cov_ratio`` · N of
    them, N the valid tokens of the micro-batch (rounded stochastically, so the expected
    count is exact even for small micro-batches; fewer if fewer tokens are in the
    window). Their loss is detached — it still counts in the value and the
    normaliser, but gives no gradient, which is the paper's "0 for t ∈ I_clip" for the
    update. Every other token gets the ``vanilla`` loss (clip-higher and dual-clip).
    Aggregated with ``loss_agg_mode``.

    Keys: ``policy_loss.clip_cov_ratio``, ``clip_cov_lb``, ``clip_cov_ub``, plus the
    vanilla clip keys. Metrics: vanilla's, and ``clip_cov_frac`` (tokens detached).
    """
    mask = inputs.response_mask_BT
    valid = valid_tokens(inputs)
    pl = cfg.policy_loss
    cov = _centred_covariance(inputs)
    window = valid & (cov >= pl.clip_cov_lb) & (cov <= pl.clip_cov_ub)
    candidates = window.flatten().nonzero().squeeze(-1)
    count = min(_count_to_select(pl.clip_cov_ratio, int(valid.sum())), candidates.numel())
    chosen = candidates[torch.randperm(candidates.numel(), device=candidates.device)[:count]]
    detached = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    detached[chosen] = True
    detached = detached.view(mask.shape)

    s = clipped_surrogate(inputs, cfg)
    loss_BT = torch.where(detached, s.loss_BT.detach(), s.loss_BT)
    return PolicyLossOutput(
        loss=aggregate(loss_BT, inputs, cfg, scale),
        metrics={
            PG_CLIPFRAC: fraction(s.clipped_BT, mask),
            PG_CLIPFRAC_LOWER: fraction(s.dual_clipped_BT, mask),
            PPO_KL: ppo_kl(inputs),
            CLIP_COV_FRAC: fraction(detached, mask),
        },
    )


@POLICY_LOSSES.register("kl_cov")
def kl_cov(inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None) -> PolicyLossOutput:
    """KL-Cov (Cui et al. 2025, same paper as Clip-Cov): a KL penalty on the tokens of
    largest covariance, no clip.

    With cov_t as in ``clip_cov``, let I be the ``kl_cov_ratio`` · N valid tokens of
    largest cov_t in this micro-batch (N its valid tokens; the count rounded as in
    ``clip_cov``; ties broken arbitrarily). Per token::

        L_t = −A_t r_t + β |log π_θ(o_t) − log π_old(o_t)| · [t ∈ I],   β = ppo_kl_coef

    The penalty uses the unclamped log-ratio so that it keeps pulling back a token
    whose ratio drifted past the clamp. Aggregated with ``loss_agg_mode``.

    Keys: ``policy_loss.kl_cov_ratio``, ``policy_loss.ppo_kl_coef``. Metrics:
    ``pg_clipfrac`` (always 0), ``ppo_kl``, ``kl_cov_frac`` (tokens penalised).
    """
    mask = inputs.response_mask_BT
    valid = valid_tokens(inputs)
    pl = cfg.policy_loss
    cov = _centred_covariance(inputs)
    count = _count_to_select(pl.kl_cov_ratio, int(valid.sum()))
    ranked = torch.where(valid, cov, torch.full_like(cov, -math.inf)).flatten()
    penalised = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    if count > 0:
        penalised[torch.topk(ranked, count, sorted=False).indices] = True
    penalised = penalised.view(mask.shape) & valid

    diff = inputs.logprobs_BT - inputs.old_logprobs_BT
    diff = torch.where(valid, diff, torch.zeros_like(diff))
    pg = -weighted_advantages(inputs) * torch.exp(diff.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    loss_BT = torch.where(penalised, pg + pl.ppo_kl_coef * diff.abs(), pg)
    return PolicyLossOutput(
        loss=aggregate(loss_BT, inputs, cfg, scale),
        metrics={
            PG_CLIPFRAC: 0.0,
            PPO_KL: ppo_kl(inputs),
            KL_COV_FRAC: fraction(penalised, mask),
        },
    )


@POLICY_LOSSES.register("geo_mean")
def geo_mean(
    inputs: PolicyLossInputs, cfg: ActorConfig, scale: LossScale | None
) -> PolicyLossOutput:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization"): the geometric mean
    of the token ratios, clipped token by token in log space.

    The paper maximises, per sequence i with advantage Â_i,
    ``sgn(Â_i) · ( Π_t |min(ρ_t Â_i, clip(ρ_t, e^{−ε_low}, e^{ε_high}) Â_i)| )^{1/|o_i|}``.
    Taking logs, this is the PPO trust region applied to each token's log-ratio, one
    side per advantage sign, before the mean::

        l'_t = min(l_t, ε_high)   if Â_i > 0      (= sgn(Â)·min(sgn(Â)·l_t, sgn(Â)·clip(l_t, −ε_low, ε_high)))
        l'_t = max(l_t, −ε_low)   if Â_i < 0
        L_i  = −Â_i · exp( (1/|o_i|) Σ_t l'_t )

    ``clip_ratio_low`` / ``clip_ratio_high`` are therefore log-space bounds here (ratio
    range (e^{−ε_low}, e^{ε_high})); the paper recommends a wide 0.4 on both sides. With
    equal bounds this matches the paper's pseudo-code exactly; with unequal ones ε_high
    limits how far a ratio grows and ε_low how far it shrinks, as in ``vanilla``.
    Â_i is the mean of the sequence's token advantages (the advantage itself for
    outcome-reward estimators such as GRPO). A clipped token has no gradient; an
    unclipped one gets −Â_i · exp(mean l') / |o_i|.

    Sequence-level: L_i is spread over the sequence's tokens and aggregated with
    ``seq-mean-token-mean`` (whatever ``loss_agg_mode`` says), i.e. Σ_i L_i / |S|.

    Metrics: ``pg_clipfrac`` (valid tokens whose log-ratio was clipped), ``ppo_kl``.
    """
    mask = inputs.response_mask_BT
    valid = valid_tokens(inputs)
    log_ratio = clamped_log_ratio(inputs)
    seq_adv_B = masked_mean(weighted_advantages(inputs), mask, dim=-1)
    sign_BT = torch.sign(seq_adv_B).unsqueeze(-1).expand_as(log_ratio)
    upper = torch.minimum(log_ratio, torch.full_like(log_ratio, cfg.clip_high))
    lower = torch.maximum(log_ratio, torch.full_like(log_ratio, -cfg.clip_low))
    clipped_log_ratio = torch.where(sign_BT > 0, upper, torch.where(sign_BT < 0, lower, log_ratio))
    seq_ratio_B = torch.exp(masked_mean(clipped_log_ratio, mask, dim=-1))
    loss_B = -seq_adv_B * seq_ratio_B
    loss_BT = loss_B.unsqueeze(-1).expand_as(log_ratio)
    clipped = valid & (clipped_log_ratio != log_ratio)
    return PolicyLossOutput(
        loss=aggregate(loss_BT, inputs, cfg, scale, mode="seq-mean-token-mean"),
        metrics={PG_CLIPFRAC: fraction(clipped, mask), PPO_KL: ppo_kl(inputs)},
    )
