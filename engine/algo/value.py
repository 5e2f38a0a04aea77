"""The critic's loss: PPO's clipped value loss.

The new value prediction may move at most ε = ``critic.cliprange_value`` from the value
recorded at rollout time, in the same spirit as the policy's ratio clip, and the loss
takes the worse (larger) of the clipped and unclipped squared errors so that clipping
never lowers the loss (the PPO reference implementation in OpenAI Baselines, as described
in Engstrom et al. 2020, "Implementation Matters in Deep Policy Gradients"):

    v_clip = v_old + clip(v − v_old, −ε, ε)
    l_t    = ½ · max((v − R)², (v_clip − R)²)

Where the clipped error is the larger one, v_clip is a constant in v and the token gives
no gradient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.algo.aggregate import LossScale, aggregate_loss
from engine.algo.masked import masked_mean

if TYPE_CHECKING:
    from engine.config import CriticConfig


def value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: CriticConfig,
    scale: LossScale | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss aggregated with ``cfg.loss_agg_mode``.

    ``loss_scale_factor`` is the constant of seq-mean-token-sum-norm (pass the maximum
    response length; default: the padded length). Metrics: ``critic/vf_loss`` (the loss;
    with a mini-batch ``scale``, this micro-batch's share), ``critic/vf_clipfrac`` (the
    fraction of valid tokens whose clipped error is strictly larger) and
    ``critic/vpred_mean`` (mean prediction over valid tokens).
    """
    eps = cfg.cliprange_value
    clipped_BT = old_values_BT + (values_BT - old_values_BT).clamp(-eps, eps)
    unclipped_sq_BT = (values_BT - returns_BT).square()
    clipped_sq_BT = (clipped_BT - returns_BT).square()
    loss_BT = 0.5 * torch.maximum(unclipped_sq_BT, clipped_sq_BT)
    loss = aggregate_loss(loss_BT, mask_BT, cfg.loss_agg_mode, scale, loss_scale_factor)
    with torch.no_grad():
        clipfrac = masked_mean((clipped_sq_BT > unclipped_sq_BT).float(), mask_BT)
        vpred_mean = masked_mean(values_BT, mask_BT)
    metrics = {
        "critic/vf_loss": float(loss.detach()),
        "critic/vf_clipfrac": float(clipfrac),
        "critic/vpred_mean": float(vpred_mean),
    }
    return loss, metrics
