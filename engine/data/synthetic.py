"""The synthetic task that ships with the engine: small sums, generated, no download.

Prompts are one short line (``"Add 3 and 4."``); the answer is the number alone (``"7"``).
The data is written in verl's parquet layout so every part of the pipeline (dataset,
reward routing, validation) runs on it unchanged.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA_SOURCE = "synthetic/add"
ABILITY = "arithmetic"

# Operands are small so that the answers stay short and a tiny model can see every sum.
MAX_OPERAND = 4
_TEMPLATES = ("Add {a} and {b}.",)


def make_problem(rng: random.Random) -> tuple[str, str]:
    """One (question, answer) pair drawn with ``rng``."""
    a = rng.randint(0, MAX_OPERAND)
    b = rng.randint(0, MAX_OPERAND)
    template = _TEMPLATES[rng.randrange(len(_TEMPLATES))]
    return template.format(a=a, b=b), str(a + b)


def solve(question: str) -> str:
    """The answer to one of the task's questions, read back from its text."""
    a, b = (int(n) for n in re.findall(r"\d+", question))
    return str(a + b)


def make_rows(n: int, *, split: str, seed: int) -> list[dict[str, Any]]:
    """``n`` rows in verl's format, deterministic in (split, seed)."""
    rng = random.Random(f"{DATA_SOURCE}:{split}:{seed}")
    rows = []
    for index in range(n):
        question, answer = make_problem(rng)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def write_splits(
    out_dir: str | Path,
    rows_of: Callable[[int, str], list[dict[str, Any]]],
    n_train: int,
    n_val: int,
) -> tuple[Path, Path]:
    """``train.parquet`` and ``val.parquet`` under ``out_dir`` from ``rows_of(n, split)``
    (every task's writer: this one's, the chats', engine.data.shapes'); their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", n_train), ("val", n_val)):
        path = out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows_of(n, split)), path)
        paths.append(path)
    return paths[0], paths[1]


def write_synthetic_dataset(
    out_dir: str | Path, *, n_train: int = 2048, n_val: int = 256, seed: int = 0
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` under ``out_dir``; return their paths."""
    return write_splits(
        out_dir, lambda n, split: make_rows(n, split=split, seed=seed), n_train, n_val
    )


def sample_problems(n: int, *, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (question, answer) pairs, e.g. as text for training a tokenizer."""
    rng = random.Random(f"{DATA_SOURCE}:sample:{seed}")
    return [make_problem(rng) for _ in range(n)]


SYSTEM = "You add small numbers. Answer with the sum alone."


def make_chat_rows(n: int, *, split: str, seed: int, turns: int = 2) -> list[dict[str, Any]]:
    """``n`` conversations for supervised fine-tuning (verl's SFT layout: a ``messages``
    column): a system prompt, then ``turns`` sums asked and answered, deterministic in
    (split, seed)."""
    rng = random.Random(f"{DATA_SOURCE}:chat:{split}:{seed}")
    rows = []
    for _ in range(n):
        messages = [{"role": "system", "content": SYSTEM}]
        for _ in range(turns):
            question, answer = make_problem(rng)
            messages += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            ]
        rows.append({"messages": messages})
    return rows


def write_synthetic_chats(
    out_dir: str | Path, *, n_train: int = 512, n_val: int = 64, seed: int = 0, turns: int = 2
) -> tuple[Path, Path]:
    """Write the conversations' ``train.parquet`` and ``val.parquet`` under ``out_dir``."""
    return write_splits(
        out_dir,
        lambda n, split: make_chat_rows(n, split=split, seed=seed, turns=turns),
        n_train,
        n_val,
    )
