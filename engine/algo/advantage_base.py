"""What every advantage estimator is built from: its inputs and outputs, the registry
the estimators are registered in, the input checks, and the group statistics they share.

The estimators are in ``engine.algo.advantage`` (which also states the notation and the
conventions every estimator follows, and runs the one a config names) and
``engine.algo.token_baseline`` (the optimal token baseline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.algo.masked import masked_sum
from engine.algo.registry import Registry

if TYPE_CHECKING:
    from engine.config import AlgorithmConfig

# Added to a group's standard deviation before dividing by it.
EPS = 1e-6


@dataclass
class AdvantageInputs:
    """What the advantage stage reads from a batch; all tensors on one device."""

    # float (B, T): reward per response token (score on the last valid token, any
    # in-reward KL penalty already subtracted per token).
    token_rewards_BT: torch.Tensor
    # float/bool (B, T): 1 for real response tokens (multi-turn: 0 for tool/env tokens).
    response_mask_BT: torch.Tensor
    # long (B,): samples of the same prompt share an id (group estimators require it).
    group_ids_B: torch.Tensor | None = None
    # float (B, T): critic values V(s_t) (GAE requires it).
    values_BT: torch.Tensor | None = None
    # float (B,): ReMax baseline, the score of the greedy response to the same prompt.
    baseline_rewards_B: torch.Tensor | None = None
    # float (B, K): GDPO's reward components, the reward function's value of each of
    # ``algorithm.gdpo_reward_keys`` for each sample.
    reward_components_BK: torch.Tensor | None = None
    # float (B, T): log π_old of each response token and Σ_v π_old(v)² at its position,
    # from the actor's π_old pass (the optimal token baseline requires both).
    old_logprobs_BT: torch.Tensor | None = None
    sum_pi_squared_BT: torch.Tensor | None = None
    # float (B, T): truncated importance weights against the rollout engine, or None.
    is_weights_BT: torch.Tensor | None = None


@dataclass
class AdvantageOutputs:
    advantages_BT: torch.Tensor  # (B, T), zero on masked tokens
    returns_BT: torch.Tensor  # (B, T), zero on masked tokens


AdvantageFn = Callable[[AdvantageInputs, "AlgorithmConfig"], AdvantageOutputs]
ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")


# ---------------------------------------------------------------------------
# input checks


def rewards_and_mask(name: str, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The rewards as a float tensor and the mask as a bool tensor, shapes checked."""
    rewards = inputs.token_rewards_BT
    mask = inputs.response_mask_BT
    if rewards.dim() != 2:
        raise ValueError(
            f"advantage estimator {name!r}: token_rewards_BT must be (B, T), got shape "
            f"{tuple(rewards.shape)}"
        )
    if mask.shape != rewards.shape:
        raise ValueError(
            f"advantage estimator {name!r}: response_mask_BT has shape {tuple(mask.shape)}, "
            f"token_rewards_BT has {tuple(rewards.shape)}; they must match"
        )
    if not rewards.is_floating_point():
        rewards = rewards.float()
    return rewards, mask.bool()


def require_input(
    name: str, field_name: str, value: torch.Tensor | None, shape: tuple[int, ...]
) -> torch.Tensor:
    """``value``, or a ValueError naming the estimator and the missing or mis-shaped input."""
    if value is None:
        raise ValueError(f"advantage estimator {name!r} requires {field_name}, got None")
    if tuple(value.shape) != shape:
        raise ValueError(
            f"advantage estimator {name!r}: {field_name} must have shape {shape}, "
            f"got {tuple(value.shape)}"
        )
    return value


def require_group_ids(name: str, inputs: AdvantageInputs, batch: int) -> torch.Tensor:
    return require_input(name, "group_ids_B", inputs.group_ids_B, (batch,))


# ---------------------------------------------------------------------------
# shared pieces


