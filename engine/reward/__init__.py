"""Rule rewards: built-in scorers by data source, custom functions, and the batch manager.

from engine.reward import RewardManager, ScoreRequest
with RewardManager(cfg.reward_model, cfg.custom_reward_function, max_len) as rm:
    results = rm.score([ScoreRequest(data_source, text, truth, extra_info, n_tokens)])
"""

from engine.reward.custom import load_custom_function, load_from_config
from engine.reward.manager import RewardManager, overlong_penalty
from engine.reward.registry import get_scorer, known_data_sources, register_scorer
from engine.reward.types import RewardError, ScoreRequest, ScoreResult

__all__ = [
    "RewardError",
    "RewardManager",
    "ScoreRequest",
    "ScoreResult",
    "get_scorer",
    "known_data_sources",
    "load_custom_function",
    "load_from_config",
    "overlong_penalty",
    "register_scorer",
]
