"""Scorer of the shipped synthetic task (``engine.data.synthetic``): small sums.

The response should be the sum alone (``"7"``). The score is shaped so that a randomly
initialised model, which rarely emits a digit at all, still sees rewards that differ
within a group of samples from the first step:

- 1.0 (acc 1.0): the response starts with the correct number (leading whitespace and
  text after the number are ignored);
- otherwise, when the response contains a number: partial credit for being close,
  ``CLOSE_WEIGHT * max(0, 1 - |first number - answer| / CLOSE_SCALE)``;
- 0.0 when the response contains no number.
"""

from __future__ import annotations

import re
from typing import Any

from engine.data.synthetic import DATA_SOURCE

__all__ = ["DATA_SOURCE", "compute_score"]

CLOSE_WEIGHT = 0.5
CLOSE_SCALE = 10.0

_LEADING_NUMBER = re.compile(r"\s*(-?\d+)")
_ANY_NUMBER = re.compile(r"-?\d+")


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    answer = int(str(ground_truth).strip())
    leading = _LEADING_NUMBER.match(solution_str)
    if leading is not None and int(leading.group(1)) == answer:
        return {"score": 1.0, "acc": 1.0, "close": 1.0}
    found = _ANY_NUMBER.search(solution_str)
    if found is None:
        return {"score": 0.0, "acc": 0.0, "close": 0.0}
    close = max(0.0, 1.0 - abs(int(found.group()) - answer) / CLOSE_SCALE)
    return {"score": CLOSE_WEIGHT * close, "acc": 0.0, "close": close}
