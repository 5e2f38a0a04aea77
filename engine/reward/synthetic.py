"""Scorer of the shipped synthetic task (``engine.data.synthetic``): small sums.

The response should start with the sum (``"7"``). With ``close = max(0, 1 - |n - answer| /
CLOSE_SCALE)`` for a number ``n``:

- 1.0 (acc 1.0): the response starts with the right number (leading whitespace and any
  text after the number are ignored);
- ``LEADING_WEIGHT * close`` when it starts with a wrong number;
- ``LATER_WEIGHT * close`` for the first number when the response does not start with one;
- 0.0 when the response holds no number.

The partial credit is what lets a randomly initialised model learn: it seldom writes a
digit at all, but a group of 8 samples of 8 tokens often holds one that does, so rewards
differ within groups from the first step, and each tier (a number somewhere, a number
first, a close number first, the right one) pays more than the one before.
"""

from __future__ import annotations

import re
from typing import Any

from engine.data.synthetic import DATA_SOURCE

__all__ = ["DATA_SOURCE", "compute_score"]

LEADING_WEIGHT = 0.5
LATER_WEIGHT = 0.25
CLOSE_SCALE = 10.0

_LEADING_NUMBER = re.compile(r"\s*(-?\d+)")
_ANY_NUMBER = re.compile(r"-?\d+")


def _closeness(value: int, answer: int) -> float:
    return max(0.0, 1.0 - abs(value - answer) / CLOSE_SCALE)


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    answer = int(str(ground_truth).strip())
    leading = _LEADING_NUMBER.match(solution_str)
    if leading is not None:
        value = int(leading.group(1))
        if value == answer:
            return {"score": 1.0, "acc": 1.0, "close": 1.0, "leading": 1.0, "pred": str(value)}
        close = _closeness(value, answer)
        return {
            "score": LEADING_WEIGHT * close,
            "acc": 0.0,
            "close": close,
            "leading": 1.0,
            "pred": str(value),
        }
    found = _ANY_NUMBER.search(solution_str)
    if found is None:
        return {"score": 0.0, "acc": 0.0, "close": 0.0, "leading": 0.0}
    close = _closeness(int(found.group()), answer)
    return {"score": LATER_WEIGHT * close, "acc": 0.0, "close": close, "leading": 0.0}
