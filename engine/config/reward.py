"""``reward_model`` and ``custom_reward_function``: how responses are scored
(``engine.reward``): rule functions picked by each row's ``data_source``, or your own;
DAPO's overlong penalty; and the rules on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.config.fields import choice, positive, setting
from engine.config.train import ModelConfig

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

REWARD_MANAGERS = ("naive", "dapo")


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment over the last ``len`` tokens of the budget."""

    enable: bool = setting(False, "Add the overlong penalty to every sample's score.")
    len: int = setting(
        0,
        "The last tokens of the response budget (data.max_response_length), over which the"
        " penalty grows linearly to `penalty_factor`.",
    )
    penalty_factor: float = setting(
        1.0, "The penalty at (and beyond) data.max_response_length tokens."
    )


@dataclass
class RewardModelConfig:
    """Scoring: the processes that run the reward functions, and DAPO's overlong penalty."""

    enable: bool = setting(
        False,
        "verl's learned reward model; not implemented here: rewards come from rule functions.",
    )
    model: ModelConfig = field(default_factory=ModelConfig)
    reward_manager: str = setting(
        "naive", "naive or dapo (verl's names; the overlong penalty follows `overlong_buffer`)."
    )
    num_workers: int = setting(4, "Processes scoring samples in parallel.")
    timeout_s: float = setting(
        10.0, "Seconds one sample may take; a sample over it scores 0 (its worker is replaced)."
    )
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)


@dataclass
class CustomRewardFunctionConfig:
    """Your own scoring function, used for every row instead of the built-in ones."""

    path: str | None = setting(
        None, "A .py file defining the function; null: the built-in scorers."
    )
    name: str = setting(
        "compute_score",
        "The function in it: (data_source, solution_str, ground_truth, extra_info) -> float"
        " or dict.",
    )


def rules(cfg: EngineConfig) -> list[str]:
    rm = cfg.reward_model
    p = choice(rm.reward_manager, REWARD_MANAGERS, "reward_model.reward_manager", "reward manager")
    p += positive([("reward_model.num_workers", rm.num_workers)])
    if rm.timeout_s <= 0:
        p.append(f"reward_model.timeout_s must be > 0 seconds, got {rm.timeout_s}")
    ob = rm.overlong_buffer
    if ob.enable and not 0 < ob.len < cfg.data.max_response_length:
        p.append(
            f"reward_model.overlong_buffer.len {ob.len} must be in (0, data.max_response_length"
            f" = {cfg.data.max_response_length}): the penalty ramps over the last len tokens"
        )
    return p
