"""Load a user's reward function from a ``.py`` file (``custom_reward_function.path/name``).

The function is called as ``fn(data_source, solution_str, ground_truth, extra_info)`` and
returns a float or a dict with ``"score"`` (and optionally ``"acc"`` and other numbers).
When set, it scores every data source; the built-in registry is not consulted.
"""

from __future__ import annotations

from pathlib import Path

from engine.config.reward import CustomRewardFunctionConfig
from engine.reward.types import CustomScorer, RewardError
from engine.user_code import UserCodeError, load_user_callable


def load_custom_function(
    path: str | Path,
    name: str,
    *,
    path_key: str = "custom_reward_function.path",
    name_key: str = "custom_reward_function.name",
    what: str = "function",
) -> CustomScorer:
    """Import ``path`` as a module and return its callable ``name`` (``engine.user_code``);
    a failure is a ``RewardError`` naming the key."""
    try:
        return load_user_callable(path, name, path_key=path_key, name_key=name_key, what=what)
    except UserCodeError as exc:
        raise RewardError(str(exc)) from exc.__cause__


def load_from_config(cfg: CustomRewardFunctionConfig) -> CustomScorer | None:
    """The configured function, or ``None`` when ``custom_reward_function.path`` is unset."""
    if not cfg.path:
        return None
    return load_custom_function(cfg.path, cfg.name)
