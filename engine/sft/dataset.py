"""Conversations for supervised fine-tuning, in verl's layout: parquet or JSON Lines rows
with a column of chat messages (``data.messages_key``), optionally the tools the chat
template shows (``data.tools_key``: OpenAI function schemas, a list or its JSON text) and
a per-row ``enable_thinking`` flag (``data.enable_thinking_key``). Every conversation is
tokenized once, when the dataset is built (``engine.sft.conversation``), and cut to
``data.max_length`` tokens as ``data.truncation`` says; the ids and loss masks live in
flat arrays with offsets, so a large set costs bytes per token, not Python objects.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from engine.config.sft_sections import SFTDataConfig
from engine.data.dataset import DataError, read_columns, require_columns
from engine.sft.conversation import Conversation, ConversationError, ConversationTokenizer

TRUNCATION_HINT = (
    "raise data.max_length, or set data.truncation=left (keep the end) or right (keep the"
    " start) to cut such conversations"
)


class ConversationDataset(Sequence[Conversation]):
    """The conversations of some files, tokenized, in file order."""

    def __init__(
        self,
        files: Sequence[str],
        tokenizer: Any,
        cfg: SFTDataConfig,
        max_samples: int = -1,
    ) -> None:
        if not files:
            raise DataError("no data files given")
        chats = ConversationTokenizer(
            tokenizer, cfg.apply_chat_template_kwargs, cfg.ignore_input_ids_mismatch
        )
        ids: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        self.truncated = 0  # conversations cut to max_length
        for path in files:
            for row, conversation in _conversations(path, cfg, chats, max_samples - len(ids)):
                conversation = self._fit(conversation, cfg, path, row)
                ids.append(np.asarray(conversation.ids, dtype=np.int32))
                masks.append(np.asarray(conversation.loss_mask, dtype=np.int8))
            if 0 < max_samples <= len(ids):
                break
        if not ids:
            raise DataError(f"{', '.join(files)}: no conversations")
        lengths = np.array([len(a) for a in ids], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(lengths)])
        self._ids = np.concatenate(ids)
        self._masks = np.concatenate(masks)

    def _fit(self, conversation: Conversation, cfg: SFTDataConfig, path: str, row: int):
        n = len(conversation)
        if n <= cfg.max_length:
            return conversation
        if cfg.truncation == "error":
            raise DataError(
                f"{path}: row {row} is {n} tokens, over data.max_length={cfg.max_length};"
                f" {TRUNCATION_HINT}"
            )
        self.truncated += 1
        keep = (
            slice(n - cfg.max_length, n) if cfg.truncation == "left" else slice(0, cfg.max_length)
        )
        return Conversation(conversation.ids[keep], conversation.loss_mask[keep])

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: int) -> Conversation:  # type: ignore[override]
        if not 0 <= index < len(self):
            raise IndexError(index)
        start, end = self._offsets[index], self._offsets[index + 1]
        return Conversation(
            self._ids[start:end].tolist(), self._masks[start:end].astype(int).tolist()
        )

    def lengths(self) -> np.ndarray:
        return np.diff(self._offsets)

    @property
    def loss_tokens(self) -> int:
        return int(self._masks.sum())


def _conversations(
    path: str, cfg: SFTDataConfig, chats: ConversationTokenizer, limit: int
) -> Iterator[tuple[int, Conversation]]:
    """(row, conversation) of one file's rows: all of them when ``limit`` < 0, else at
    most ``limit`` (what is left of data.*_max_samples)."""
    columns = read_columns(path)
    require_columns(
        path,
        columns,
        [cfg.messages_key],
        " (data.messages_key names the column of chat messages; verl's default: messages)",
    )
    _refuse_media(path, columns)
    messages = columns[cfg.messages_key]
    tools = columns.get(cfg.tools_key)
    thinking = columns.get(cfg.enable_thinking_key)
    rows = len(messages) if limit < 0 else min(len(messages), limit)
    for row in range(rows):
        chat = messages[row]
        if isinstance(chat, str):  # a JSON text column
            chat = _json(chat, path, row, cfg.messages_key)
        if not isinstance(chat, list) or not chat:
            raise DataError(
                f"{path}: row {row}: {cfg.messages_key} must be a non-empty list of"
                f" {{role, content}} messages, got {type(chat).__name__}"
            )
        row_tools = tools[row] if tools is not None else None
        if isinstance(row_tools, str):
            row_tools = _json(row_tools, path, row, cfg.tools_key)
        flag = thinking[row] if thinking is not None else None
        flag = cfg.enable_thinking if flag is None else bool(flag)
        try:
            yield row, chats(chat, row_tools or None, flag)
        except ConversationError as exc:
            raise DataError(f"{path}: row {row}: {exc}") from None


MEDIA_COLUMNS = ("images", "videos")  # verl's multi-turn SFT dataset's image_key, video_key


def _refuse_media(path: str, columns: dict[str, list[Any]]) -> None:
    """SFT here is text-only: a row with images or videos is refused, not trained on its
    text alone."""
    for column in MEDIA_COLUMNS:
        for row, value in enumerate(columns.get(column, ())):
            if value is not None and len(value) > 0:
                raise DataError(
                    f"{path}: row {row} has {column} (verl's vision-language SFT): SFT here"
                    " trains on text only and would drop them; give conversations without"
                    " media"
                )


def _json(text: str, path: str, row: int, key: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: row {row}: column {key!r} is text but not JSON ({exc})") from None
