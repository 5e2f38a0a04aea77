"""A warm start for the shapes task (``engine.data.shapes``): the answer's format, not
the answer.

A random tiny model writes ``red`` or ``blue`` first in about one response in a
thousand, so RL on the task's score (which pays only a colour) would have nothing to
reinforce. Like an instruct model that answers in the words asked for, the warm start
teaches the format: a few supervised steps on the task's prompts, each answered by a
colour drawn at random, independent of its image. The model comes out starting nearly
every answer with one of the two colours, about as often with either, whatever the
image: its score is still 0 on average (engine.reward.shapes), and only RL that reads
the image can raise it. The steps run the engine's own image path (``RLDataset`` with
the model's processor, ``TokenBatch`` with its images, the training forward).

    python -m engine.warmup.shapes MODEL_DIR [--steps 30]   # in place
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from engine.data.shapes import COLOURS, write_shapes_dataset

STEPS = 30
BATCH = 32
LR = 2e-3


def warm_start(
    model_dir: str | Path, *, steps: int = STEPS, batch: int = BATCH, lr: float = LR, seed: int = 0
) -> Path:
    """Train the model in ``model_dir`` (a vision-language model, its processor's parts
    beside it) on the answer format, and save its weights there; return the folder."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    from engine.config import DataConfig
    from engine.data.dataset import RLDataset
    from engine.models.processor import load_vision_processor
    from engine.train.forward import response_logprobs
    from engine.types import TokenBatch

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    processor = load_vision_processor(model_dir, tokenizer, AutoConfig.from_pretrained(model_dir))
    with tempfile.TemporaryDirectory() as tmp:
        train, _ = write_shapes_dataset(tmp, n_train=4 * batch, n_val=2, seed=seed + 1)
        data = RLDataset(train, tokenizer, DataConfig(), processor=processor)
        prompts = [data[i] for i in range(len(data))]
    answers = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in COLOURS]
    rng = random.Random(f"shapes_warmup:{seed}")
    cpu = torch.device("cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        for _ in range(steps):
            rows = rng.sample(prompts, batch)
            responses = [[*rng.choice(answers), tokenizer.eos_token_id] for _ in rows]
            tokens = TokenBatch.from_ragged(
                [r.prompt_ids for r in rows],
                responses,
                tokenizer.pad_token_id,
                images=[r.images for r in rows],
            )
            logprobs, _ = response_logprobs(model, tokens, cpu)
            mask = tokens.response_mask_BR
            loss = -(logprobs * mask).sum() / mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    model.save_pretrained(model_dir, safe_serialization=True)
    return Path(model_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engine.warmup.shapes",
        description="Warm a vision-language model up on the shapes task's answer format.",
    )
    parser.add_argument("model_dir", help="the model's folder, rewritten in place")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(warm_start(args.model_dir, steps=args.steps, seed=args.seed))


if __name__ == "__main__":
    main()
