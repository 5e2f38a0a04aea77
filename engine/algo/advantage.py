"""Advantage estimators: how rewards (and critic values) become per-token advantages.

Every estimator is one registered function with the same signature,
``fn(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs``, looked up by
the name in ``algorithm.adv_estimator`` (``compute_advantages``). Advantages are
regression/policy-gradient targets, never differentiated: everything runs under
``torch.no_grad()``. The optimal token baselines are in ``engine.algo.token_baseline``;
what the estimators share (the inputs, the registry, the group statistics) is in
``engine.algo.advantage_base``.

Notation (shared by the docstrings below). ``r_t`` is the reward of response token t
(the sequence score sits on the last valid token; an in-reward KL penalty is already
subtracted per token), ``m_t`` the response mask, ``s_b = Σ_t m_t r_t`` the sequence
score of sample b, and g(b) the group of b (samples of the same prompt share a group id).
For a group g with n_g samples, ``mean_g`` is the mean of their scores and ``std_g`` the
unbiased (Bessel-corrected, divide by n_g − 1) standard deviation.

Conventions common to every estimator:

- Masked tokens (padding, and tool/environment tokens inside a multi-turn response) get
  advantage 0 and return 0, and their rewards are ignored.
- A row with no valid token (a padding row) is not a sample: it gets 0 everywhere and does
  not enter any group statistic, batch count or whitening.
- A singleton group has no baseline: its baseline is 0 and its scale 1, so A_b = s_b.
  (Using the group's own score as the baseline would silently zero the sample.)
- Sequence-level advantages A_b are broadcast to every valid token of sample b.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.algo import token_baseline  # noqa: F401  (registers the optimal token baselines)
from engine.algo.advantage_base import (
    ADVANTAGE_ESTIMATORS,
    EPS,
    AdvantageInputs,
    AdvantageOutputs,
    broadcast,
    group_reduce,
    group_stats,
    require_group_ids,
    require_input,
    rewards_and_mask,
    sequence_outputs,
    sequence_scores,
    std_scale,
)
from engine.algo.masked import masked_whiten

if TYPE_CHECKING:
    from engine.config import AlgorithmConfig

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "EPS",
    "AdvantageInputs",
    "AdvantageOutputs",
    "compute_advantages",
    "discounted_returns",
    "gae_advantages_and_returns",
]


def compute_advantages(
    name: str, inputs: AdvantageInputs, cfg: AlgorithmConfig
) -> AdvantageOutputs:
    """Run the estimator registered as ``name`` (``algorithm.adv_estimator``)."""
    return ADVANTAGE_ESTIMATORS.get(name)(inputs, cfg)


# ---------------------------------------------------------------------------
# token-level recursions (masked tokens skipped, not zeroed)


@torch.no_grad()
def gae_advantages_and_returns(
    rewards_BT: torch.Tensor,
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation before whitening; returns (advantages, returns).

    Over the valid tokens t_1 < t_2 < ... < t_K of a row (masked tokens removed, so a
    tool/env segment neither ends nor breaks the recursion), with V after the last
    valid token taken as 0 (the episode ends)::

        δ_k = r_{t_k} + γ V_{t_{k+1}} − V_{t_k}
        A_k = δ_k + γ λ A_{k+1}
        R_k = A_k + V_{t_k}

    Masked tokens get A = R = 0; their rewards and values are never read.
    """
    valid_BT = mask_BT.bool()
    batch, length = rewards_BT.shape
    zero = torch.zeros((), dtype=rewards_BT.dtype, device=rewards_BT.device)
    next_value_B = rewards_BT.new_zeros(batch)
    next_adv_B = rewards_BT.new_zeros(batch)
    adv_BT = torch.zeros_like(rewards_BT)
    for t in reversed(range(length)):
        valid_B = valid_BT[:, t]
        delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]
        adv_B = delta_B + gamma * lam * next_adv_B
        adv_BT[:, t] = torch.where(valid_B, adv_B, zero)
        next_value_B = torch.where(valid_B, values_BT[:, t], next_value_B)
        next_adv_B = torch.where(valid_B, adv_B, next_adv_B)
    returns_BT = torch.where(valid_BT, adv_BT + values_BT, zero)
    return adv_BT, returns_BT


