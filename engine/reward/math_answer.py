"""MATH-style answers: the last ``\\boxed{...}`` (or ``\\fbox{...}``), else DAPO's ``Answer: X``.

The extracted answer is compared with the ground truth by mathematical equivalence with
the ``math-verify`` library (``\\frac12`` = ``0.5`` = ``1/2``, sets and intervals in any
order, ``x^2+2x`` = ``2x+x^2``); when either side cannot be parsed, a normalised string
comparison decides. Score 1.0 when equivalent, else 0.0.
"""

from __future__ import annotations

import re
import threading
from typing import Any

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_LINE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``/``\\fbox{...}`` (nested braces kept), or
    of ``\\boxed X`` without braces; ``None`` if there is none or it is never closed."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start + 1 :]
    rest = rest[len("boxed") :] if rest.startswith("boxed") else rest[len("fbox") :]
    if rest.startswith(" "):  # \boxed 5
        token = rest.strip().split("$")[0].split()
        return token[0] if token else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


def last_answer_line(text: str) -> str | None:
    """The text after the last ``Answer:`` on its line (DAPO's format)."""
    matches = _ANSWER_LINE.findall(text)
    if not matches:
        return None
    answer = matches[-1].strip().rstrip(".").strip()
    if len(answer) > 1 and answer.startswith("$") and answer.endswith("$"):
        answer = answer.strip("$").strip()
    return answer or None


def extract_answer(solution_str: str) -> str | None:
    boxed = last_boxed(solution_str)
    return boxed if boxed is not None else last_answer_line(solution_str)


_STRIP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\displaystyle", "$", " ")


def normalize_answer(text: str) -> str:
    """A plain-string form for when ``math-verify`` cannot parse an answer."""
    text = str(text).strip()
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for token in _STRIP:
        text = text.replace(token, "")
    return text.rstrip(".").lower()


def _as_latex(text: str) -> str:
    return text if "$" in text or "\\boxed" in text else f"${text}$"


def is_equivalent(answer: str, ground_truth: str) -> bool:
    from math_verify import parse, verify

    # math-verify's own time limits use SIGALRM, which exists only in the main thread;
    # elsewhere run without them (the reward manager's per-sample timeout still applies).
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(_as_latex(ground_truth), parsing_timeout=limit)
    pred = parse(_as_latex(answer), parsing_timeout=limit)
    if gold and pred and verify(gold, pred, timeout_seconds=limit):
        return True
    return normalize_answer(answer) == normalize_answer(ground_truth)


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    answer = extract_answer(solution_str)
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "format": 0.0}
    truth = str(ground_truth)
    boxed_truth = last_boxed(truth)
    correct = is_equivalent(answer, boxed_truth if boxed_truth is not None else truth)
    value = 1.0 if correct else 0.0
    return {"score": value, "acc": value, "format": 1.0, "pred": normalize_answer(answer)}
