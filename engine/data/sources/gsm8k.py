"""GSM8K (openai/gsm8k, config "main"): grade-school word problems.

Each answer ends with ``#### <number>``; that number, without thousands separators,
is the ground truth.
"""

from __future__ import annotations

from typing import Any

from engine.data.dataset import DataError
from engine.data.sources import Source

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def final_answer(answer: str) -> str | None:
    """The number after the last ``####`` of a GSM8K answer, commas removed."""
    if "####" not in answer:
        return None
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def make_row(raw: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    question, answer = str(raw["question"]), str(raw["answer"])
    truth = final_answer(answer)
    if not truth:
        raise DataError(f"gsm8k {split} row {index}: the answer has no '#### <number>' line")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


SOURCE = Source(
    hub_id=DATA_SOURCE,
    hub_config="main",
    splits={"train": "train", "val": "test"},
    columns=("question", "answer"),
    local_subdirs=("main",),
    make_row=make_row,
)
