"""What flows between the trainer and the reward code: typed requests and results."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.errors import EngineError

# A built-in scorer: (solution_str, ground_truth, extra_info) -> float or a dict holding
# "score" (and optionally "acc" and other numbers).
Scorer = Callable[[str, Any, Any], "float | Mapping[str, Any]"]

# A user's function: (data_source, solution_str, ground_truth, extra_info) -> the same.
CustomScorer = Callable[[str, str, Any, Any], "float | Mapping[str, Any]"]


class RewardError(EngineError):
    """The reward setup is wrong (unknown data source, a custom function that won't load)."""


@dataclass
class ScoreRequest:
    data_source: str
    response: str  # decoded response text (special tokens removed)
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    response_length: int = 0  # response tokens, for the overlong penalty


@dataclass
class ScoreResult:
    score: float  # the reward the algorithm uses (overlong penalty included)
    acc: float  # correctness in [0, 1] (equals score for plain 0/1 scorers)
    extras: dict[str, float] = field(default_factory=dict)  # other numbers, "overlong_penalty"
    error: str | None = None  # "timeout" or the exception text when the scorer failed (score 0)
    pred: str | None = None  # the extracted final answer, for majority voting in validation


def to_result(value: Any) -> ScoreResult:
    """Turn what a scorer returned (a number or a dict with "score") into a ``ScoreResult``.

    ``acc`` defaults to the score; ``pred`` (the extracted answer, for majority voting)
    is kept as a string. Other non-numeric extras are dropped. Raises ``TypeError``/``KeyError`` for a value of the wrong shape.
    """
    if isinstance(value, Mapping):
        if "score" not in value:
            raise KeyError(f"the reward function returned a dict without 'score': {value!r}")
        score = float(value["score"])
        acc = float(value["acc"]) if "acc" in value else score
        extras = {
            str(k): float(v)
            for k, v in value.items()
            if k not in ("score", "acc", "pred") and isinstance(v, numbers.Real)
        }
        pred = None if value.get("pred") is None else str(value["pred"])
        return ScoreResult(score=score, acc=acc, extras=extras, pred=pred)
    if isinstance(value, numbers.Real):
        return ScoreResult(score=float(value), acc=float(value))
    raise TypeError(
        f"the reward function returned {type(value).__name__}; expected a float or a dict "
        "with 'score'"
    )
