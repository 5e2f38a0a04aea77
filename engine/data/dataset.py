"""Prompt datasets in verl's layout: parquet or JSON Lines, tokenised once.

Each row holds a chat (``prompt``: a list of ``{role, content}`` messages), the name of
the reward function's data source (``data_source``), an ``ability`` tag, the reference
answer (``reward_model: {style, ground_truth}``) and optional ``extra_info``. The
dataset applies the tokenizer's chat template (with the assistant generation prompt) to
every chat at construction, then drops, truncates or rejects prompts longer than
``data.max_prompt_length`` as configured. Token ids live in one flat int32 array with
offsets, so 100k prompts cost a few hundred kilobytes of index, not Python lists.

A vision-language model's rows may hold images (verl's ``data.image_key`` column and
``<image>`` placeholders, ``engine.data.images``): the model's processor
(``engine.models.processor``) expands each image's pad token at construction, from the
image's size alone, and makes its pixel values when the row is read, so the dataset
holds the images' bytes, not their pixels.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from engine.config import DataConfig
from engine.data.errors import DataError

if TYPE_CHECKING:
    from engine.models.processor import VisionProcessor
    from engine.types import ImageInputs

log = logging.getLogger(__name__)

SUPPORTED_EXTENSIONS = (".parquet", ".jsonl", ".json")
REQUIRED_COLUMNS = ("data_source", "ability", "reward_model")  # besides cfg.prompt_key
OPTIONAL_COLUMNS = ("extra_info", "agent_name")
TRUNCATION_HINT = (
    "raise data.max_prompt_length, set data.filter_overlong_prompts=true to drop such "
    "prompts, or set data.truncation=left|right|middle to cut them"
)
_CHUNK = 2048  # chats rendered and tokenised per call


@dataclass
class PromptSample:
    """One prompt, ready for rollout, with what the reward function needs to score it."""

    index: int  # position in the (filtered) dataset; stable across epochs
    prompt_ids: list[int]  # chat template applied (with the generation prompt), truncated
    messages: list[dict[str, Any]]  # the raw chat
    data_source: str
    ground_truth: Any
    ability: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    agent_name: str | None = None  # its agent loop (engine.agents); None: the default
    images: ImageInputs | None = None  # a vision-language model's prompt: its images


@runtime_checkable
class PromptDataset(Protocol):
    """What the engine reads of a dataset: ``RLDataset``, or a class of your own
    (``data.custom_cls``, engine.data.custom). ``__getitem__`` returns a ``PromptSample``
    whose ``index`` is its position; ``agent_rows`` and ``data_sources`` feed the checks
    made before any worker starts."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> PromptSample: ...

    def agent_rows(self) -> Iterator[tuple[str, str | None, dict[str, Any]]]: ...

    def data_sources(self) -> set[str]: ...


# ---------------------------------------------------------------------------
# files


