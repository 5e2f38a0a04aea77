"""Scorer of Geometry3K (``engine.data.sources.geo3k``), as verl scores it: 0.9 for the
right answer in the last ``\\boxed{}`` (mathematical equivalence, ``engine.reward.
math_answer``) and 0.1 for the format, reasoning in ``<think>...</think>`` followed by a
boxed answer."""

from __future__ import annotations

import re
from typing import Any

from engine.reward import math_answer

FORMAT_WEIGHT = 0.1
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    answer = math_answer.compute_score(solution_str, ground_truth)
    formatted = float(_FORMAT.fullmatch(solution_str) is not None)
    score = (1.0 - FORMAT_WEIGHT) * answer["acc"] + FORMAT_WEIGHT * formatted
    return {**answer, "score": score, "format": formatted}
