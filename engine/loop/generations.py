"""Each step's samples on disk (``trainer.rollout_data_dir``, verl's key; validation's in
``trainer.validation_data_dir``): one JSON line per sample in ``<dir>/<step>.jsonl``, to
read what the policy generated and how it was scored, and which prompts each step trained
on; and the few validation samples ``trainer.log_val_generations`` shows in the loggers."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.loop.batch import Rollout


def write_generations(folder: str, step: int, rollout: Rollout, tokenizer: Any) -> Path:
    path = Path(folder) / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    inputs = tokenizer.batch_decode(rollout.prompt_ids, skip_special_tokens=True)
    outputs = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
    index = rollout.prompt_index or [None] * len(rollout)
    lines = [
        json.dumps(
            {
                "step": step,
                "index": index[i],
                "input": inputs[i],
                "output": outputs[i],
                "gts": rollout.meta.ground_truth[i],
                "score": float(rollout.scores_B[i]),
            },
            default=str,
        )
        for i in range(len(rollout))
    ]
    tmp = path.with_suffix(".jsonl.tmp")  # whole or absent: a reader never sees half a step
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def generation_rows(rollout: Rollout, tokenizer: Any) -> list[dict[str, Any]]:
    """Each sample's prompt and response as text, and its score."""
    inputs = tokenizer.batch_decode(rollout.prompt_ids, skip_special_tokens=True)
    outputs = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
    scores = rollout.scores_B.tolist()
    return [
        {"input": i, "output": o, "score": float(s)}
        for i, o, s in zip(inputs, outputs, scores, strict=True)
    ]


def pick_samples(rows: list[dict[str, Any]], count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` of the rows, the same prompts at every validation (as verl chooses them:
    sorted by prompt, then shuffled with a fixed seed), so that a reader follows how the
    answers to those prompts change."""
    ordered = sorted(rows, key=lambda r: (r["input"], r["output"]))
    random.Random(seed).shuffle(ordered)
    return ordered[:count]
