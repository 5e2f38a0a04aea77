"""Rejection sampling against the rollout engine (``algorithm.rollout_correction.rollout_rs``,
verl's options): tokens, or whole sequences, on which the training policy and the sampler
disagree too much leave the loss. Unlike truncation, which keeps such a token at a capped
weight, rejection drops it: the tail of a mismatch is more often a broken sample than a
signal (Li et al. 2025, "Trust Region Masking for Long-Horizon LLM Reinforcement Learning").

With log ρ_t = log π_old(o_t) − log π_rollout(o_t) over the response tokens (clamped to
±20), each option is a divergence kN at a level (``engine.algo.rollout_spec``):

    k1_t = −log ρ_t        k2_t = ½ (log ρ_t)²        k3_t = ρ_t − 1 − log ρ_t

    token_kN      the token's own k_t
    seq_sum_kN    Σ_t k_t over the sequence's tokens  (seq_sum_k1 = −log Π_t ρ_t)
    seq_mean_kN   the mean of k_t                     (seq_mean_k1: −log of the geometric mean)
    seq_max_kN    the largest k_t

A k1 statistic s passes when lower ≤ exp(−s) ≤ upper, that is when the ratio (ρ_t, Π_t ρ_t,
or the geometric mean of ρ) lies in [lower, upper]; k2 and k3 pass when s ≤ upper. A token
stays when every option passes for it (a sequence option passes or fails all the tokens
of its sequence). verl 0.9's code bounds exp(+s) = 1/ρ for k1; the two agree whenever
lower = 1/upper, as with a single number U or "0.5_2.0".
"""

from __future__ import annotations

import math

import torch

from engine.algo.rollout_spec import RejectionRule

# exp(±20) is finite in float32: beyond it the ratio is as good as infinite.
MAX_LOG_RATIO = 20.0
PREFIX = "rollout_corr/rollout_rs"


def rejection_mask(
    log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor, rules: tuple[RejectionRule, ...]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The response mask with the rejected tokens set to 0, and verl's metrics: the
    fraction of the response tokens rejected (``rollout_rs_masked_fraction``), of the
    sequences that lost at least one (``rollout_rs_seq_masked_fraction``), and per option
    that fraction and the statistic's mean over the tokens, max and min."""
    valid = mask_BT.bool()
    log_ratio = log_ratio_BT.detach().float().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    log_ratio = torch.where(valid, log_ratio, 0.0)
    per_token = {
        "k1": -log_ratio,
        "k2": 0.5 * log_ratio.square(),
        "k3": torch.expm1(log_ratio) - log_ratio,
    }
    keep = valid.clone()
    metrics: dict[str, float] = {}
    count = int(valid.sum())
    for rule in rules:
        stat = _at_level(per_token[rule.estimator], valid, rule.level)
        passed = _passes(stat, rule)
        keep &= passed
        if count:
            name = f"{PREFIX}_{rule.option}"
            metrics[f"{name}_masked_fraction"] = float((valid & ~passed).sum()) / count
            metrics[f"{name}_mean"] = float(stat[valid].mean())
            metrics[f"{name}_max"] = float(stat[valid].max())
            metrics[f"{name}_min"] = float(stat[valid].min())
    if count:
        rejected = valid & ~keep
        rows = valid.any(dim=-1)
        metrics[f"{PREFIX}_masked_fraction"] = float(rejected.sum()) / count
        metrics[f"{PREFIX}_seq_masked_fraction"] = float(rejected.any(dim=-1)[rows].float().mean())
    return mask_BT * keep.to(mask_BT.dtype), metrics


def _at_level(stat_BT: torch.Tensor, valid_BT: torch.Tensor, level: str) -> torch.Tensor:
    """The per-token statistic, or its sequence reduction carried to every token (0 for a
    sequence without tokens); padding holds 0."""
    if level == "token":
        return torch.where(valid_BT, stat_BT, 0.0)
    counts = valid_BT.sum(dim=-1)
    if level == "seq_max":
        seq = torch.where(valid_BT, stat_BT, -math.inf).amax(dim=-1)
        seq = torch.where(counts > 0, seq, 0.0)
    else:
        seq = torch.where(valid_BT, stat_BT, 0.0).sum(dim=-1)
        if level == "seq_mean":
            seq = seq / counts.clamp(min=1)
    return seq.unsqueeze(-1).expand_as(stat_BT)


def _passes(stat_BT: torch.Tensor, rule: RejectionRule) -> torch.Tensor:
    if rule.estimator == "k1":  # the ratio exp(−stat) within [lower, upper]
        assert rule.lower is not None
        return (stat_BT >= -math.log(rule.upper)) & (stat_BT <= -math.log(rule.lower))
    return stat_BT <= rule.upper
