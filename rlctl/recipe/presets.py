"""Algorithm presets: what ``algorithm: dapo`` in a recipe means in engine keys.

Each preset is data (dotted engine keys), applied before the recipe's own
``engine:`` overrides, so a recipe can change any of them. The settings follow the
papers and the configurations their authors published; ``docs/algorithms.md`` has
the formulas.

``sft`` is not an RL preset: a recipe with ``algorithm: sft`` runs supervised
fine-tuning (``python -m engine.sft``, docs/sft.md), and its ``engine:`` keys are verl's
SFT trainer's (``rlctl.recipe.sft``).
"""

from __future__ import annotations

from typing import Any

_NO_KL = {
    "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.actor.use_kl_loss": False,
}

PRESETS: dict[str, dict[str, Any]] = {
    # PPO with a critic and GAE (Ouyang et al. 2022 style RLHF recipe, rule rewards here).
    "ppo": {
        "algorithm.adv_estimator": "gae",
        "algorithm.gamma": 1.0,
        "algorithm.lam": 1.0,
        **_NO_KL,
    },
    # GRPO (DeepSeekMath): group baseline, KL to the reference as a loss term.
    "grpo": {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.use_kl_loss": True,
        "actor_rollout_ref.actor.kl_loss_coef": 0.001,
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "algorithm.use_kl_in_reward": False,
    },
    # Dr.GRPO: no std normalisation, constant length normaliser, no KL.
    "dr_grpo": {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": False,
        "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
        **_NO_KL,
    },
    # DAPO: clip-higher, token-mean, dynamic sampling, overlong shaping, no KL.
    # The overlong buffer's length is a fifth of the response budget unless the
    # recipe sets it (the paper: 4096 of 20480).
    "dapo": {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.rollout.n": 16,
        "actor_rollout_ref.actor.clip_ratio_low": 0.2,
        "actor_rollout_ref.actor.clip_ratio_high": 0.28,
        "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        "algorithm.filter_groups.enable": True,
        "algorithm.filter_groups.metric": "acc",
        "reward_model.reward_manager": "dapo",
        "reward_model.overlong_buffer.enable": True,
        "reward_model.overlong_buffer.penalty_factor": 1.0,
        **_NO_KL,
    },
    # GSPO: sequence-level ratio and its tiny clip range.
    "gspo": {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
        "actor_rollout_ref.actor.clip_ratio_low": 3e-4,
        "actor_rollout_ref.actor.clip_ratio_high": 4e-4,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
        **_NO_KL,
    },
    "rloo": {
        "algorithm.adv_estimator": "rloo",
        "actor_rollout_ref.rollout.n": 8,
        **_NO_KL,
    },
    "reinforce_pp": {
        "algorithm.adv_estimator": "reinforce_plus_plus",
        "algorithm.use_kl_in_reward": True,
        "algorithm.kl_penalty": "kl",
        "actor_rollout_ref.actor.use_kl_loss": False,
    },
    "reinforce_pp_baseline": {
        "algorithm.adv_estimator": "reinforce_plus_plus_baseline",
        "actor_rollout_ref.rollout.n": 8,
        **_NO_KL,
    },
    "remax": {
        "algorithm.adv_estimator": "remax",
        "actor_rollout_ref.rollout.n": 4,
        **_NO_KL,
    },
    "opo": {"algorithm.adv_estimator": "opo", "actor_rollout_ref.rollout.n": 8, **_NO_KL},
    "gpg": {
        "algorithm.adv_estimator": "gpg",
        "algorithm.norm_adv_by_std_in_grpo": False,
        "actor_rollout_ref.actor.policy_loss.loss_mode": "gpg",
        "actor_rollout_ref.rollout.n": 8,
        **_NO_KL,
    },
}

SFT = "sft"  # supervised fine-tuning: engine.sft's keys, not a preset of RL ones
ALGORITHMS = (*PRESETS, SFT)
