"""Scorer of the shipped tool task (``engine.data.secret``): 1.0 when the response ends
with the row's secret, else 0.0.

The response is the whole trajectory, tool results included, so a scorer that took any
number in it would pay for the tool's answer itself: only the model's last words count.
A trajectory cut by a limit ends elsewhere (a tool call, a tool result) and scores 0.
"""

from __future__ import annotations

import re
from typing import Any

from engine.data.secret import DATA_SOURCE

__all__ = ["DATA_SOURCE", "compute_score"]

_FINAL_NUMBER = re.compile(r"(?:^|\s)(\d+)\s*$")


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    final = _FINAL_NUMBER.search(solution_str)
    if final is None:
        return {"score": 0.0, "acc": 0.0}
    right = final.group(1) == str(ground_truth).strip()
    return {"score": float(right), "acc": float(right), "pred": final.group(1)}
