"""KL divergence to the reference policy: estimators, controllers, and its two uses.

Per-token estimators of KL(π‖π_ref) from samples of π (Schulman, "Approximating KL
divergence", 2020). With the log-ratio d = log π(y_t) − log π_ref(y_t) and
r = π_ref/π = exp(−d):

=========================  ==========================  ================================
name (aliases)             per token                   property
=========================  ==========================  ================================
k1 (kl)                    d                           unbiased, high variance, can be < 0
abs                        |d|                         biased, ≥ 0
k2 (mse)                   ½ d²                        biased, low variance, ≥ 0
k3 (low_var_kl)            r − 1 − log r               unbiased, low variance, ≥ 0 (clamped)
=========================  ==========================  ================================

A "+" suffix (``"low_var_kl+"``) is the straight-through variant: the value of the named
estimator, the gradient of k2. k2's per-sample gradient d·∇log π is an unbiased estimate
of ∇KL for on-policy samples, whereas differentiating k1 gives ∇log π alone, whose
expectation is 0, and k3's gradient (1 − r)·∇log π estimates ∇KL(π_ref‖π), the other
direction.

The KL is used in one of two places:

* **in the reward** (PPO, Ziegler et al. 2019): ``apply_kl_in_reward`` subtracts β·KL
  from the token rewards before advantages are computed; β comes from a controller
  (``fixed`` or ``adaptive``).
* **as a loss** (GRPO): ``kl_loss`` adds ``kl_loss_coef`` × aggregated KL to the actor's
  loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from engine.algo.aggregate import LossScale, aggregate_loss
from engine.algo.masked import masked_mean
from engine.algo.registry import Registry, UnknownNameError, unknown_name_message

if TYPE_CHECKING:
    from engine.config import ActorConfig, KLControlConfig

# ---------------------------------------------------------------------------
# estimators

# fn(logprobs_BT, ref_logprobs_BT) -> kl_BT
KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")

STRAIGHT_THROUGH_SUFFIX = "+"

# k3 = exp(−d) − 1 + d. exp(−d) overflows float32 (and bf16) for d below about −88,
# so the log-ratio is clamped first; and k3 grows exponentially in −d, so a single token
# whose reference probability dwarfs the policy's would dominate the batch's KL and its
# gradient (the estimator's variance is unbounded for large ratios): the value is
# clamped too. Tokens outside the clamps get no gradient from k3.
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


@KL_ESTIMATORS.register("kl", "k1")
def kl_k1(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor) -> torch.Tensor:
    """k1 = d: the plain log-ratio."""
    return logprobs_BT - ref_logprobs_BT


@KL_ESTIMATORS.register("abs")
def kl_abs(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor) -> torch.Tensor:
    """|d|."""
    return (logprobs_BT - ref_logprobs_BT).abs()


@KL_ESTIMATORS.register("mse", "k2")
def kl_k2(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor) -> torch.Tensor:
    """k2 = ½ d²."""
    return 0.5 * (logprobs_BT - ref_logprobs_BT).square()


@KL_ESTIMATORS.register("low_var_kl", "k3")
def kl_k3(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor) -> torch.Tensor:
    """k3 = exp(−d) − 1 + d, with d and the result clamped (see the constants)."""
    d = (logprobs_BT - ref_logprobs_BT).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(-d) - 1.0 + d).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)


def kl_penalty(name: str, logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate ``name`` (optionally with the straight-through "+" suffix)."""
    base = name.removesuffix(STRAIGHT_THROUGH_SUFFIX)
    if base not in KL_ESTIMATORS:
        raise UnknownNameError(
            unknown_name_message("KL estimator", name, KL_ESTIMATORS.names())
            + f"; append {STRAIGHT_THROUGH_SUFFIX!r} for the straight-through variant"
            " (e.g. 'low_var_kl+')"
        )
    estimate = KL_ESTIMATORS.get(base)(logprobs_BT, ref_logprobs_BT)
    if base == name:
        return estimate
    # Forward: the named estimator. Backward: k2's gradient, d.
    k2 = kl_k2(logprobs_BT, ref_logprobs_BT)
    return k2 + (estimate - k2).detach()


# ---------------------------------------------------------------------------
# controllers (β of the in-reward penalty)