def sequence_scores(rewards_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """s_b = Σ_t m_t r_t, shape (B,)."""
    return masked_sum(rewards_BT, mask_BT, dim=-1)


def broadcast(adv_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """A_b on every valid token of row b, 0 elsewhere."""
    zero = torch.zeros((), dtype=adv_B.dtype, device=adv_B.device)
    return torch.where(mask_BT, adv_B.unsqueeze(-1), zero)


def sequence_outputs(adv_B: torch.Tensor, mask_BT: torch.Tensor) -> AdvantageOutputs:
    """Outputs of a sequence-level, critic-free estimator: returns equal advantages."""
    adv_BT = broadcast(adv_B, mask_BT)
    return AdvantageOutputs(advantages_BT=adv_BT, returns_BT=adv_BT.clone())


@dataclass
class GroupStats:
    """Statistics of each sample's group, gathered back per sample (all shape (B,)).

    Rows with no valid token are left out of every statistic (they are padding, not
    samples). ``mean_B`` and ``std_B`` follow the singleton convention: a group of one
    sample has mean 0 and std 1.
    """

    index_B: torch.Tensor  # long: the group's position in 0..G-1
    count_B: torch.Tensor  # float: n_g, the valid samples in the group
    mean_B: torch.Tensor  # mean_g (0 for a singleton)
    std_B: torch.Tensor  # unbiased std_g (1 for a singleton)
    is_singleton_B: torch.Tensor  # bool: n_g <= 1
    num_groups: int


def group_stats(
    scores_B: torch.Tensor, group_ids_B: torch.Tensor, valid_B: torch.Tensor
) -> GroupStats:
    """Per-group count, mean and unbiased std of ``scores_B`` over the ``valid_B`` rows."""
    _, index_B = torch.unique(group_ids_B, return_inverse=True)
    num_groups = int(index_B.max()) + 1 if index_B.numel() else 0
    weight_B = valid_B.to(scores_B.dtype)
    zeros_G = torch.zeros(num_groups, dtype=scores_B.dtype, device=scores_B.device)

    count_G = zeros_G.index_add(0, index_B, weight_B)
    sum_G = zeros_G.index_add(0, index_B, weight_B * scores_B)
    mean_G = sum_G / count_G.clamp(min=1)
    deviation_B = torch.where(valid_B, scores_B - mean_G[index_B], torch.zeros_like(scores_B))
    sq_G = zeros_G.index_add(0, index_B, deviation_B**2)
    std_G = (sq_G / (count_G - 1).clamp(min=1)).sqrt()

    singleton_G = count_G <= 1
    mean_G = torch.where(singleton_G, torch.zeros_like(mean_G), mean_G)
    std_G = torch.where(singleton_G, torch.ones_like(std_G), std_G)
    return GroupStats(
        index_B=index_B,
        count_B=count_G[index_B],
        mean_B=mean_G[index_B],
        std_B=std_G[index_B],
        is_singleton_B=singleton_G[index_B],
        num_groups=num_groups,
    )


def group_reduce(
    values_B: torch.Tensor, stats: GroupStats, include_B: torch.Tensor, reduce: str
) -> torch.Tensor:
    """``reduce`` ("amax", "amin") of ``values_B`` over the included rows of each group,
    gathered back per row; a group with no included row gives 0."""
    per_group = values_B.new_zeros(stats.num_groups).scatter_reduce(
        0, stats.index_B[include_B], values_B[include_B], reduce=reduce, include_self=False
    )
    return per_group[stats.index_B]


def std_scale(stats: GroupStats, cfg: AlgorithmConfig) -> torch.Tensor:
    """The divisor of group-normalised advantages: std_g + EPS, or 1.

    1 when ``cfg.norm_adv_by_std_in_grpo`` is False (Dr.GRPO) and, exactly, for a
    singleton group.
    """
    if not cfg.norm_adv_by_std_in_grpo:
        return torch.ones_like(stats.std_B)
    return torch.where(stats.is_singleton_B, torch.ones_like(stats.std_B), stats.std_B + EPS)
