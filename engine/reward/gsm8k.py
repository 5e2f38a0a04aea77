"""GSM8K: the final answer is a number written after ``####``.

Two ways of reading the response's answer:

- ``strict`` (the default): the response must contain ``#### <number>``; the last one counts.
- ``flexible``: the last number anywhere in the response.

Numbers are normalised before comparing (``$``, thousands commas and a trailing ``.``
removed; ``72.0`` equals ``72``). The ground truth may be the bare number or GSM8K's
full worked answer ending in ``#### <number>``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

_NUMBER = r"-?\$?\s*[0-9][0-9,]*(?:\.[0-9]+)?\.?"
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY_NUMBER = re.compile(_NUMBER)


def normalize_number(text: str) -> str:
    """``"$1,234."`` -> ``"1234"``; ``"72.50"`` -> ``"72.5"``; other text only stripped."""
    cleaned = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return cleaned
    if value == value.to_integral_value():
        return str(value.quantize(Decimal(1)))
    return format(value.normalize(), "f")


def extract_answer(solution_str: str, method: str = "strict") -> str | None:
    """The response's final answer, normalised, or ``None`` when there is none."""
    if method == "strict":
        matches = _STRICT.findall(solution_str)
    elif method == "flexible":
        matches = _ANY_NUMBER.findall(solution_str)
    else:
        raise ValueError(f"unknown gsm8k extraction method {method!r}: use strict or flexible")
    if not matches:
        return None
    return normalize_number(matches[-1])


def ground_truth_answer(ground_truth: Any) -> str:
    text = str(ground_truth)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return normalize_number(text)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, Any]:
    """``score`` for the right answer, ``format_score`` for a wrong one in the expected
    format, 0 when no answer can be read."""
    answer = extract_answer(solution_str, method)
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "format": 0.0}
    correct = answer == ground_truth_answer(ground_truth)
    return {
        "score": score if correct else format_score,
        "acc": 1.0 if correct else 0.0,
        "format": 1.0,
        "pred": answer,
    }
