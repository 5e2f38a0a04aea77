"""Which built-in scorer scores which ``data_source``."""

from __future__ import annotations

from engine.reward import countdown, geo3k, gsm8k, math_answer, secret, shapes, synthetic
from engine.reward.types import RewardError, Scorer

_SCORERS: dict[str, Scorer] = {}


def register_scorer(scorer: Scorer, *data_sources: str) -> None:
    for source in data_sources:
        if source in _SCORERS and _SCORERS[source] is not scorer:
            raise ValueError(f"data source {source!r} already has a scorer")
        _SCORERS[source] = scorer


register_scorer(gsm8k.compute_score, "openai/gsm8k", "gsm8k")
register_scorer(
    math_answer.compute_score,
    "DigitalLearningGmbH/MATH-lighteval",
    "lighteval/MATH",
    "math",
    "HuggingFaceH4/MATH-500",
    "math_dapo",
    "BytedTsinghua-SIA/DAPO-Math-17k",
)
register_scorer(countdown.compute_score, "countdown", "Jiayi-Pan/Countdown-Tasks-3to4")
register_scorer(synthetic.compute_score, synthetic.DATA_SOURCE)
register_scorer(secret.compute_score, secret.DATA_SOURCE)
register_scorer(shapes.compute_score, shapes.DATA_SOURCE)
register_scorer(geo3k.compute_score, "hiyouga/geometry3k")


def known_data_sources() -> list[str]:
    return sorted(_SCORERS)


def get_scorer(data_source: str) -> Scorer:
    try:
        return _SCORERS[data_source]
    except KeyError:
        known = ", ".join(known_data_sources())
        raise RewardError(
            f"no built-in reward function for data_source {data_source!r} (built-in: {known}). "
            "To score it, write a function (data_source, solution_str, ground_truth, "
            "extra_info) -> float in a .py file and set custom_reward_function.path=FILE "
            "(and custom_reward_function.name=FUNCTION if it is not compute_score)."
        ) from None
