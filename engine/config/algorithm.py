"""``algorithm``: the advantage estimator, the KL penalty in the reward and its
controller, DAPO's dynamic sampling (``filter_groups``) and the rollout correction
(``engine.algo``); with the rules on them, including what each estimator needs of the
rollout (``rollout.n``) and the critic."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.algo import names
from engine.algo.registry import unknown_name_message
from engine.config.fields import choice, one_of, setting

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")
ROLLOUT_IS_LEVELS = ("token", "sequence")

KL_ESTIMATOR_HELP = (
    f"{one_of(names.KL_ESTIMATORS)} (kl is k1, mse k2, low_var_kl k3 clamped); a '+'"
    " suffix keeps the value with k2's gradient."
)


@dataclass
class KLControlConfig:
    """β, the weight of the KL penalty in the reward (``use_kl_in_reward``)."""

    type: str = setting(
        "fixed", "fixed (β stays `kl_coef`) or adaptive (β steered to `target_kl`)."
    )
    kl_coef: float = setting(0.001, "β; the starting value for adaptive.")
    horizon: int = setting(
        10000, "adaptive: samples over which β moves by its error; larger is slower."
    )
    target_kl: float = setting(0.1, "adaptive: the KL the controller steers to.")


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling: keep only groups whose rewards differ."""

    enable: bool = setting(
        False, "Draw prompt batches until the step has enough groups whose rewards differ."
    )
    metric: str = setting(
        "acc",
        "What must differ in a group: acc (correctness), or score (the reward; seq_reward"
        " and seq_final_reward read it too).",
    )
    max_num_gen_batches: int = setting(
        10,
        "Most generation batches per step (groups with equal rewards fill a shortfall); 0: no cap.",
    )


@dataclass
class RolloutCorrectionConfig:
    """Truncated importance sampling against the rollout engine's own probabilities
    (engine.algo.rollout_correction); needs ``rollout.calculate_log_probs``."""

    rollout_is: str | None = setting(
        None,
        "Weigh each token by min(π_old / π_rollout, C): per token, per sequence (the"
        " product), or null (off).",
    )
    rollout_is_threshold: float = setting(2.0, "C, the cap on π_old / π_rollout.")
    bypass_mode: bool = setting(
        False,
        "Take the engine's own log-probs as π_old (two policies, verl's bypass mode): no"
        " π_old pass; PPO's clip bounds the ratio to the sampler. Needs"
        " rollout.calculate_log_probs; rollout_is stays null.",
    )


@dataclass
class AlgorithmConfig:
    """How rewards become advantages, and the KL penalty in the reward."""

    adv_estimator: str = setting(
        "gae",
        f"Advantage estimator: {one_of(names.ADVANTAGE_ESTIMATORS)} (gae needs the critic;"
        " group estimators rollout.n >= 2).",
    )
    gamma: float = setting(
        1.0, "Discount γ over response tokens, in [0, 1] (gae, reinforce_plus_plus)."
    )
    lam: float = setting(1.0, "GAE's λ, in [0, 1].")
    norm_adv_by_std_in_grpo: bool = setting(
        True, "Divide group advantages by the group's std (grpo, grpo_passk, gpg); false: Dr.GRPO."
    )
    use_kl_in_reward: bool = setting(
        False,
        "Subtract a KL-to-the-reference penalty (β: `kl_ctrl`) from the token rewards (PPO);"
        " loads the reference policy.",
    )
    kl_penalty: str = setting("kl", f"Estimator of that penalty: {KL_ESTIMATOR_HELP}")
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    gdpo_reward_keys: list[str] | None = setting(
        None,
        "gdpo: the reward components to normalise separately: keys of the dict the reward"
        " function returns (e.g. [accuracy_reward, format_reward]); required by gdpo.",
    )
    gdpo_reward_weights: list[float] | None = setting(
        None, "gdpo: the weight of each of `gdpo_reward_keys` in the sum; null: 1 each."
    )
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


def kl_estimator_problems(key: str, value: str) -> list[str]:
    """A KL estimator's name: a registered one, with or without the '+' suffix."""
    if names.is_valid_kl_estimator(value):
        return []
    return [
        f"{key}: {unknown_name_message('KL estimator', value, names.KL_ESTIMATORS)}; "
        "append '+' for the straight-through variant (e.g. 'low_var_kl+')"
    ]


