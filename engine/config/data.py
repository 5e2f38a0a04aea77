"""``data``: the prompt files, their columns, lengths in tokens and batch sizes in
prompts (read by ``engine.data``), and the rules on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config.fields import as_list, choice, positive, setting

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

TRUNCATION_MODES = ("error", "left", "right", "middle")


@dataclass
class DataConfig:
    """The prompts: parquet or jsonl files of chat messages, one prompt a row, with the
    columns ``data_source`` (which reward function scores it), ``ability`` and
    ``reward_model`` (its ground truth); lengths count tokens, batch sizes prompts."""

    train_files: Any = setting(
        help="Training prompts: a parquet or jsonl file, or a list of them (required).",
        factory=list,
        kind="path or list of paths",
    )
    val_files: Any = setting(
        help="Validation prompts, in the same format; empty: no validation.",
        factory=list,
        kind="path or list of paths",
    )
    prompt_key: str = setting("prompt", "Column holding each row's prompt as chat messages.")
    reward_fn_key: str = setting(
        "data_source",
        "verl's column naming each row's reward function; kept for its recipes: the engine"
        " always reads `data_source`.",
    )
    max_prompt_length: int = setting(
        512,
        "Longest prompt in tokens, after the chat template; longer ones follow"
        " `truncation` or `filter_overlong_prompts`.",
    )
    max_response_length: int = setting(512, "Most tokens generated per response.")
    train_batch_size: int = setting(
        1024, "Prompts per training step (each sampled `rollout.n` times)."
    )
    val_batch_size: int | None = setting(
        None, "Prompts per validation generation call; null: the whole validation set."
    )
    truncation: str = setting(
        "error",
        "Prompts over `max_prompt_length`: error, or cut them at the left (keep the end),"
        " right (keep the start) or middle.",
    )
    filter_overlong_prompts: bool = setting(
        False, "Drop prompts over `max_prompt_length` instead (before any truncation)."
    )
    shuffle: bool = setting(True, "Shuffle the training prompts, anew each epoch.")
    seed: int = setting(1, "Seed of the training prompts' shuffle.")
    dataloader_num_workers: int = setting(
        0, "verl's loader processes; unused: prompts are tokenised once, in memory."
    )

    @property
    def train_file_list(self) -> list[str]:
        return as_list(self.train_files)

    @property
    def val_file_list(self) -> list[str]:
        return as_list(self.val_files)


def rules(cfg: EngineConfig) -> list[str]:
    data = cfg.data
    p = choice(data.truncation, TRUNCATION_MODES, "data.truncation", "truncation mode")
    p += positive(
        [
            ("data.train_batch_size", data.train_batch_size),
            ("data.max_prompt_length", data.max_prompt_length),
            ("data.max_response_length", data.max_response_length),
        ]
    )
    if data.val_batch_size is not None and data.val_batch_size < 1:
        p.append(f"data.val_batch_size must be positive or null, got {data.val_batch_size}")
    if not data.train_file_list:
        p.append("data.train_files is required: a parquet or jsonl file (or a list of them)")
    return p