def read_columns(path: str | Path) -> dict[str, list[Any]]:
    """Every column of one parquet, JSON Lines or JSON (array) file, as Python lists."""
    path = Path(path)
    if path.suffix not in SUPPORTED_EXTENSIONS:
        raise DataError(
            f"{path}: unsupported file type {path.suffix or '(none)'!r}; "
            f"use one of {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise DataError(f"{path}: not a readable parquet file ({exc})") from exc
        return {name: table.column(name).to_pylist() for name in table.column_names}
    rows = _read_json_rows(path)
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    # A key missing from some rows reads as None there, as a parquet null would.
    return {name: [row.get(name) for row in rows] for name in names}


def _read_json_rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: invalid JSON ({exc})") from exc
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: invalid JSON line ({exc.msg})") from exc
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {i} is a {type(row).__name__}, not a JSON object")
    return rows


def require_columns(
    path: str | Path, columns: dict[str, list[Any]], names: Iterable[str], hint: str = ""
) -> None:
    missing = [name for name in names if name not in columns]
    if missing:
        present = ", ".join(columns) or "(none)"
        raise DataError(
            f"{path}: missing column(s) {', '.join(missing)}; columns present: {present}{hint}"
        )


# ---------------------------------------------------------------------------
# the dataset


class RLDataset:
    """Map-style dataset of :class:`PromptSample`, tokenised at construction."""

    def __init__(
        self,
        files: Sequence[str | Path] | str | Path,
        tokenizer: Any,
        cfg: DataConfig,
        tools: Sequence[dict[str, Any]] = (),
        max_samples: int = -1,
        processor: VisionProcessor | None = None,
    ):
        """``tools``: OpenAI function schemas the chat template shows the model (a
        multi-turn rollout's tools, engine.agents). ``max_samples`` > 0 keeps that many
        rows (verl's train_max_samples/val_max_samples): a random choice of them by
        ``cfg.seed`` when ``cfg.shuffle``, else the first ones. ``processor``: a
        vision-language model's, for rows with images (None: rows with images are
        refused)."""
        if isinstance(files, (str, Path)):
            files = [files]
        if not files:
            raise DataError("no data files given (set data.train_files / data.val_files)")
        self.files = [str(f) for f in files]
        self.max_prompt_length = cfg.max_prompt_length
        self._messages: list[list[dict[str, Any]]] = []
        self._data_source: list[str] = []
        self._ability: list[str] = []
        self._ground_truth: list[Any] = []
        self._extra_info: list[dict[str, Any]] = []
        self._agent_name: list[str | None] = []
        self._images: list[list[Any] | None] = []  # each row's image cells (verl's layout)
        self.processor = processor
        self.tools = list(tools)
        self._origins: list[tuple[str, int]] = []  # (file, row) of each sample, for messages
        for path in self.files:
            n = self._load_file(path, cfg)
            self._origins.extend((path, row) for row in range(n))
        self._sample(max_samples, cfg)

        ids, offsets = _tokenize_chats(
            tokenizer,
            self._template_chats(),
            self.tools,
            cfg.apply_chat_template_kwargs,
            expand=self._image_tokens(),
        )
        ids, offsets = self._fit_prompt_length(ids, offsets, cfg)
        if len(offsets) <= 1:
            what = "after dropping over-long prompts " if self.num_filtered else ""
            raise DataError(
                f"the dataset is empty {what}(files: {', '.join(self.files)}); "
                + (TRUNCATION_HINT if self.num_filtered else "add rows")
            )
        self._ids = ids
        self._offsets = offsets

    def _sample(self, max_samples: int, cfg: DataConfig) -> None:
        """Keep ``max_samples`` rows (> 0): a random choice by ``cfg.seed`` when
        ``cfg.shuffle``, else the first ones."""
        if 0 < max_samples < len(self._messages):
            rows = len(self._messages)
            keep = (
                sorted(np.random.default_rng(cfg.seed).choice(rows, max_samples, replace=False))
                if cfg.shuffle
                else range(max_samples)
            )
            self._keep_rows([int(i) for i in keep])

    def _fit_prompt_length(self, ids: Any, offsets: Any, cfg: DataConfig) -> tuple[Any, Any]:
        """The tokenized prompts within ``data.max_prompt_length``: over-long ones dropped
        (``filter_overlong_prompts``), refused or truncated (``truncation``)."""
        lengths = np.diff(offsets)
        over = np.flatnonzero(lengths > cfg.max_prompt_length)
        self.num_overlong = int(over.size)
        self.num_filtered = 0
        if over.size and cfg.filter_overlong_prompts:
            self.num_filtered = int(over.size)
            log.warning(
                "dropped %d of %d prompts longer than data.max_prompt_length=%d tokens",
                over.size,
                len(lengths),
                cfg.max_prompt_length,
            )
            keep = np.flatnonzero(lengths <= cfg.max_prompt_length)
            ids, offsets = _select(ids, offsets, keep)
            self._keep_rows(keep.tolist())
        elif over.size:
            with_images = [int(i) for i in over if self._images[i]]
            if with_images:
                path, row = self._origins[with_images[0]]
                raise DataError(
                    f"{len(with_images)} prompts with images are longer than"
                    f" data.max_prompt_length={cfg.max_prompt_length} tokens (the first: row"
                    f" {row} of {path}); cutting them would cut an image: raise"
                    " data.max_prompt_length or set data.filter_overlong_prompts=true"
                )
            if cfg.truncation == "error":
                first = int(over[0])
                path, row = self._origins[first]
                raise DataError(
                    f"{over.size} of {len(lengths)} prompts are longer than "
                    f"data.max_prompt_length={cfg.max_prompt_length} tokens; the first is "
                    f"row {row} of {path} with {int(lengths[first])} tokens. {TRUNCATION_HINT}"
                )
            ids, offsets = _truncate(ids, offsets, cfg.max_prompt_length, cfg.truncation)
            log.info(
                "truncated %d prompts to %d tokens (%s)",
                over.size,
                cfg.max_prompt_length,
                cfg.truncation,
            )
        return ids, offsets

    def _load_file(self, path: str, cfg: DataConfig) -> int:
        prompt_key = cfg.prompt_key
        columns = read_columns(path)
        hint = "" if prompt_key in columns else " (the chat column is set by data.prompt_key)"
        require_columns(path, columns, (prompt_key, *REQUIRED_COLUMNS), hint)
        _refuse_media(path, columns, cfg, images=self.processor is not None)
        prompts = columns[prompt_key]
        images = columns.get(cfg.image_key) or [None] * len(prompts)
        self._images.extend(list(cells) if cells else None for cells in images)
        rewards = columns["reward_model"]
        extra = columns["extra_info"] if "extra_info" in columns else [None] * len(prompts)
        agents = columns["agent_name"] if "agent_name" in columns else [None] * len(prompts)
        self._agent_name.extend(None if a is None else str(a) for a in agents)
        for row, (chat, reward) in enumerate(zip(prompts, rewards, strict=True)):
            self._messages.append(_check_chat(chat, path, row, prompt_key))
            if not isinstance(reward, dict) or "ground_truth" not in reward:
                raise DataError(
                    f"{path}: row {row}: reward_model must be a mapping with a ground_truth "
                    f"key, got {reward!r}"
                )
            self._ground_truth.append(reward["ground_truth"])
        self._data_source.extend(str(s) for s in columns["data_source"])
        self._ability.extend("" if a is None else str(a) for a in columns["ability"])
        self._extra_info.extend(e if isinstance(e, dict) else {} for e in extra)
        return len(prompts)

    def _keep_rows(self, keep: list[int]) -> None:
        for name in (
            "_messages",
            "_data_source",
            "_ability",
            "_ground_truth",
            "_extra_info",
            "_agent_name",
            "_images",
            "_origins",
        ):
            values = getattr(self, name)
            setattr(self, name, [values[i] for i in keep])

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: int) -> PromptSample:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} prompts")
        index %= n
        start, end = self._offsets[index], self._offsets[index + 1]
        prompt_ids = self._ids[start:end].tolist()
        return PromptSample(
            index=index,
            prompt_ids=prompt_ids,
            messages=self._messages[index],
            data_source=self._data_source[index],
            ground_truth=self._ground_truth[index],
            ability=self._ability[index],
            extra_info=self._extra_info[index],
            agent_name=self._agent_name[index],
            images=self._image_inputs(index, prompt_ids),
        )

    def _template_chats(self) -> list[list[dict[str, Any]]]:
        """The chats as the template renders them: a row with images has its
        placeholders split into image parts (their number checked)."""
        from engine.data.images import with_image_parts

        return [
            with_image_parts(chat, len(cells), self._where(i)) if cells else chat
            for i, (chat, cells) in enumerate(zip(self._messages, self._images, strict=True))
        ]

    def _image_tokens(self) -> Callable[[int, str], str] | None:
        """How each rendered chat's image pad tokens are repeated (per merged patch of
        each image, from its size); None when no row has images."""
        if self.processor is None or not any(self._images):
            return None
        from engine.data.images import image_size

        processor = self.processor
        counts = [
            processor.tokens_per_image([image_size(c, self._where(i)) for c in cells])
            if cells
            else None
            for i, cells in enumerate(self._images)
        ]

        def expand(row: int, text: str) -> str:
            return text if counts[row] is None else processor.expand(text, counts[row])

        return expand

    def _image_inputs(self, index: int, prompt_ids: list[int]) -> ImageInputs | None:
        cells = self._images[index]
        if not cells or self.processor is None:
            return None
        from engine.data.images import open_image

        where = self._where(index)
        images = [open_image(cell, where) for cell in cells]
        try:
            return self.processor.image_inputs(prompt_ids, images)
        except ValueError as exc:  # the processor's grid against the pads laid out
            raise DataError(f"{where}: {exc}") from exc

    def _where(self, index: int) -> str:
        path, row = self._origins[index]
        return f"{path}: row {row}"

    def agent_rows(self) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
        """("FILE: row N", agent_name, extra_info) of each sample, for the agent checks
        (engine.agents.rows)."""
        for (path, row), agent, extra in zip(
            self._origins, self._agent_name, self._extra_info, strict=True
        ):
            yield f"{path}: row {row}", agent, extra

    def data_sources(self) -> set[str]:
        """Every ``data_source`` in the dataset (the reward checks it can score each)."""
        return set(self._data_source)

    def prompt_lengths(self) -> np.ndarray:
        """Token count of every prompt (after truncation), in dataset order."""
        return np.diff(self._offsets)


