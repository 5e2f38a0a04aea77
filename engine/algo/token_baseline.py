"""The optimal token baseline (OTB): a baseline for every token position instead of one
per sequence (registered in ``ADVANTAGE_ESTIMATORS``; notation and conventions as in
``engine.algo.advantage``).

Li et al. 2026, "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL"
(arXiv:2602.07078). The variance-minimising baseline of a policy-gradient term weighs
each sample by the squared norm of its gradient. For the log-probability of token o_t
that norm, taken with respect to the logits, is ‖e_{o_t} − π‖² = 1 − 2π(o_t) + Σ_v π(v)²
(the Logit-Gradient Proxy: forward-pass probabilities only), and a token's update carries
the gradients of every token before it, so the weight of sample i at position t is the
accumulated

    w_{i,j} = 1 − 2 π_old(o_j) + Σ_v π_old(v)²          (× ρ_j² with rollout TIS weights ρ)
    W_{i,t} = Σ_{j ≤ t} m_j w_{i,j}

and, with G_{i,t} = Σ_{t' ≥ t} m_{t'} r_{t'} the reward-to-go, the baseline and advantage
of each token of a group are

    B_t = Σ_i W_{i,t} G_{i,t} / (Σ_i W_{i,t} + 1e-8)    (over the group's samples still
                                                          running at t)
    A_{i,t} = G_{i,t} − B_t,    returns = G.

Samples whose generation so far was uncertain (large W) count more in the baseline.
Where every W is equal, B_t is the plain group mean of G_t.

Zero tail (verl's ``handle_zero_tail``, always on there and here): where one sample is
longer than every other of its group, its positions past the second-longest length have
only itself in the sum, so B_t would equal its own G_t and its advantage 0; its baseline
there is set to 0 instead (A = G). A singleton group has baseline 0 (A = G).

The two registered forms differ only in which tokens of a group are compared:
``optimal_token_baseline`` compares position t of every sample; the multi-turn form
``tir_optimal_token_baseline`` compares the k-th valid token of every sample, so tool and
environment tokens (masked) do not shift a sample's tokens against the others'. With no
masked token inside a response the two are equal.

Inputs: π_old(o_t) as ``old_logprobs_BT``, Σ_v π_old(v)² as ``sum_pi_squared_BT`` (both from
the actor's π_old pass; ``engine.algo.entropy.sum_squared_probs_from_logits`` computes the
second from the logits) and, optionally, ``is_weights_BT``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.algo.advantage_base import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageOutputs,
    group_reduce,
    group_stats,
    require_group_ids,
    require_input,
    rewards_and_mask,
)

if TYPE_CHECKING:
    from engine.config import AlgorithmConfig

# Added to Σ_i W_{i,t} before dividing by it.
OTB_EPS = 1e-8


@ADVANTAGE_ESTIMATORS.register("optimal_token_baseline")
@torch.no_grad()
def optimal_token_baseline(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """OTB (Li et al. 2026): A_{i,t} = G_{i,t} − B_t, with B_t the W-weighted mean of the
    group's rewards-to-go at position t (see the module docstring). Requires
    ``group_ids_B``, ``old_logprobs_BT`` and ``sum_pi_squared_BT``; uses ``is_weights_BT``
    when given."""
    return _optimal_token_baseline("optimal_token_baseline", inputs, by_valid_token=False)


@ADVANTAGE_ESTIMATORS.register("tir_optimal_token_baseline")
@torch.no_grad()
def tir_optimal_token_baseline(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """OTB for tool-integrated (multi-turn) responses: as ``optimal_token_baseline``, but
    the baseline of a sample's k-th valid token is computed over the k-th valid tokens
    of its group, so masked tool tokens do not misalign the samples."""
    return _optimal_token_baseline("tir_optimal_token_baseline", inputs, by_valid_token=True)


def _optimal_token_baseline(
    name: str, inputs: AdvantageInputs, by_valid_token: bool
) -> AdvantageOutputs:
    rewards, mask = rewards_and_mask(name, inputs)
    batch, length = rewards.shape
    ids = require_group_ids(name, inputs, batch)
    old_logprobs = require_input(name, "old_logprobs_BT", inputs.old_logprobs_BT, (batch, length))
    sum_sq = require_input(name, "sum_pi_squared_BT", inputs.sum_pi_squared_BT, (batch, length))
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)

    # G_t: the valid rewards from t on; 0 on masked tokens.
    valid_rewards = torch.where(mask, rewards, zero)
    returns = torch.where(mask, valid_rewards.flip(-1).cumsum(-1).flip(-1), zero)

    # W_t: the accumulated squared logit-gradient norms up to t.
    weight = 1.0 - 2.0 * torch.exp(old_logprobs.to(rewards.dtype)) + sum_sq.to(rewards.dtype)
    if inputs.is_weights_BT is not None:
        weight = weight * inputs.is_weights_BT.to(rewards.dtype) ** 2
    cumulative = torch.where(mask, weight, zero).cumsum(-1)

    # Which tokens of a group share a baseline: the same position, or the same valid index.
    if by_valid_token:
        position = (mask.long().cumsum(-1) - 1).clamp(min=0)
    else:
        position = torch.arange(length, device=rewards.device).expand(batch, length)
    valid_B = mask.any(dim=-1)
    stats = group_stats(torch.zeros_like(rewards[:, 0]), ids, valid_B)
    slot = stats.index_B.unsqueeze(-1) * length + position  # (group, position) as one index
    sums = rewards.new_zeros(stats.num_groups * length)
    weighted = sums.index_add(0, slot[mask], (cumulative * returns)[mask])
    total = sums.index_add(0, slot[mask], cumulative[mask])
    baseline = (weighted / (total + OTB_EPS))[slot]

    # No baseline for a singleton, nor past the second-longest sample of a group for its
    # one longest sample.
    lengths = mask.sum(dim=-1).to(rewards.dtype)
    longest = group_reduce(lengths, stats, valid_B, "amax")
    is_longest = valid_B & (lengths == longest)
    longest_count = rewards.new_zeros(stats.num_groups).index_add(
        0, stats.index_B, is_longest.to(rewards.dtype)
    )[stats.index_B]
    second = group_reduce(lengths, stats, valid_B & ~is_longest, "amax")
    alone = is_longest & (longest_count == 1)
    tail = alone.unsqueeze(-1) & (position >= second.unsqueeze(-1))
    no_baseline = stats.is_singleton_B.unsqueeze(-1) | tail
    baseline = torch.where(no_baseline, zero, baseline)

    advantages = torch.where(mask, returns - baseline, zero)
    return AdvantageOutputs(advantages_BT=advantages, returns_BT=returns)
