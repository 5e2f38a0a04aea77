"""GSM8K (openai/gsm8k, config "main"): grade-school word problems.

Each answer ends with ``#### <number>``; that number, without thousands separators,
is the ground truth. ``gsm8k_tools`` is the same data whose prompt also tells the model
it may run Python (a multi-turn rollout with the code interpreter, docs/agents.md).
``gsm8k_sft`` is it as conversations for supervised fine-tuning (``engine.sft``): the
question with the instruction, and the worked answer as the assistant's turn.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.data.errors import DataError
from engine.data.sources import Source

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
TOOL_INSTRUCTION = (
    "Let's think step by step. You can run Python code with the code_interpreter tool to"
    ' check your arithmetic. Output the final answer after "####".'
)


def final_answer(answer: str) -> str | None:
    """The number after the last ``####`` of a GSM8K answer, commas removed."""
    if "####" not in answer:
        return None
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def make_row(
    raw: dict[str, Any], split: str, index: int, instruction: str = INSTRUCTION
) -> dict[str, Any]:
    question, answer = str(raw["question"]), str(raw["answer"])
    truth = final_answer(answer)
    if not truth:
        raise DataError(f"gsm8k {split} row {index}: the answer has no '#### <number>' line")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {instruction}"}],
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


def make_tool_row(raw: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    return make_row(raw, split, index, TOOL_INSTRUCTION)


TOOLS_SOURCE = dataclasses.replace(SOURCE, make_row=make_tool_row)


def make_sft_row(raw: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """A conversation in verl's SFT layout (a ``messages`` column): the prompt the RL rows
    ask, answered with the dataset's own worked solution (its ``#### <number>`` line
    last, the format the RL reward reads)."""
    row = make_row(raw, split, index)
    answer = str(raw["answer"])
    return {
        "messages": [*row["prompt"], {"role": "assistant", "content": answer}],
        "data_source": DATA_SOURCE,
        "extra_info": row["extra_info"],
    }


SFT_SOURCE = dataclasses.replace(SOURCE, make_row=make_sft_row)