class KLController:
    """Holds β. The trainer calls ``update`` once per step with the KL it measured."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    @classmethod
    def from_config(cls, cfg: KLControlConfig) -> KLController:
        raise NotImplementedError

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust β after a step that saw ``current_kl`` over ``n_steps`` samples."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.value = float(state["value"])


KL_CONTROLLERS: Registry[type[KLController]] = Registry("KL controller")


@KL_CONTROLLERS.register("fixed")
class FixedKLController(KLController):
    """β stays at ``kl_coef``."""

    @classmethod
    def from_config(cls, cfg: KLControlConfig) -> FixedKLController:
        return cls(cfg.kl_coef)


# The adaptive controller's proportional error is clipped to ±this (Ziegler et al.).
ADAPTIVE_KL_ERROR_CLIP = 0.2


@KL_CONTROLLERS.register("adaptive")
class AdaptiveKLController(KLController):
    """Proportional controller steering the KL to ``target_kl`` (Ziegler et al. 2019, §2.2).

    e = clip(KL / target − 1, −0.2, 0.2);  β ← β · (1 + e · n_steps / horizon)
    """

    def __init__(self, kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0 or horizon < 1:
            raise ValueError(
                f"adaptive KL controller needs target_kl > 0 and horizon >= 1,"
                f" got {target_kl} and {horizon}"
            )
        super().__init__(kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = int(horizon)

    @classmethod
    def from_config(cls, cfg: KLControlConfig) -> AdaptiveKLController:
        return cls(cfg.kl_coef, cfg.target_kl, cfg.horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = current_kl / self.target_kl - 1.0
        error = min(max(error, -ADAPTIVE_KL_ERROR_CLIP), ADAPTIVE_KL_ERROR_CLIP)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(cfg: KLControlConfig) -> KLController:
    """The controller named by ``algorithm.kl_ctrl.type``."""
    return KL_CONTROLLERS.get(cfg.type).from_config(cfg)


# ---------------------------------------------------------------------------
# the two uses


def apply_kl_in_reward(
    token_scores_BT: torch.Tensor,
    logprobs_BT: torch.Tensor,
    ref_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    controller: KLController,
    estimator_name: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token rewards = scores − β·KL, with KL zero on padding (padding is left unchanged).

    Metrics: ``actor/reward_kl_penalty`` is the current KL: the mean, over the sequences
    with at least one valid token, of each sequence's mean per-token KL;
    ``actor/reward_kl_penalty_coeff`` is the β used. The controller is not updated here:
    the trainer calls ``controller.update(metrics["actor/reward_kl_penalty"], batch_size)``.
    """
    with torch.no_grad():
        valid_BT = mask_BT.bool()
        kl_BT = kl_penalty(estimator_name, logprobs_BT, ref_logprobs_BT)
        kl_BT = torch.where(valid_BT, kl_BT, torch.zeros_like(kl_BT))
        beta = controller.value
        token_rewards_BT = token_scores_BT - beta * kl_BT
        seq_kl_B = masked_mean(kl_BT, mask_BT, dim=-1)
        current_kl = masked_mean(seq_kl_B, valid_BT.any(dim=-1))
    metrics = {
        "actor/reward_kl_penalty": float(current_kl),
        "actor/reward_kl_penalty_coeff": beta,
    }
    return token_rewards_BT, metrics


def kl_loss(
    logprobs_BT: torch.Tensor,
    ref_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: ActorConfig,
    scale: LossScale | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor's KL loss term: ``kl_loss_coef`` × KL aggregated like the policy loss.

    The returned loss already carries the coefficient (add it to the policy loss as is);
    the metric ``actor/kl_loss`` is the KL before the coefficient, ``actor/kl_coef`` the
    coefficient. With a ``scale`` of the whole mini-batch, both are this micro-batch's
    share: they sum over micro-batches to the mini-batch's value.
    """
    kl_BT = kl_penalty(cfg.kl_loss_type, logprobs_BT, ref_logprobs_BT)
    kl = aggregate_loss(kl_BT, mask_BT, cfg.loss_agg_mode, scale, cfg.loss_scale_factor)
    metrics = {"actor/kl_loss": float(kl.detach()), "actor/kl_coef": cfg.kl_loss_coef}
    return cfg.kl_loss_coef * kl, metrics
