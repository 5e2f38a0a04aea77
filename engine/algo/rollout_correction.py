"""The gap between the engine that sampled a batch and the policy that trains on it.

An inference engine (vLLM, SGLang) samples with its own kernels, batch shapes and
precision, so the probability it gave a token, π_rollout(o_t), differs a little from the
training forward's π_old(o_t) for the same weights; the policy gradient assumes they are
equal. The tools, all over the response tokens (mask 1), with ρ_t = π_old(o_t) /
π_rollout(o_t) (``algorithm.rollout_correction``, verl 0.9's keys):

- **Mismatch metrics** (verl's ``training/rollout_probs_diff_*``): the absolute
  difference of the two probabilities, |π_old(o_t) − π_rollout(o_t)|, its max, mean and
  standard deviation over the batch's tokens, and the Pearson correlation of the two.
  Probabilities near 0 hide large relative gaps, so two log-space figures come with
  them: the largest |log π_old − log π_rollout|, and KL(π_rollout ‖ π_old) estimated
  from the sampled tokens with k3 (r − 1 − log r, r = π_old / π_rollout; unbiased, ≥ 0).
  With every weight sync landing these stay at numerical noise; a stale or half-applied
  sync shows up here first.
- **Importance weights** (``rollout_is``; Yao et al. 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training"): each token's policy-gradient term is
  weighted by ρ, the ratio that makes the update unbiased for samples drawn from
  π_rollout; ``token`` level by its own ρ_t, ``sequence`` level every token of a
  response by Π_t ρ_t. ``rollout_is_threshold`` bounds them: a number C truncates,
  w = min(ρ, C) (TIS), so that a few tokens the engine found unlikely cannot dominate;
  "L_U" zeroes weights outside [L, U] (IcePop). ``rollout_is_batch_normalize`` then
  divides them by their batch mean (over tokens, or over sequences at ``sequence``
  level) so that they average 1.
- **Rejection sampling** (``rollout_rs``; ``engine.algo.rollout_rejection``): tokens or
  sequences whose divergence is out of bounds leave the loss mask.

In decoupled mode (three policies) the trainer corrects once per batch against π_old
(``correct_rollout``); in bypass mode π_old is π_rollout, and the actor's loss corrects
each micro-batch against the current policy, ρ = π_θ / π_rollout (``bypass_correction``).
The weights carry no gradient: they scale the loss, as advantages do.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from engine.algo.policy_loss_base import PolicyLossInputs
from engine.algo.rollout_rejection import rejection_mask
from engine.algo.rollout_spec import IS_LEVELS, parse_is_threshold, parse_rejection

if TYPE_CHECKING:
    from engine.config import RolloutCorrectionConfig
    from engine.types import TokenBatch

# exp(±20) is finite in float32: beyond this the ratio is as good as infinite, and capped.
MAX_LOG_RATIO = 20.0
LEVELS = IS_LEVELS
# Below this a batch mean of the weights is not divided by (they are all but zero).
NORMALIZE_EPS = 1e-8


@dataclass
class Correction:
    """What the rollout correction gives the update: importance weights and the loss mask
    with the rejected tokens removed (each None when off), and their metrics."""

    is_weights_BT: torch.Tensor | None = None
    loss_mask_BT: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def actor_tokens(self, tokens: TokenBatch) -> TokenBatch:
        """``tokens`` with the rejected tokens out of the loss mask (every loss term of
        the actor and its normalisers then leave them out)."""
        if self.loss_mask_BT is None:
            return tokens
        return replace(tokens, response_mask_BR=self.loss_mask_BT)


def correct_rollout(
    old_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    rc: RolloutCorrectionConfig,
) -> Correction:
    """Decoupled mode, once per batch: the mismatch metrics, and the weights and the
    rejection ``rc`` asks for, of ρ = π_old / π_rollout."""
    metrics = mismatch_metrics(old_logprobs_BT, rollout_logprobs_BT, mask_BT)
    correction = _correct(old_logprobs_BT, rollout_logprobs_BT, mask_BT, rc, rc.rollout_is)
    correction.metrics = metrics | correction.metrics
    return correction


def bypass_correction(
    logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    rc: RolloutCorrectionConfig,
) -> Correction:
    """Bypass mode, in the actor's loss of one micro-batch: ρ = π_θ / π_rollout of the
    current (detached) log-probs. Rejection for either loss type; weights only for
    ``loss_type=reinforce`` (PPO's ratio already is ρ under ``ppo_clip``)."""
    level = rc.rollout_is if rc.loss_type == "reinforce" else None
    return _correct(logprobs_BT.detach(), rollout_logprobs_BT, mask_BT, rc, level)


def bypass_policy_inputs(
    inputs: PolicyLossInputs, rc: RolloutCorrectionConfig
) -> tuple[PolicyLossInputs, dict[str, float]]:
    """The policy loss's inputs of one micro-batch in bypass mode (``old_logprobs_BT`` is
    π_rollout): the rejected tokens out of its mask, the weights of
    ``loss_type=reinforce`` in ``is_weights_BT``; and the correction's metrics. The
    mini-batch's normalisers were counted before its forward passes, so a rejected token
    still counts in them (as in verl)."""
    c = bypass_correction(inputs.logprobs_BT, inputs.old_logprobs_BT, inputs.response_mask_BT, rc)
    mask = inputs.response_mask_BT if c.loss_mask_BT is None else c.loss_mask_BT
    return replace(inputs, response_mask_BT=mask, is_weights_BT=c.is_weights_BT), c.metrics


def bypass_loss_mode(rc: RolloutCorrectionConfig, loss_mode: str) -> str:
    """The policy loss the actor runs: bypass mode's ``loss_type=reinforce`` is REINFORCE
    with explicit weights, −w·A·log π_θ, which is GPG's loss (``engine.algo.policy_loss``:
    no ratio, no clip); otherwise ``loss_mode``."""
    return "gpg" if rc.bypass_mode and rc.loss_type == "reinforce" else loss_mode


def _correct(
    logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    rc: RolloutCorrectionConfig,
    level: str | None,
) -> Correction:
    out = Correction()
    if level is not None:
        weights = rollout_is_weights(
            logprobs_BT, rollout_logprobs_BT, mask_BT, level, rc.rollout_is_threshold
        )
        out.metrics |= is_weight_metrics(weights, mask_BT, rc.rollout_is_threshold)
        if rc.rollout_is_batch_normalize:
            weights, factor = batch_normalize(weights, mask_BT, level)
            out.metrics["rollout_corr/rollout_is_batch_norm_factor"] = factor
        out.is_weights_BT = weights
    if rc.rollout_rs is not None:
        rules = parse_rejection(rc.rollout_rs, rc.rollout_rs_threshold)
        log_ratio = logprobs_BT - rollout_logprobs_BT
        out.loss_mask_BT, rs_metrics = rejection_mask(log_ratio, mask_BT, rules)
        out.metrics |= rs_metrics
    return out


def rollout_is_weights(
    old_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    level: str,
    threshold: float | str,
) -> torch.Tensor:
    """The importance weight of each token, 0 on padding: ρ_t (``token``) or Π_t ρ_t of
    its row (``sequence``), then bounded by ``threshold``: a number C gives min(ρ, C)
    (TIS), "L_U" gives ρ within [L, U] and 0 outside (IcePop)."""
    if level not in LEVELS:
        raise ValueError(f"rollout_is level {level!r}; valid: {', '.join(LEVELS)}")
    bounds = parse_is_threshold(threshold)
    valid = mask_BT.bool()
    log_ratio = torch.where(valid, old_logprobs_BT - rollout_logprobs_BT, 0.0).detach().float()
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
    ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
    if bounds.lower is None:
        weights = ratio.clamp(max=bounds.upper)
    else:
        inside = (ratio >= bounds.lower) & (ratio <= bounds.upper)
        weights = torch.where(inside, ratio, 0.0)
    return torch.where(valid, weights, 0.0)


def batch_normalize(
    weights_BT: torch.Tensor, mask_BT: torch.Tensor, level: str
) -> tuple[torch.Tensor, float]:
    """The weights divided by their mean, and that mean: over the response tokens at
    ``token`` level, over the sequences with a response token at ``sequence`` level (each
    once, however long). Unchanged (factor 1) when the mean is all but 0."""
    valid = mask_BT.bool()
    if level == "sequence":
        rows = valid.any(dim=-1)
        per_row = torch.where(valid, weights_BT, 0.0).sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)
        mean = per_row[rows].mean() if rows.any() else weights_BT.new_zeros(())
    else:
        mean = weights_BT[valid].mean() if valid.any() else weights_BT.new_zeros(())
    if not float(mean) > NORMALIZE_EPS:
        return weights_BT, 1.0
    return weights_BT / mean, float(mean)


