"""Scorer of the synthetic visual task (``engine.data.shapes``): which square is larger.

The colour the response starts with (after any spaces or punctuation, any case) is its
answer: 1.0 for the right colour, -1.0 for the other one, 0.0 for anything else. A model blind to the image names
each colour as often for either answer (they are half the rows each), so its expected
score is 0 whatever it learns; only reading the image lifts the mean above 0.
"""

from __future__ import annotations

import re
from typing import Any

from engine.data.shapes import COLOURS, DATA_SOURCE

__all__ = ["DATA_SOURCE", "compute_score"]

_LEADING_COLOUR = re.compile(r"[^A-Za-z]*(" + "|".join(COLOURS) + ")", re.IGNORECASE)


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    found = _LEADING_COLOUR.match(solution_str)
    if found is None:
        return {"score": 0.0, "acc": 0.0}
    colour = found.group(1).lower()
    right = colour == str(ground_truth)
    return {"score": 1.0 if right else -1.0, "acc": float(right), "pred": colour}
