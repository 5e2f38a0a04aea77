"""A warm start for the secret task (``engine.data.secret``): supervised fine-tuning of a
model on the task's transcripts, so that RL starts from a model that can call the tool but
seldom does.

A random tiny model never writes a well-formed tool call, so RL alone has nothing to
reward. Like an instruct model that has seen tools, the warm start teaches the call's
format and to answer with what the tool said, in two phases:

1. transcripts that all call the tool and copy its answer, until the copy is learned:
   it emerges suddenly, as a drop of the loss (after about 200 steps here, with the
   tool's answer repeated: ``engine.data.secret.REPEAT``), so the phase runs until the
   loss says so, up to ``max_copy_steps``;
2. ``mix_steps`` on transcripts of which only ``tool_fraction`` call the tool, the others
   guessing: the model comes out calling the tool in about that fraction of its answers.

RL then has a behaviour to reinforce: the trajectories that called the tool are the ones
that scored. The transcripts are tokenized as the rollout builds trajectories (the
prompt through the chat template with the tool, the tool's answer through
``ChatFormat.continuation_ids``), and only the model's turns carry the loss.

    python -m engine.data.secret_warmup --model runs/tool/base --out runs/tool/warm
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from engine.data.secret import HIGH, LOW, QUESTIONS, TOOL, tool_answer, tool_schema

IGNORE = -100  # the label of a token that carries no loss
COPY_LOSS, COPY_WINDOW = 0.01, 20  # phase 1 ends when the mean loss of 20 steps is below
MIX_LR_SCALE = 0.25  # phase 2's learning rate, relative to phase 1's
CALL = f'<tool_call>{{"name": "{TOOL}", "arguments": {{}}}}</tool_call>'


class Transcripts:
    """Episodes of the task as token ids and labels: the model calls the tool and copies
    its answer, or guesses. The few distinct prompts and tool replies are rendered once."""

    def __init__(self, chat) -> None:
        self.chat = chat
        end = chat.tokenizer.eos_token
        self.call = self._encode(CALL + end)
        self.prompts = [chat.prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
        self.replies = {
            n: chat.continuation_ids(
                [{"role": "tool", "name": TOOL, "content": tool_answer(str(n))}]
            )
            for n in range(LOW, HIGH + 1)
        }
        self.answers = {n: self._encode(f"{n}{end}") for n in range(LOW, HIGH + 1)}

    def _encode(self, text: str) -> list[int]:
        return list(self.chat.tokenizer.encode(text, add_special_tokens=False))

    def sample(self, rng: random.Random, use_tool: bool) -> tuple[list[int], list[int]]:
        """(token ids, labels): only the model's turns carry the loss."""
        prompt = self.prompts[rng.randrange(len(self.prompts))]
        secret = rng.randint(LOW, HIGH)
        ids, labels = list(prompt), [IGNORE] * len(prompt)
        if use_tool:
            reply = self.replies[secret]
            ids += self.call + reply
            labels += self.call + [IGNORE] * len(reply)
            answer = self.answers[secret]
        else:
            answer = self.answers[rng.randint(LOW, HIGH)]
        return ids + answer, labels + answer


def warm_start(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    max_copy_steps: int = 1000,
    mix_steps: int = 60,
    tool_fraction: float = 0.2,
    batch_size: int = 16,
    lr: float = 2e-3,
    seed: int = 0,
) -> Path:
    """Fine-tune the model in ``model_dir`` (phases above); save it to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.agents.chat import ChatFormat

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    transcripts = Transcripts(ChatFormat(tokenizer, [tool_schema()]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()

    def step(fraction: float) -> float:
        batch = [transcripts.sample(rng, rng.random() < fraction) for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((batch_size, width), tokenizer.pad_token_id)
        labels = torch.full((batch_size, width), IGNORE)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        for row, (tokens, targets) in enumerate(batch):
            ids[row, : len(tokens)] = torch.tensor(tokens)
            labels[row, : len(targets)] = torch.tensor(targets)
            attention[row, : len(tokens)] = 1
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    # Phase 1 until the copy is learned: the loss of an episode whose answer is a guess
    # from 10 is ln(10) on one of its ~36 tokens (0.06); copied, it falls near 0.
    recent: list[float] = []
    for n in range(max_copy_steps):
        recent = [*recent[-(COPY_WINDOW - 1) :], step(1.0)]
        if n % 100 == 0:
            print(f"warm start: copy step {n} loss {recent[-1]:.4f}", flush=True)
        if len(recent) == COPY_WINDOW and sum(recent) / COPY_WINDOW < COPY_LOSS:
            print(f"warm start: the copy is learned after {n + 1} steps", flush=True)
            break
    else:
        raise RuntimeError(
            f"the warm start did not learn to copy the tool's answer in {max_copy_steps}"
            " steps; raise --max-copy-steps or change --seed"
        )
    for group in optimizer.param_groups:  # gently: the copy must survive the guesses
        group["lr"] = lr * MIX_LR_SCALE
    for _ in range(mix_steps):
        step(tool_fraction)
    print(f"warm start: then {mix_steps} steps calling the tool {tool_fraction:.0%} of the time")
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engine.data.secret_warmup", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="the model to start from")
    parser.add_argument("--out", required=True, metavar="DIR", help="where to save it")
    parser.add_argument("--max-copy-steps", type=int, default=1000)
    parser.add_argument("--mix-steps", type=int, default=60)
    parser.add_argument("--tool-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    warm_start(
        args.model,
        args.out,
        max_copy_steps=args.max_copy_steps,
        mix_steps=args.mix_steps,
        tool_fraction=args.tool_fraction,
        seed=args.seed,
    )


if __name__ == "__main__":
    main()
