"""``algorithm``: the advantage estimator, the KL penalty in the reward and its
controller, DAPO's dynamic sampling (``filter_groups``) and the rollout correction
(``engine.algo``); with the rules on them, including what each estimator needs of the
rollout (``rollout.n``) and the critic."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.algo import names
from engine.algo.registry import unknown_name_message
from engine.algo.rollout_spec import IS_LEVELS, LOSS_TYPES, parse_is_threshold, parse_rejection
from engine.config import verl_trees
from engine.config.fields import choice, inert, one_of, setting, tree

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")
ROLLOUT_IS_LEVELS = IS_LEVELS

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
    max_inflight_gen_batches: int = inert(
        1, "verl's generation batches in flight at once; changes nothing here (one at a time)."
    )


@dataclass
class RolloutCorrectionConfig:
    """Importance weights and rejection against the rollout engine's own probabilities
    (engine.algo.rollout_correction, verl 0.9's keys); needs
    ``rollout.calculate_log_probs``."""

    rollout_is: str | None = setting(
        None,
        "Weigh each token by ρ = π_old / π_rollout: token (its own), sequence (the product"
        " over the response), or null (off).",
    )
    rollout_is_threshold: float | int | str = setting(
        2.0,
        "Bounds on the weights: a number C caps them at C (TIS), text 'L_U' such as"
        " '0.5_5.0' sets those outside [L, U] to 0 (IcePop). Quote 'L_U' and give both"
        " with a decimal point: YAML reads 0.5_5 as the number 0.55.",
    )
    rollout_is_batch_normalize: bool = setting(
        False,
        "Divide the weights by their batch mean (over tokens; over sequences at sequence"
        " level), after the bounds, so that they average 1.",
    )
    rollout_rs: str | None = setting(
        None,
        "Rejection sampling: comma-separated options LEVEL_kN (token_k1..3, seq_sum_k1..3,"
        " seq_mean_k1..3, seq_max_k2/k3; quote a list on the command line), each a"
        " divergence of π_old from π_rollout; tokens (or sequences) out of bounds leave the"
        " loss. null: off.",
    )
    rollout_rs_threshold: float | int | str | None = setting(
        None,
        "Bounds of rollout_rs, one for all options or one each (comma-separated): 'L_U' or"
        " U (then L = 1/U) on the ratio for k1 options, an upper bound for k2 and k3.",
    )
    bypass_mode: bool = setting(
        False,
        "Take the engine's own log-probs as π_old (two policies, verl's bypass mode): no"
        " π_old pass; ρ = π_θ / π_rollout in the loss. Needs rollout.calculate_log_probs.",
    )
    loss_type: str = setting(
        "ppo_clip",
        "Bypass mode's loss: ppo_clip (the policy loss, its ratio to the sampler; no"
        " rollout_is) or reinforce (−w·A·log π_θ, w the rollout_is weight of π_θ / π_rollout,"
        " no clip).",
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
    use_pf_ppo: bool = inert(
        False,
        "verl's policy-filtration PPO (samples reweighted by reward); not in this engine"
        " (true is refused).",
    )
    pf_ppo: dict[str, Any] = tree(verl_trees.PF_PPO, "Its reweighting; changes nothing here.")


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
    key = "algorithm.rollout_correction"
    p = []
    if rc.rollout_is is not None and rc.rollout_is not in IS_LEVELS:
        p.append(
            f"{key}.rollout_is {rc.rollout_is!r} is not a level;"
            f" valid: {', '.join(IS_LEVELS)}, or null (off)"
        )
    needs_engine = [f"rollout_is={rc.rollout_is}"] if rc.rollout_is is not None else []
    needs_engine += [f"rollout_rs={rc.rollout_rs}"] if rc.rollout_rs is not None else []
    needs_engine += ["bypass_mode=true"] if rc.bypass_mode else []
    if needs_engine and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        p.append(
            f"{key}.{' and '.join(needs_engine)} need the rollout engine's own log-probs:"
            " set actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    try:
        parse_is_threshold(rc.rollout_is_threshold)
    except ValueError as exc:
        p.append(
            f"{key}.rollout_is_threshold: {exc}; give a number C (TIS's cap, 2.0 is usual)"
            " or 'L_U' (IcePop's range, e.g. '0.5_5.0')"
        )
    if rc.rollout_is_batch_normalize and rc.rollout_is is None:
        p.append(
            f"{key}.rollout_is_batch_normalize=true normalises the importance weights, which"
            " are off: set rollout_is=token or sequence, or rollout_is_batch_normalize=false"
        )
    p += _rejection_rules(rc, key)
    p += _bypass_rules(cfg, key)
    return p


def _rejection_rules(rc: RolloutCorrectionConfig, key: str) -> list[str]:
    if rc.rollout_rs is None:
        if rc.rollout_rs_threshold is None:
            return []
        return [
            f"{key}.rollout_rs_threshold={rc.rollout_rs_threshold} has no effect without"
            " rejection sampling: set rollout_rs (e.g. token_k1) or rollout_rs_threshold=null"
        ]
    try:
        parse_rejection(rc.rollout_rs, rc.rollout_rs_threshold)
    except ValueError as exc:
        return [
            f"{key}.rollout_rs={rc.rollout_rs} with rollout_rs_threshold="
            f"{rc.rollout_rs_threshold}: {exc}; e.g. rollout_rs=token_k1"
            " rollout_rs_threshold='0.5_2.0', or rollout_rs=seq_mean_k3 rollout_rs_threshold=0.01"
        ]
    return []


def _bypass_rules(cfg: EngineConfig, key: str) -> list[str]:
    rc = cfg.algorithm.rollout_correction
    p = []
    if rc.loss_type not in LOSS_TYPES:
        p.append(f"{key}.loss_type {rc.loss_type!r} is not one; valid: {', '.join(LOSS_TYPES)}")
    elif rc.loss_type == "reinforce" and not rc.bypass_mode:
        p.append(
            f"{key}.loss_type=reinforce is bypass mode's loss: set bypass_mode=true, or"
            " loss_type=ppo_clip (decoupled mode's loss is policy_loss.loss_mode)"
        )
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if rc.bypass_mode and rc.loss_type == "reinforce" and loss_mode not in ("vanilla", "gpg"):
        p.append(
            f"{key}.loss_type=reinforce replaces the policy loss with −w·A·log π, so"
            f" actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} would be ignored:"
            " leave loss_mode=vanilla, or use loss_type=ppo_clip"
        )
    return p


def group_notes(cfg: EngineConfig) -> list[str]:
    """A group estimator with one sample per prompt runs (as in verl: each group is a
    singleton, whose advantage is its own score), which is seldom what was meant."""
    algo, n = cfg.algorithm, cfg.actor_rollout_ref.rollout.n
    if algo.adv_estimator in names.GROUP_ADVANTAGE_ESTIMATORS and n < 2:
        return [
            f"algorithm.adv_estimator={algo.adv_estimator} compares samples of the same"
            f" prompt, but actor_rollout_ref.rollout.n={n}: each group is one sample, whose"
            " advantage is its own score (verl's convention); 8 or 16 samples are usual"
        ]
    return []


def rollout_correction_notes(cfg: EngineConfig) -> list[str]:
    """What a run is told about its rollout correction: settings verl accepts that act
    differently from how they read (``engine.config.notes``)."""
    rc = cfg.algorithm.rollout_correction
    key = "algorithm.rollout_correction"
    notes = []
    if rc.bypass_mode and rc.loss_type == "ppo_clip" and rc.rollout_is is not None:
        notes.append(
            f"{key}.rollout_is={rc.rollout_is} applies no weights under bypass_mode with"
            " loss_type=ppo_clip (as in verl): π_old is the sampler's, so PPO's ratio already"
            " is π_θ / π_rollout; use loss_type=reinforce for explicit weights"
        )
    if rc.bypass_mode and rc.rollout_is_batch_normalize and rc.loss_type == "reinforce":
        notes.append(
            f"{key}.rollout_is_batch_normalize=true in bypass mode normalises the weights of"
            " each micro-batch (as in verl): they exist only inside the update there"
        )
    return notes