def rules(cfg: EngineConfig) -> list[str]:
    algo = cfg.algorithm
    actor = cfg.actor_rollout_ref.actor
    rollout = cfg.actor_rollout_ref.rollout
    p = choice(
        algo.adv_estimator,
        names.ADVANTAGE_ESTIMATORS,
        "algorithm.adv_estimator",
        "advantage estimator",
    )
    p += kl_estimator_problems("algorithm.kl_penalty", algo.kl_penalty)
    p += choice(algo.kl_ctrl.type, names.KL_CONTROLLERS, "algorithm.kl_ctrl.type", "KL controller")
    p += choice(
        algo.filter_groups.metric, FILTER_METRICS, "algorithm.filter_groups.metric", "filter metric"
    )
    if algo.adv_estimator in names.GROUP_ADVANTAGE_ESTIMATORS and rollout.n < 2:
        p.append(
            f"algorithm.adv_estimator={algo.adv_estimator} compares samples of the same prompt:"
            f" set actor_rollout_ref.rollout.n >= 2 (got {rollout.n}); 8 or 16 are usual"
        )
    if algo.adv_estimator in names.CRITIC_ADVANTAGE_ESTIMATORS and cfg.critic.enable is False:
        p.append(
            f"algorithm.adv_estimator={algo.adv_estimator} needs a value function: set"
            " critic.enable=true (or null), or pick a critic-free estimator such as grpo"
        )
    p += _gdpo_rules(cfg)
    if names.estimator_needs(algo.adv_estimator).sum_pi_squared and (
        algo.rollout_correction.bypass_mode
    ):
        p.append(
            f"algorithm.adv_estimator={algo.adv_estimator} reads Σ_v π_old(v)² from the"
            " actor's π_old pass, which algorithm.rollout_correction.bypass_mode=true skips:"
            " set bypass_mode=false, or pick another estimator such as grpo"
        )
    if not 0.0 <= algo.gamma <= 1.0:
        p.append(f"algorithm.gamma must be in [0, 1], got {algo.gamma}")
    if not 0.0 <= algo.lam <= 1.0:
        p.append(f"algorithm.lam must be in [0, 1], got {algo.lam}")
    if algo.kl_ctrl.kl_coef < 0 or actor.kl_loss_coef < 0:
        p.append("KL coefficients (algorithm.kl_ctrl.kl_coef, actor.kl_loss_coef) must be >= 0")
    if algo.kl_ctrl.type == "adaptive" and (
        algo.kl_ctrl.target_kl <= 0 or algo.kl_ctrl.horizon < 1
    ):
        p.append(
            "algorithm.kl_ctrl.type=adaptive needs target_kl > 0 and horizon >= 1"
            f" (got {algo.kl_ctrl.target_kl}, {algo.kl_ctrl.horizon})"
        )
    if algo.filter_groups.enable and rollout.n < 2:
        p.append(
            "algorithm.filter_groups.enable=true keeps groups whose rewards differ: it needs"
            f" actor_rollout_ref.rollout.n >= 2 (got {rollout.n})"
        )
    if algo.filter_groups.max_num_gen_batches < 0:
        p.append("algorithm.filter_groups.max_num_gen_batches must be >= 0 (0: no cap)")
    return p + _rollout_correction_rules(cfg)


def _gdpo_rules(cfg: EngineConfig) -> list[str]:
    """The reward components of an estimator that normalises them separately (GDPO)."""
    algo = cfg.algorithm
    keys = list(algo.gdpo_reward_keys or [])
    weights = algo.gdpo_reward_weights
    p = []
    if weights is not None and len(weights) != len(keys):
        p.append(
            f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(keys)}"
            f" algorithm.gdpo_reward_keys: give one weight per key, or null for 1 each"
        )
    if weights is not None and not all(math.isfinite(w) for w in weights):
        p.append(f"algorithm.gdpo_reward_weights must be finite numbers, got {list(weights)}")
    if len(set(keys)) != len(keys):
        p.append(f"algorithm.gdpo_reward_keys names a key twice: {keys}")
    if not names.estimator_needs(algo.adv_estimator).reward_components:
        return p
    if not keys:
        p.append(
            f"algorithm.adv_estimator={algo.adv_estimator} normalises each reward component"
            " separately: list them in algorithm.gdpo_reward_keys, keys of the dict your"
            " reward function returns (e.g. algorithm.gdpo_reward_keys=[accuracy,format])"
        )
    if algo.use_kl_in_reward:
        p.append(
            f"algorithm.use_kl_in_reward=true has no effect with adv_estimator="
            f"{algo.adv_estimator}, which reads the reward components, not the penalised"
            " reward: set it false and use actor_rollout_ref.actor.use_kl_loss=true instead"
        )
    return p


def _rollout_correction_rules(cfg: EngineConfig) -> list[str]:
    rc = cfg.algorithm.rollout_correction
    p = []
    if rc.rollout_is is not None and rc.rollout_is not in ROLLOUT_IS_LEVELS:
        p.append(
            f"algorithm.rollout_correction.rollout_is {rc.rollout_is!r} is not a level;"
            f" valid: {', '.join(ROLLOUT_IS_LEVELS)}, or null (off)"
        )
    if rc.rollout_is is not None and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        p.append(
            f"algorithm.rollout_correction.rollout_is={rc.rollout_is} weighs tokens by the"
            " rollout engine's own probabilities: set"
            " actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    if rc.bypass_mode and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        p.append(
            "algorithm.rollout_correction.bypass_mode takes the rollout engine's own"
            " log-probs as π_old: set actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    if rc.bypass_mode and rc.rollout_is is not None:
        p.append(
            f"algorithm.rollout_correction.bypass_mode with rollout_is={rc.rollout_is}: in"
            " bypass mode π_old is the sampler's, so there is no second ratio to weigh;"
            " set rollout_is=null (PPO's clip bounds the ratio) or bypass_mode=false"
        )
    if not rc.rollout_is_threshold > 0:
        p.append(
            "algorithm.rollout_correction.rollout_is_threshold must be > 0 (the cap on"
            f" π_old / π_rollout; 2.0 is usual), got {rc.rollout_is_threshold}"
        )
    return p
