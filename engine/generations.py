"""Each step's samples on disk (``trainer.rollout_data_dir``, verl's key): one JSON line
per sample in ``<dir>/<step>.jsonl``, to read what the policy generated and how it was
scored, and which prompts each step trained on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.batch import Rollout


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
