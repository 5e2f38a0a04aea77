"""MATH (DigitalLearningGmbH/MATH-lighteval): competition problems with LaTeX solutions.

The ground truth is the content of the solution's last ``\\boxed{...}``.
"""

from __future__ import annotations

from typing import Any

from engine.data.sources import Source

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
_MACROS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed x``) in ``text``.

    Braces are matched, so nested groups stay whole; escaped braces (``\\{``) do not
    count. None when there is no such box or its braces are unbalanced.
    """
    start, macro = max((text.rfind(m), m) for m in _MACROS)
    if start < 0:
        return None
    i = start + len(macro)
    if text.startswith(" ", i):  # "\boxed 5": the box holds the next token
        token = text[i + 1 :].split("$", 1)[0].split()
        return token[0] if token else None
    if not text.startswith("{", i):
        return None
    depth = 0
    j = i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def make_row(raw: dict[str, Any], split: str, index: int) -> dict[str, Any] | None:
    problem, solution = str(raw["problem"]), str(raw["solution"])
    truth = last_boxed(solution)
    if truth is None:
        return None  # a few solutions state the answer without a box: skip them
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {
            "split": split,
            "index": index,
            "level": str(raw["level"]),
            "type": str(raw["type"]),
        },
    }


SOURCE = Source(
    hub_id=DATA_SOURCE,
    hub_config=None,
    splits={"train": "train", "val": "test"},
    columns=("problem", "solution", "level", "type"),
    local_subdirs=("data",),
    make_row=make_row,
)
