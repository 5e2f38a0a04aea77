"""The gap between the engine that sampled a batch and the policy that trains on it.

An inference engine (vLLM, SGLang) samples with its own kernels, batch shapes and
precision, so the probability it gave a token, π_rollout(o_t), differs a little from the
training forward's π_old(o_t) for the same weights; the policy gradient assumes they are
equal. Two tools, both over the response tokens (mask 1):

- **Mismatch metrics** (verl's ``training/rollout_probs_diff_*``): the absolute
  difference of the two probabilities, |π_old(o_t) − π_rollout(o_t)|, its max, mean and
  standard deviation over the batch's tokens, and the Pearson correlation of the two.
  Probabilities near 0 hide large relative gaps, so two log-space figures come with
  them: the largest |log π_old − log π_rollout|, and KL(π_rollout ‖ π_old) estimated
  from the sampled tokens with k3 (r − 1 − log r, r = π_old / π_rollout; unbiased, ≥ 0).
  With every weight sync landing these stay at numerical noise; a stale or half-applied
  sync shows up here first.
- **Truncated importance sampling** (TIS, Yao et al. 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training"): each token's policy-gradient term is
  weighted by w = min(π_old / π_rollout, C), the ratio that makes the update unbiased
  for samples drawn from π_rollout, capped at C (``rollout_is_threshold``) so that a
  few tokens the engine found unlikely cannot dominate. ``token`` level weights each
  token by its own ratio; ``sequence`` level weights every token of a response by the
  product of its tokens' ratios (capped once).

The weights carry no gradient: they scale the loss, as advantages do.
"""

from __future__ import annotations

import torch

# exp(±20) is finite in float32: beyond this the ratio is as good as infinite, and capped.
MAX_LOG_RATIO = 20.0
LEVELS = ("token", "sequence")


def rollout_is_weights(
    old_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    level: str,
    threshold: float,
) -> torch.Tensor:
    """w_t = min(π_old(o_t) / π_rollout(o_t), C) per token (``token``), or
    min(Π_t π_old(o_t) / π_rollout(o_t), C) for every token of a row (``sequence``);
    0 on padding."""
    if level not in LEVELS:
        raise ValueError(f"rollout_is level {level!r}; valid: {', '.join(LEVELS)}")
    valid = mask_BT.bool()
    log_ratio = torch.where(valid, old_logprobs_BT - rollout_logprobs_BT, 0.0).detach().float()
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
    weights = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp().clamp(max=threshold)
    return torch.where(valid, weights, 0.0)


def is_weight_metrics(weights_BT: torch.Tensor, mask_BT: torch.Tensor, threshold: float) -> dict:
    valid = mask_BT.bool()
    w = weights_BT[valid]
    if w.numel() == 0:
        return {}
    return {
        "training/rollout_is_weight_mean": float(w.mean()),
        "training/rollout_is_capped_frac": float((w >= threshold).float().mean()),
    }


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
