"""Names of every registered algorithm variant, importable without torch.

The typed config (``engine.config``) validates names against these tuples on a
machine without torch; the tests in ``tests/engine/algo/`` check that each
tuple equals the keys of the matching torch registry, so the two cannot drift.
"""

ADVANTAGE_ESTIMATORS: tuple[str, ...] = (
    "gae",
    "grpo",
    "grpo_passk",
    "rloo",
    "remax",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "opo",
    "gpg",
)

# Estimators whose baseline comes from the other samples of the same prompt:
# they need rollout.n >= 2 to mean anything.
GROUP_ADVANTAGE_ESTIMATORS: tuple[str, ...] = (
    "grpo",
    "grpo_passk",
    "rloo",
    "reinforce_plus_plus_baseline",
    "opo",
    "gpg",
)

# Estimators that need a value function (a critic worker).
CRITIC_ADVANTAGE_ESTIMATORS: tuple[str, ...] = ("gae",)

POLICY_LOSSES: tuple[str, ...] = (
    "vanilla",  # PPO clip (with clip-higher and dual-clip)
    "gspo",
    "gpg",
    "cispo",
    "clip_cov",
    "kl_cov",
    "geo_mean",  # GMPO
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