def is_weight_metrics(
    weights_BT: torch.Tensor, mask_BT: torch.Tensor, threshold: float | str
) -> dict[str, float]:
    """The weights' mean over the response tokens, and the fraction TIS capped
    (``training/rollout_is_capped_frac``) or IcePop zeroed (verl's
    ``rollout_corr/rollout_is_oob_ratio``)."""
    valid = mask_BT.bool()
    w = weights_BT[valid]
    if w.numel() == 0:
        return {}
    bounds = parse_is_threshold(threshold)
    metrics = {"training/rollout_is_weight_mean": float(w.mean())}
    if bounds.lower is None:
        metrics["training/rollout_is_capped_frac"] = float((w >= bounds.upper).float().mean())
    else:
        metrics["rollout_corr/rollout_is_oob_ratio"] = float((w == 0).float().mean())
    return metrics


def mismatch_metrics(
    old_logprobs_BT: torch.Tensor, rollout_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor
) -> dict[str, float]:
    """|π_old − π_rollout| over the response tokens: max, mean, std (population: the
    batch is all there is), and the Pearson correlation of the two probabilities."""
    valid = mask_BT.bool()
    p_old = old_logprobs_BT[valid].double().exp()
    p_rollout = rollout_logprobs_BT[valid].double().exp()
    if p_old.numel() == 0:
        return {}
    diff = (p_old - p_rollout).abs()
    log_ratio = (old_logprobs_BT[valid] - rollout_logprobs_BT[valid]).double()
    log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    metrics = {
        "training/rollout_probs_diff_max": float(diff.max()),
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_std": float(diff.std(unbiased=False)),
        "training/rollout_log_ratio_abs_max": float(log_ratio.abs().max()),
        "training/rollout_k3_kl": float((log_ratio.exp() - 1 - log_ratio).mean()),
    }
    a, b = p_old - p_old.mean(), p_rollout - p_rollout.mean()
    denom = (a.square().sum() * b.square().sum()).sqrt()
    if denom > 0:
        metrics["training/rollout_actor_probs_pearson_corr"] = float((a * b).sum() / denom)
    return metrics


def ragged_to_padded(rows: list[list[float]], width: int) -> torch.Tensor:
    """Per-row log-probs (the engine's, one per response token) as a [B, width] tensor
    aligned with the right-padded responses; 0 past each row's end."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"row {i} has {len(row)} log-probs for {width} response slots")
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out
