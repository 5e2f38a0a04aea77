"""A warm start for the secret task (``engine.data.secret``): supervised fine-tuning of a
model on the task's transcripts (``engine.sft``), so that RL starts from a model that can
call the tool but seldom does.

A random tiny model never writes a well-formed tool call, so RL alone has nothing to
reward. Like an instruct model that has seen tools, the warm start teaches the call's
format and to answer with what the tool said, in two SFT runs:

1. on transcripts that all call the tool and copy its answer, until the copy is learned:
   it emerges suddenly, as a drop of the loss (after about 200 steps here, with the
   tool's answer repeated: ``engine.data.secret.REPEAT``), so the run ends when the loss
   says so (``run_sft``'s stop rule), up to ``max_copy_steps``;
2. ``mix_steps`` on transcripts of which only ``tool_fraction`` call the tool, the others
   guessing, from the first run's weights at a quarter of its learning rate: the model
   comes out calling the tool in about that fraction of its answers.

RL then has a behaviour to reinforce: the trajectories that called the tool are the ones
that scored. The transcripts are conversations in verl's SFT layout (a ``messages``
column, the tool's schema in ``tools``), tokenized by the chat template with the tool as
the rollout's prompts are, the loss on the model's turns only.

    python -m engine.warmup.secret --model runs/tool/base --out runs/tool/warm
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.data.secret import HIGH, LOW, QUESTIONS, TOOL, tool_answer, tool_schema

COPY_LOSS, COPY_WINDOW = 0.01, 20  # phase 1 ends when the mean loss of 20 steps is below
MIX_LR_SCALE = 0.25  # phase 2's learning rate, relative to phase 1's
CALL = f'<tool_call>{{"name": "{TOOL}", "arguments": {{}}}}</tool_call>'
REPEATS = 16  # each distinct transcript's copies in an epoch of phase 1


def transcript(question: str, secret: int, use_tool: bool, guess: int) -> list[dict[str, Any]]:
    """One episode as chat messages: the model calls the tool and copies its answer, or
    answers ``guess``."""
    ask = {"role": "user", "content": question}
    if not use_tool:
        return [ask, {"role": "assistant", "content": str(guess)}]
    return [
        ask,
        {"role": "assistant", "content": CALL},
        {"role": "tool", "name": TOOL, "content": tool_answer(str(secret))},
        {"role": "assistant", "content": str(secret)},
    ]


def write_transcripts(path: Path, tool_copies: int, guess_copies: int) -> Path:
    """A parquet file of every distinct transcript: those calling the tool ``tool_copies``
    times each, those guessing ``guess_copies`` times (the loader shuffles them)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    values = range(LOW, HIGH + 1)
    rows = [
        transcript(q, n, use_tool, n)
        for q in QUESTIONS
        for n in values
        for use_tool, copies in ((True, tool_copies), (False, guess_copies))
        for _ in range(copies)
    ]
    tools = json.dumps([tool_schema()])
    pq.write_table(pa.Table.from_pylist([{"messages": m, "tools": tools} for m in rows]), path)
    return path


class CopyLearned:
    """The stop rule of phase 1: the mean training loss of the last COPY_WINDOW steps
    below COPY_LOSS (an episode's guess from 10 costs ln(10) on one of its ~36 loss
    tokens, 0.06; copied, it falls near 0)."""

    def __init__(self) -> None:
        self.recent: list[float] = []
        self.at: int | None = None

    def __call__(self, step: int, metrics: dict[str, float]) -> bool:
        self.recent = [*self.recent[-(COPY_WINDOW - 1) :], metrics["train/loss"]]
        if step % 100 == 1:
            print(f"warm start: copy step {step} loss {self.recent[-1]:.4f}", flush=True)
        if len(self.recent) == COPY_WINDOW and sum(self.recent) / COPY_WINDOW < COPY_LOSS:
            self.at = step
        return self.at is not None


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
    """Fine-tune the model in ``model_dir`` (the two runs above) on one CPU worker; save
    it to ``out_dir``."""
    from engine.config.load import load
    from engine.config.sft import SFT
    from engine.sft.runtime import run_sft

    out = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
        work = Path(tmp)
        guesses = round(REPEATS * (1 - tool_fraction) / max(tool_fraction, 1e-9))
        files = {
            "copy": write_transcripts(work / "copy.parquet", REPEATS, 0),
            "mix": write_transcripts(work / "mix.parquet", REPEATS // 4, guesses // 4),
        }

        def run(phase: str, model: Path | str, steps: int, rate: float, export: Path, stop=None):
            overrides = [
                f"model.path={model}",
                f"data.train_files={files[phase]}",
                f"data.train_batch_size={batch_size}",
                "data.max_length=256",
                f"optim.lr={rate}",
                "optim.clip_grad=1e9",  # the rates here were found without clipping
                f"trainer.total_training_steps={steps}",
                f"trainer.default_local_dir={work / phase}",
                f"trainer.export_hf_dir={export}",
                "trainer.device=cpu",
                "trainer.n_gpus_per_node=1",
                "trainer.logger=[]",
                f"trainer.seed={seed}",
                "model.enable_gradient_checkpointing=false",
            ]
            run_sft(load(overrides, schema=SFT).config, stop)

        learned = CopyLearned()
        run("copy", model_dir, max_copy_steps, lr, work / "copied", learned)
        if learned.at is None:
            raise RuntimeError(
                f"the warm start did not learn to copy the tool's answer in {max_copy_steps}"
                " steps; raise --max-copy-steps or change --seed"
            )
        print(f"warm start: the copy is learned after {learned.at} steps", flush=True)
        run("mix", work / "copied", mix_steps, lr * MIX_LR_SCALE, out)
    print(f"warm start: then {mix_steps} steps calling the tool {tool_fraction:.0%} of the time")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engine.warmup.secret", description=__doc__.splitlines()[0]
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
