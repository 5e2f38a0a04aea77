"""The one GRPO configuration every system runs, what a system reports per step, and
the files (tiny model, synthetic data) they share."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Setup:
    """The one GRPO configuration every system runs."""

    model_dir: str
    train_file: str
    steps: int = 8  # measured steps
    warmup: int = 2  # steps run first and not measured
    prompts: int = 8  # P prompts per step
    n: int = 8  # samples per prompt
    max_new_tokens: int = 32
    temperature: float = 1.0
    lr: float = 1e-5
    weight_decay: float = 0.01  # the engine's AdamW default; TRL is set to match
    grad_clip: float = 1.0
    threads: int = 2  # torch threads of the single-process systems
    gradient_checkpointing: bool = True  # the default of both the engine and TRL
    seed: int = 1
    vllm_path: str | None = None  # a vLLM build put first on PYTHONPATH (vLLM systems)

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    @property
    def samples(self) -> int:
        return self.prompts * self.n

    @property
    def max_model_len(self) -> int:
        """The vLLM engines' model length: the engine's default prompt budget
        (``data.max_prompt_length``) plus the completion."""
        from engine.config import DataConfig

        return DataConfig().max_prompt_length + self.max_new_tokens


@dataclasses.dataclass
class StepRecord:
    """What one system reports for one measured step."""

    seconds: float  # the step as the system times it
    tokens: int  # attention-mask sum of the step's sequences
    stages: dict[str, float] = dataclasses.field(default_factory=dict)
    response_length: float = 0.0  # mean completion tokens
    wall_s: float | None = None  # previous step's end to this one's, seen from outside
    other_cores: float | None = None  # CPU cores other processes kept busy meanwhile


def prepare(workdir: Path, steps: int, warmup: int, gradient_checkpointing: bool) -> Setup:
    """Build the tiny model and the synthetic data once, for all systems."""
    sys.path.insert(0, str(REPO))
    from transformers.utils import logging as hf_logging

    from engine.data.synthetic import write_synthetic_dataset
    from engine.models.tiny import build_tiny_model

    hf_logging.disable_progress_bar()
    model_dir = build_tiny_model(workdir / "model")
    # One epoch covers every step, so no system wraps around to a new epoch.
    train, _ = write_synthetic_dataset(
        workdir / "data", n_train=max(64, (warmup + steps) * Setup.prompts), n_val=8
    )
    return Setup(
        model_dir=str(model_dir),
        train_file=str(train),
        steps=steps,
        warmup=warmup,
        gradient_checkpointing=gradient_checkpointing,
    )


def load_prompts(setup: Setup) -> list[dict[str, Any]]:
    """The training rows in file order: the chat and the reference answer."""
    import pyarrow.parquet as pq

    rows = pq.read_table(setup.train_file).to_pylist()
    return [
        {"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows
    ]


def child_env(threads: int | None, vllm_path: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO)] + ([vllm_path] if vllm_path else []) + [env.get("PYTHONPATH", "")]
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        CUDA_VISIBLE_DEVICES="",  # CPU only, even where a GPU exists
        VLLM_LOGGING_LEVEL="WARNING",
        PYTHONPATH=os.pathsep.join(p for p in paths if p),
    )
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def write_child_result(out: Path, records: list[StepRecord]) -> None:
    out.write_text(json.dumps([dataclasses.asdict(r) for r in records]))


def read_child_result(out: Path, warmup: int) -> list[StepRecord]:
    return [StepRecord(**r) for r in json.loads(out.read_text())[warmup:]]
