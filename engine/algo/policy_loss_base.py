"""What every policy loss is built from: its inputs and outputs, the registry the losses
are registered in, and the pieces they share (masking, the clamped log-ratio, PPO's
clipped surrogate, the metrics and the aggregation).

The losses themselves are in ``engine.algo.policy_loss`` (PPO and its relatives, the
covariance losses, GMPO) and ``engine.algo.trust_region`` (SAPO's soft gate, DPPO's
divergence masks); ``engine.algo.policy_loss.compute_policy_loss`` runs the one a config
names. Notation is the one ``engine.algo.policy_loss`` describes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.algo.aggregate import LossScale, aggregate_loss
from engine.algo.masked import masked_mean
from engine.algo.registry import Registry

if TYPE_CHECKING:
    from engine.config import ActorConfig

# |log π_θ − log π_old| beyond this is treated as this: exp(20) ≈ 4.9e8 is finite in
# float32 and bfloat16, and no clip range comes anywhere near it.
MAX_LOG_RATIO = 20.0

PG_CLIPFRAC = "actor/pg_clipfrac"
PG_CLIPFRAC_LOWER = "actor/pg_clipfrac_lower"
PPO_KL = "actor/ppo_kl"


@dataclass
class PolicyLossInputs:
    """One (micro-)batch of response tokens, all tensors of shape (B, T), right-padded."""

    logprobs_BT: torch.Tensor  # log π_θ(o_t) of the current policy (requires grad)
    old_logprobs_BT: torch.Tensor  # log π_old(o_t) at sampling time (no grad)
    advantages_BT: torch.Tensor
    response_mask_BT: torch.Tensor  # 1 for a response token, 0 for padding
    # Truncated importance weights w_t against the rollout engine (no grad), or None
    is_weights_BT: torch.Tensor | None = None


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor  # scalar, aggregated over ``scale``
    metrics: dict[str, float] = field(default_factory=dict)


PolicyLossFn = Callable[[PolicyLossInputs, "ActorConfig", "LossScale | None"], PolicyLossOutput]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def valid_tokens(inputs: PolicyLossInputs) -> torch.Tensor:
    """The response mask as booleans."""
    return inputs.response_mask_BT.bool()


def weighted_advantages(inputs: PolicyLossInputs) -> torch.Tensor:
    """A_t, 0 on padding (so a NaN there cannot reach a gradient through a product),
    times the token's importance weight w_t when TIS is on. Weighting the advantage is
    weighting the token's loss: A enters every loss as a factor of its policy-gradient
    term, and w_t ≥ 0 passes through the clip's min/max unchanged."""
    adv = inputs.advantages_BT
    if inputs.is_weights_BT is not None:
        adv = adv * inputs.is_weights_BT
    return torch.where(valid_tokens(inputs), adv, torch.zeros_like(adv))


def masked_logprobs(inputs: PolicyLossInputs) -> torch.Tensor:
    """log π_θ(o_t), 0 on padding."""
    logp = inputs.logprobs_BT
    return torch.where(valid_tokens(inputs), logp, torch.zeros_like(logp))


def clamped_log_ratio(inputs: PolicyLossInputs) -> torch.Tensor:
    """l_t, 0 on padding, clamped to ±MAX_LOG_RATIO."""
    diff = inputs.logprobs_BT - inputs.old_logprobs_BT
    diff = torch.where(valid_tokens(inputs), diff, torch.zeros_like(diff))
    return diff.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def fraction(flags_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """Fraction of the valid tokens where ``flags_BT`` holds (0 for no valid token)."""
    return float(masked_mean(flags_BT.float(), mask_BT))


def ppo_kl(inputs: PolicyLossInputs) -> float:
    """Approximate KL(π_old ‖ π_θ): the mean over valid tokens of log π_old − log π_θ."""
    with torch.no_grad():
        diff = inputs.old_logprobs_BT - inputs.logprobs_BT
        return float(masked_mean(diff, inputs.response_mask_BT))


def aggregate(
    loss_BT: torch.Tensor,
    inputs: PolicyLossInputs,
    cfg: ActorConfig,
    scale: LossScale | None,
    mode: str | None = None,
) -> torch.Tensor:
    """Reduce with ``mode`` (default ``cfg.loss_agg_mode``) over ``scale``."""
    return aggregate_loss(
        loss_BT,
        inputs.response_mask_BT,
        cfg.loss_agg_mode if mode is None else mode,
        scale,
        cfg.loss_scale_factor,
    )


@dataclass
class ClippedSurrogate:
    loss_BT: torch.Tensor
    clipped_BT: torch.Tensor  # the clipped term was the active one
    dual_clipped_BT: torch.Tensor  # dual-clip's bound was the active one


def clipped_surrogate(inputs: PolicyLossInputs, cfg: ActorConfig) -> ClippedSurrogate:
    """Per-token PPO loss with asymmetric clip and dual-clip (see ``vanilla``)."""
    adv = weighted_advantages(inputs)
    ratio = torch.exp(clamped_log_ratio(inputs))
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    surrogate = torch.maximum(unclipped, clipped)
    dual_bound = -adv * cfg.clip_ratio_c
    negative = adv < 0
    loss = torch.where(negative, torch.minimum(surrogate, dual_bound), surrogate)
    return ClippedSurrogate(
        loss_BT=loss,
        clipped_BT=clipped > unclipped,
        dual_clipped_BT=negative & (surrogate > dual_bound),
    )