@torch.no_grad()
def discounted_returns(
    rewards_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G_k = r_{t_k} + γ G_{k+1} over the valid tokens of each row (masked ones skipped).

    Masked tokens get G = 0 and their rewards are never read.
    """
    valid_BT = mask_BT.bool()
    zero = torch.zeros((), dtype=rewards_BT.dtype, device=rewards_BT.device)
    next_return_B = rewards_BT.new_zeros(rewards_BT.shape[0])
    returns_BT = torch.zeros_like(rewards_BT)
    for t in reversed(range(rewards_BT.shape[1])):
        valid_B = valid_BT[:, t]
        return_B = rewards_BT[:, t] + gamma * next_return_B
        returns_BT[:, t] = torch.where(valid_B, return_B, zero)
        next_return_B = torch.where(valid_B, return_B, next_return_B)
    return returns_BT


# ---------------------------------------------------------------------------
# estimators


@ADVANTAGE_ESTIMATORS.register("gae")
@torch.no_grad()
def gae(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """GAE(γ, λ) with a critic (Schulman et al. 2016, arXiv:1506.02438); PPO's estimator.

    δ_t = r_t + γ V_{t+1} − V_t,  A_t = δ_t + γλ A_{t+1} (backwards over the valid tokens,
    see ``gae_advantages_and_returns``), returns R_t = A_t + V_t (before whitening), then
    A ← whiten(A) over the batch's valid tokens (mean 0, unbiased std 1). Requires
    ``values_BT``. γ = ``cfg.gamma``, λ = ``cfg.lam``.
    """
    rewards, mask = rewards_and_mask("gae", inputs)
    values = require_input("gae", "values_BT", inputs.values_BT, tuple(rewards.shape))
    adv, returns = gae_advantages_and_returns(rewards, values, mask, cfg.gamma, cfg.lam)
    return AdvantageOutputs(advantages_BT=masked_whiten(adv, mask), returns_BT=returns)


@ADVANTAGE_ESTIMATORS.register("grpo")
@torch.no_grad()
def grpo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """Group-relative advantage (GRPO: Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    A_b = (s_b − mean_g) / (std_g + EPS), std unbiased; with
    ``cfg.norm_adv_by_std_in_grpo=False``, A_b = s_b − mean_g (Dr.GRPO: Liu et al. 2025,
    arXiv:2503.20783). A group with equal scores gets 0. Singleton: A_b = s_b.
    Broadcast to tokens; returns = advantages. Requires ``group_ids_B``.
    """
    rewards, mask = rewards_and_mask("grpo", inputs)
    group_ids = require_group_ids("grpo", inputs, rewards.shape[0])
    scores = sequence_scores(rewards, mask)
    stats = group_stats(scores, group_ids, mask.any(dim=-1))
    return sequence_outputs((scores - stats.mean_B) / std_scale(stats, cfg), mask)


@ADVANTAGE_ESTIMATORS.register("grpo_passk")
@torch.no_grad()
def grpo_passk(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """Best-of-group advantage for pass@k-style training (after Chen et al. 2025,
    "Pass@k Training", arXiv:2508.10751, which rewards a group by its best response).

    In each group only the best sample (the highest score; the first in batch order on a
    tie) gets a non-zero advantage, its margin over the runner-up:

        A_best = (max_g − second_max_g) / (std_g + EPS),   A_other = 0

    without the division when ``cfg.norm_adv_by_std_in_grpo`` is False. A tie for the
    best gives 0 to everyone. Singleton: second_max = 0 and scale 1, so A = s_b.
    This is the margin rule, not the paper's closed-form pass@k advantage.
    Broadcast to tokens; returns = advantages. Requires ``group_ids_B``.
    """
    rewards, mask = rewards_and_mask("grpo_passk", inputs)
    group_ids = require_group_ids("grpo_passk", inputs, rewards.shape[0])
    scores = sequence_scores(rewards, mask)
    valid = mask.any(dim=-1)
    stats = group_stats(scores, group_ids, valid)

    rows_B = torch.arange(scores.shape[0], device=scores.device)
    max_B = group_reduce(scores, stats, valid, "amax")
    is_max_B = valid & (scores == max_B)
    # The best sample: the first row (in batch order) that reaches the group's maximum.
    best_row_B = group_reduce(rows_B, stats, is_max_B, "amin")
    is_best_B = is_max_B & (rows_B == best_row_B)
    others_B = torch.where(is_best_B, torch.full_like(scores, -torch.inf), scores)
    runner_up_B = group_reduce(others_B, stats, valid, "amax")
    runner_up_B = torch.where(stats.is_singleton_B, torch.zeros_like(scores), runner_up_B)
    adv = torch.where(is_best_B, scores - runner_up_B, torch.zeros_like(scores))
    return sequence_outputs(adv / std_scale(stats, cfg), mask)


@ADVANTAGE_ESTIMATORS.register("rloo")
@torch.no_grad()
def rloo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740).

    A_b = s_b − (1/(n−1)) Σ_{j≠b} s_j = n/(n−1) · (s_b − mean_g).
    Singleton: no other sample, no baseline, A_b = s_b. No std division.
    Broadcast to tokens; returns = advantages. Requires ``group_ids_B``.
    """
    rewards, mask = rewards_and_mask("rloo", inputs)
    group_ids = require_group_ids("rloo", inputs, rewards.shape[0])
    scores = sequence_scores(rewards, mask)
    stats = group_stats(scores, group_ids, mask.any(dim=-1))
    n = stats.count_B
    factor = torch.where(stats.is_singleton_B, torch.ones_like(n), n / (n - 1).clamp(min=1))
    return sequence_outputs(factor * (scores - stats.mean_B), mask)


@ADVANTAGE_ESTIMATORS.register("remax")
@torch.no_grad()
def remax(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """ReMax (Li et al. 2023, arXiv:2310.10505): the greedy response's score as baseline.

    A_b = s_b − s_b^greedy, with s^greedy in ``baseline_rewards_B`` (required).
    Broadcast to tokens; returns = advantages.
    """
    rewards, mask = rewards_and_mask("remax", inputs)
    baseline = require_input(
        "remax", "baseline_rewards_B", inputs.baseline_rewards_B, (rewards.shape[0],)
    )
    scores = sequence_scores(rewards, mask)
    return sequence_outputs(scores - baseline.to(scores.dtype), mask)


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted returns, batch-whitened.

    G_t = r_t + γ G_{t+1} over the valid tokens (masked ones skipped, as in GAE),
    A = whiten(G) over the batch's valid tokens; returns = G. γ = ``cfg.gamma``.
    """
    rewards, mask = rewards_and_mask("reinforce_plus_plus", inputs)
    returns = discounted_returns(rewards, mask, cfg.gamma)
    return AdvantageOutputs(advantages_BT=masked_whiten(returns, mask), returns_BT=returns)


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262).

    A'_b = s_b − mean_g broadcast to tokens, then A = whiten(A') over the batch's valid
    tokens (global, not per-group, normalisation). Singleton: mean 0.
    Returns = advantages. Requires ``group_ids_B``.
    """
    rewards, mask = rewards_and_mask("reinforce_plus_plus_baseline", inputs)
    group_ids = require_group_ids("reinforce_plus_plus_baseline", inputs, rewards.shape[0])
    scores = sequence_scores(rewards, mask)
    stats = group_stats(scores, group_ids, mask.any(dim=-1))
    adv = masked_whiten(broadcast(scores - stats.mean_B, mask), mask)
    return AdvantageOutputs(advantages_BT=adv, returns_BT=adv.clone())


@ADVANTAGE_ESTIMATORS.register("opo")
@torch.no_grad()
def opo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, arXiv:2505.23585).

    The length-weighted group baseline b_g = Σ_i L_i s_i / Σ_i L_i, L_i the number of
    valid tokens of sample i; A_b = s_b − b_g (no std division). Singleton: b = 0, so
    A_b = s_b (the group convention; the formula itself would give 0).
    Broadcast to tokens; returns = advantages. Requires ``group_ids_B``.
    """
    rewards, mask = rewards_and_mask("opo", inputs)
    group_ids = require_group_ids("opo", inputs, rewards.shape[0])
    scores = sequence_scores(rewards, mask)
    stats = group_stats(scores, group_ids, mask.any(dim=-1))
    lengths = mask.sum(dim=-1).to(scores.dtype)
    zeros_G = scores.new_zeros(stats.num_groups)
    weighted_G = zeros_G.index_add(0, stats.index_B, lengths * scores)
    length_G = zeros_G.index_add(0, stats.index_B, lengths)
    baseline = (weighted_G / length_G.clamp(min=1))[stats.index_B]
    baseline = torch.where(stats.is_singleton_B, torch.zeros_like(baseline), baseline)
    return sequence_outputs(scores - baseline, mask)


@ADVANTAGE_ESTIMATORS.register("gpg")
@torch.no_grad()
def gpg(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """Group Policy Gradient (Chu et al. 2025, "GPG", arXiv:2504.02546).

    A_b = α (s_b − mean_g), divided by (std_g + EPS) only when
    ``cfg.norm_adv_by_std_in_grpo`` is True (the paper divides by 1: set it False to
    follow the paper). α = B / M corrects the gradient for samples that carry none: B is
    the number of samples (rows with a valid token) and M the number of them in groups
    whose scores are not all equal (a singleton counts as all equal); α = 1 when M = 0,
    and α ≤ B always. Singleton: mean 0, so A_b = α s_b.
    Broadcast to tokens; returns = advantages. Requires ``group_ids_B``.
    """
    rewards, mask = rewards_and_mask("gpg", inputs)
    group_ids = require_group_ids("gpg", inputs, rewards.shape[0])
    scores = sequence_scores(rewards, mask)
    valid = mask.any(dim=-1)
    stats = group_stats(scores, group_ids, valid)

    # A group is informative when its scores are not all equal: max > min.
    max_B = group_reduce(scores, stats, valid, "amax")
    min_B = group_reduce(scores, stats, valid, "amin")
    informative_B = valid & (max_B > min_B)

    num_samples = int(valid.sum())
    num_informative = int(informative_B.sum())
    alpha = num_samples / num_informative if num_informative > 0 else 1.0
    adv = alpha * (scores - stats.mean_B) / std_scale(stats, cfg)
    return sequence_outputs(adv, mask)


@ADVANTAGE_ESTIMATORS.register("gdpo")
@torch.no_grad()
def gdpo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """GDPO (Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy
    Optimization for Multi-reward RL Optimization", arXiv:2601.05242): normalise each
    reward component within its group before summing, then whiten the sum over the batch.

    With c_{b,k} the k-th reward component of sample b (``reward_components_BK``: the
    reward function's values for ``algorithm.gdpo_reward_keys``) and w_k its weight
    (``algorithm.gdpo_reward_weights``, 1 each when null)::

        A_{b,k} = (c_{b,k} − mean_g(c_k)) / (std_g(c_k) + EPS)    (GRPO, one component)
        A'_b    = Σ_k w_k A_{b,k}
        A       = whiten(A') over the batch's valid tokens

    without the division when ``cfg.norm_adv_by_std_in_grpo`` is False. GRPO on the
    summed reward gives a group (0,1), (1,1) and a group (0,0), (1,1) the same
    advantages, ±0.71; normalised per component, the second group's gap is twice the
    first's (±1.41 against ±0.71 before whitening). The whitening, token-weighted like
    ``reinforce_plus_plus``'s, keeps the scale from growing with K. A component equal
    across its group contributes 0; singleton: A_{b,k} = c_{b,k}. The sequence score
    s_b is not read (so neither is an in-reward KL penalty). Broadcast to tokens;
    returns = advantages. Requires ``group_ids_B`` and ``reward_components_BK``.
    """
    rewards, mask = rewards_and_mask("gdpo", inputs)
    batch = rewards.shape[0]
    ids = require_group_ids("gdpo", inputs, batch)
    components = inputs.reward_components_BK
    if components is None or components.dim() != 2 or components.shape[0] != batch:
        shape = None if components is None else tuple(components.shape)
        raise ValueError(
            f"advantage estimator 'gdpo' requires reward_components_BK of shape ({batch}, K),"
            f" got {shape}"
        )
    count = components.shape[1]
    weights = cfg.gdpo_reward_weights or [1.0] * count
    if len(weights) != count:
        raise ValueError(
            f"advantage estimator 'gdpo': {len(weights)} gdpo_reward_weights for {count}"
            " reward components"
        )
    valid = mask.any(dim=-1)
    components = torch.where(valid.unsqueeze(-1), components.to(rewards.dtype), 0.0)
    total = rewards.new_zeros(batch)
    for k, weight in enumerate(weights):
        stats = group_stats(components[:, k], ids, valid)
        total += weight * (components[:, k] - stats.mean_B) / std_scale(stats, cfg)
    adv = masked_whiten(broadcast(total, mask), mask)
    return AdvantageOutputs(advantages_BT=adv, returns_BT=adv.clone())
