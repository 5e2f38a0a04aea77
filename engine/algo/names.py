"""Names of every registered algorithm variant, importable without torch.

The typed config (``engine.config``) validates names against these tuples on a
machine without torch; the tests in ``tests/engine/algo/`` check that each
tuple equals the keys of the matching torch registry, so the two cannot drift.
"""

from dataclasses import dataclass

# the distillation loss over the teacher's top-k tokens (engine.config.distillation)
DISTILLATION_TOPK_MODE = "forward_kl_topk"


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an advantage estimator needs besides the rewards, declared with its name so
    that the config, the trainer and the planner ask for it instead of naming
    estimators."""

    values: bool = False  # a value function: a critic worker
    greedy_baseline: bool = False  # each prompt's greedy response, scored (ReMax)
    group: bool = False  # the other samples of the same prompt: rollout.n >= 2
    # the reward function's separate components (algorithm.gdpo_reward_keys), per sample
    reward_components: bool = False
    # π_old of each response token and Σ_v π_old(v)² at its position, from the actor's π_old
    # pass (the optimal token baseline): the pass runs every step, and computes Σπ² only then
    sum_pi_squared: bool = False


_GROUP = EstimatorNeeds(group=True)
ADVANTAGE_ESTIMATOR_NEEDS: dict[str, EstimatorNeeds] = {
    "gae": EstimatorNeeds(values=True),
    "grpo": _GROUP,
    "grpo_passk": _GROUP,
    "rloo": _GROUP,
    "remax": EstimatorNeeds(greedy_baseline=True),
    "reinforce_plus_plus": EstimatorNeeds(),
    "reinforce_plus_plus_baseline": _GROUP,
    "opo": _GROUP,
    "gpg": _GROUP,
    "gdpo": EstimatorNeeds(group=True, reward_components=True),
    "optimal_token_baseline": EstimatorNeeds(group=True, sum_pi_squared=True),
    "tir_optimal_token_baseline": EstimatorNeeds(group=True, sum_pi_squared=True),
}
ADVANTAGE_ESTIMATORS: tuple[str, ...] = tuple(ADVANTAGE_ESTIMATOR_NEEDS)
# Estimators whose baseline comes from the other samples of the same prompt.
GROUP_ADVANTAGE_ESTIMATORS: tuple[str, ...] = tuple(
    name for name, needs in ADVANTAGE_ESTIMATOR_NEEDS.items() if needs.group
)
# Estimators that need a value function (a critic worker).
CRITIC_ADVANTAGE_ESTIMATORS: tuple[str, ...] = tuple(
    name for name, needs in ADVANTAGE_ESTIMATOR_NEEDS.items() if needs.values
)


def estimator_needs(name: str) -> EstimatorNeeds:
    """What the estimator ``name`` needs (nothing special for an unknown name: the
    config's own check reports it)."""
    return ADVANTAGE_ESTIMATOR_NEEDS.get(name, EstimatorNeeds())


POLICY_LOSSES: tuple[str, ...] = (
    "vanilla",  # PPO clip (with clip-higher and dual-clip)
    "gspo",
    "gpg",
    "cispo",
    "clip_cov",
    "kl_cov",
    "geo_mean",  # GMPO
    "sapo",  # soft gate instead of the clip
    "dppo_tv",  # DPPO: binary total-variation trust region
    "dppo_kl",  # DPPO: binary KL trust region
)

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "token-sum",
)

# KL estimators. A "+" suffix (e.g. "low_var_kl+") is the straight-through
# variant: the value of the named estimator with the gradient of k2.
KL_ESTIMATORS: tuple[str, ...] = (
    "kl",  # k1
    "k1",
    "abs",
    "mse",  # k2
    "k2",
    "low_var_kl",  # k3, clamped
    "k3",
)

KL_CONTROLLERS: tuple[str, ...] = ("fixed", "adaptive")


def is_valid_kl_estimator(name: str) -> bool:
    """True for a known estimator, or a known estimator with the straight-through "+" suffix."""
    return name.removesuffix("+") in KL_ESTIMATORS
