"""``data``: the prompt files, their columns, lengths in tokens and batch sizes in
prompts (read by ``engine.data``), and the rules on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.config import verl_trees
from engine.config.fields import as_list, choice, inert, mapping, positive, setting, tree

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

TRUNCATION_MODES = ("error", "left", "right", "middle")


@dataclass
class CustomDatasetClass:
    """A dataset class of your own in place of ``engine.data.RLDataset`` (verl's key):
    built with RLDataset's arguments, it yields ``engine.data.PromptSample`` (docs/data.md)."""

    path: str | None = setting(
        None,
        "A .py file defining your dataset class (docs/data.md: built as RLDataset is, its"
        " items PromptSample); null: the engine's RLDataset.",
    )
    name: str | None = setting(None, "The class's name in that file (required with path).")


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
    reward_fn_key: str = inert(
        "data_source",
        "verl's column naming each row's reward function; changes nothing here: the engine"
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
    dataloader_num_workers: int = inert(
        0, "verl's loader processes; changes nothing here: prompts are tokenised once, in memory."
    )
    # verl's other data keys (docs/verl-compat.md).
    train_max_samples: int = setting(
        -1,
        "Use at most this many training prompts (a random choice of them by `seed` when"
        " shuffling, else the first ones); -1: all.",
    )
    val_max_samples: int = setting(
        -1, "Use at most this many validation prompts (chosen as train_max_samples); -1: all."
    )
    apply_chat_template_kwargs: dict[str, Any] = mapping(
        "Keyword arguments of the tokenizer's chat template when prompts are rendered (e.g."
        " enable_thinking: false for Qwen3)."
    )
    image_key: str = setting(
        "images",
        "Column of each prompt's images, verl's layout: a list of {bytes, path} (or paths)"
        " per row, `<image>` in the chat where each goes. Read for a vision-language model"
        " (docs/vision.md); a row with images is refused for a text-only one.",
    )
    video_key: str = inert(
        "videos",
        "verl's column of videos; not trained on yet: a row with videos is refused when the"
        " data loads.",
    )
    audio_key: str = inert(
        "audios", "verl's column of audio; a row with audio in it is refused when the data loads."
    )
    image_patch_size: int = inert(
        14,
        "verl's resize factor for its image fetcher; changes nothing here: the model's image"
        " processor resizes by its own patch size.",
    )
    return_multi_modal_inputs: bool = inert(
        True, "verl's multimodal switch; changes nothing here: images always reach the model."
    )
    mm_processor_kwargs: dict[str, Any] = mapping(
        "Keyword arguments of a vision-language model's image processor for the prompts'"
        " images (e.g. min_pixels, max_pixels for Qwen2-VL's)."
    )
    return_raw_chat: bool = inert(
        True,
        "verl keeps each prompt's chat messages beside its tokens; always so here (the"
        " agent loop, the judge and rollout_data_dir read them), false changes nothing.",
    )
    return_raw_input_ids: bool = inert(
        False, "verl's prompt ids for a reward model of another tokenizer; changes nothing here."
    )
    return_full_prompt: bool = inert(
        False, "verl keeps the rendered prompt text; changes nothing here."
    )
    gen_batch_size: int | None = inert(
        None,
        "verl's prompts per generation round of dynamic sampling; changes nothing here:"
        " each round draws data.train_batch_size prompts (filter_groups.max_num_gen_batches"
        " counts rounds).",
    )
    validation_shuffle: bool = inert(
        False, "verl's validation order switch; changes nothing here (file order)."
    )
    filter_overlong_prompts_workers: int = inert(
        1, "verl's processes filtering long prompts; changes nothing here (one pass in memory)."
    )
    use_shm: bool = inert(False, "verl copies data files to /dev/shm; changes nothing here.")
    custom_cls: CustomDatasetClass = field(default_factory=CustomDatasetClass)
    continuous_token: dict[str, Any] = tree(
        verl_trees.CONTINUOUS_TOKEN,
        "verl's continuous-token prompts; not in this engine (enable=true is refused).",
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
    custom = data.custom_cls
    if custom.path and not custom.name:
        p.append(
            f"data.custom_cls.path={custom.path!r} needs data.custom_cls.name: the name of"
            " the dataset class in that file"
        )
    if custom.name and not custom.path:
        p.append(
            f"data.custom_cls.name={custom.name!r} needs data.custom_cls.path: the .py file"
            " that defines it (or leave name null for the engine's dataset)"
        )
    if not data.train_file_list:
        p.append("data.train_files is required: a parquet or jsonl file (or a list of them)")
    return p