def _refuse_media(path: str, columns: dict[str, list[Any]], cfg: DataConfig, images: bool) -> None:
    """A row with media the model cannot take (verl's data.image_key, video_key,
    audio_key columns) is refused, not trained without them: videos and audio always,
    images unless the model is a vision-language one (``images``)."""
    kinds = (("videos", "video_key"), ("audio", "audio_key"))
    if not images:
        kinds = (("images", "image_key"), *kinds)
    for what, name in kinds:
        column = getattr(cfg, name)
        for row, value in enumerate(columns.get(column, ())):
            if value is not None and len(value) > 0:
                model = (
                    "the model (actor_rollout_ref.model.path) is text-only: give a"
                    " vision-language one (docs/vision.md) or prompts without images"
                    if what == "images"
                    else f"this engine does not train on {what} yet (docs/vision.md)"
                )
                raise DataError(
                    f"{path}: row {row} has {what} in column {column!r} (data.{name}):"
                    f" {model}; it would drop them"
                )


def _check_chat(chat: Any, path: str, row: int, prompt_key: str) -> list[dict[str, Any]]:
    valid = (
        isinstance(chat, list)
        and bool(chat)
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in chat)
    )
    if valid:
        # Parquet structs carry every field of the column's schema; drop the unset
        # ones so that templates testing ``message.tool_calls is defined`` see none.
        return [{k: v for k, v in m.items() if v is not None or k == "content"} for m in chat]
    raise DataError(
        f"{path}: row {row}: column {prompt_key!r} must be a non-empty list of chat messages "
        f"with 'role' and 'content', got {chat!r:.200}"
    )


# ---------------------------------------------------------------------------
# tokenising


def _tokenize_chats(
    tokenizer: Any,
    chats: list[list[dict[str, Any]]],
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    expand: Callable[[int, str], str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Render every chat with the tokenizer's template and tokenise it.

    Returns the ids of all prompts concatenated (int32) and their ``len + 1`` offsets.
    The rendered text already holds the template's special tokens, so none are added.
    ``expand(row, text)``: the rendered text of row ``row`` as tokenised (its image pad
    tokens repeated).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"the tokenizer ({getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)}) "
            "has no chat template; use an instruct/chat model's tokenizer, or set "
            "actor_rollout_ref.model.tokenizer_path to one that has a template"
        )
    pieces: list[np.ndarray] = []
    lengths: list[int] = []
    for start in range(0, len(chats), _CHUNK):
        texts = tokenizer.apply_chat_template(
            chats[start : start + _CHUNK],
            tokenize=False,
            add_generation_prompt=True,
            **({"tools": tools} if tools else {}),  # what a plain prompt renders stays as it was
            **(template_kwargs or {}),  # data.apply_chat_template_kwargs (enable_thinking, ...)
        )
        if expand is not None:
            texts = [expand(start + k, text) for k, text in enumerate(texts)]
        encoded = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)
        for ids in encoded["input_ids"]:
            lengths.append(len(ids))
            pieces.append(np.asarray(ids, dtype=np.int32))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    return ids, offsets


def _select(
    ids: np.ndarray, offsets: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The prompts at positions ``keep``, as a new (ids, offsets) pair."""
    parts = [ids[offsets[i] : offsets[i + 1]] for i in keep]
    new_offsets = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=new_offsets[1:])
    new_ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    return new_ids, new_offsets


def truncate_ids(ids: Sequence[int], max_length: int, mode: str) -> Sequence[int]:
    """Cut ``ids`` to ``max_length`` tokens.

    ``left`` keeps the last tokens, ``right`` the first, ``middle`` the first
    ``ceil(max/2)`` and the last ``floor(max/2)``.
    """
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[len(ids) - max_length :]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = (max_length + 1) // 2
        tail = max_length - head
        return [*ids[:head], *ids[len(ids) - tail :]] if tail else ids[:head]
    raise DataError(f"unknown data.truncation {mode!r}; use error, left, right or middle")


def _truncate(
    ids: np.ndarray, offsets: np.ndarray, max_length: int, mode: str
) -> tuple[np.ndarray, np.ndarray]:
    parts = []
    for i in range(len(offsets) - 1):
        prompt = ids[offsets[i] : offsets[i + 1]]
        if len(prompt) > max_length:
            prompt = np.asarray(truncate_ids(prompt, max_length, mode), dtype=np.int32)
        parts.append(prompt)
    new_offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=new_offsets[1:])
    return np.concatenate(parts), new_offsets
