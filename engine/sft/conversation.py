"""A chat conversation as token ids and the loss mask of supervised fine-tuning: 1 on the
assistant's tokens, 0 on everything else (system, user and tool turns, the template's
markup), every assistant turn of a multi-turn conversation included.

The text is the tokenizer's own chat template, built turn by turn: each message's part
is what rendering the conversation up to it adds to rendering it without it, and each
assistant turn is preceded by the generation prompt (``<|im_start|>assistant\\n``), which
carries no loss. An assistant turn's loss runs through its end-of-turn token (the
tokenizer's eos, ``<|im_end|>``): what the template writes after it (a newline in
ChatML) belongs to the next message, as in the engine's multi-turn rollouts
(``engine.agents.chat``), where generation stops at that token. (verl's SFT trains on
that newline too.) Tool calls written by the template from a message's ``tool_calls``
field, and the tools given to the template, are part of the text like anything else.

The text between two assistant turns is tokenized as one string, and so is each turn:
the prompt before the first turn gets exactly the ids the rollout's prompt has
(``ChatFormat.prompt_ids``), and each turn the ids of its text as the tokenizer writes
it.

A template may render an earlier turn differently once later turns follow (Qwen3 drops
the reasoning of turns before the last question): the turn-by-turn text then differs from
the whole conversation's rendering, and is refused unless ``ignore_input_ids_mismatch``
(verl's key), which keeps each turn as it was rendered when it was the last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.errors import EngineError


class ConversationError(EngineError):
    """A conversation cannot be tokenized as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Conversation:
    """Token ids and, for each, whether it carries the loss (the assistant's)."""

    ids: list[int]
    loss_mask: list[int]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.loss_mask):
            raise ValueError(f"{len(self.ids)} ids but {len(self.loss_mask)} mask values")

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class ConversationTokenizer:
    """Tokenizes conversations with one tokenizer's chat template (module docstring)."""

    tokenizer: Any  # a transformers tokenizer with a chat template and an eos token
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    ignore_mismatch: bool = False  # data.ignore_input_ids_mismatch

    def __post_init__(self) -> None:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConversationError(
                "the tokenizer has no chat template: SFT on messages needs one (save it in"
                " the tokenizer folder)"
            )
        self.end_of_turn: str = self.tokenizer.eos_token or ""

    def __call__(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
    ) -> Conversation:
        messages = [_clean(m) for m in messages]
        if not any(m.get("role") == "assistant" for m in messages):
            raise ConversationError("the conversation has no assistant turn: nothing to learn")
        kwargs = dict(self.template_kwargs)
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking

        def render(upto: int, opened: bool) -> str:
            return self.tokenizer.apply_chat_template(
                messages[:upto],
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=opened,
                **kwargs,
            )

        pieces: list[tuple[str, bool]] = []  # (text, carries the loss)
        before = ""  # the conversation before message i, rendered
        for i, message in enumerate(messages):
            base = before
            if message["role"] == "assistant":
                opened = render(i, True) if i else ""
                pieces.append((_added(before, opened, self.end_of_turn), False))  # its opening
                base = opened
            through = render(i + 1, False)
            part = _added(base, through, self.end_of_turn)
            if message["role"] == "assistant":
                end = part.rfind(self.end_of_turn) if self.end_of_turn else -1
                cut = end + len(self.end_of_turn) if end >= 0 else len(part)
                pieces += [(part[:cut], True), (part[cut:], False)]
            else:
                pieces.append((part, False))
            before = through
        text = "".join(text for text, _ in pieces)
        if not self.ignore_mismatch and text != render(len(messages), False):
            raise ConversationError(
                "the chat template renders an earlier turn differently once later turns"
                " follow (Qwen3's drops old reasoning): the conversation turn by turn is"
                " not the whole conversation rendered. Set data.ignore_input_ids_mismatch"
                "=true to train on each turn as it was rendered when it was the last"
            )
        return self._encode(pieces)

    def _encode(self, pieces: list[tuple[str, bool]]) -> Conversation:
        """Each run of pieces alike (loss or not) tokenized as one string."""
        ids: list[int] = []
        mask: list[int] = []
        run, loss = "", False
        for text, carries in [*pieces, ("", None)]:
            if carries is not loss and run:
                encoded = self.tokenizer.encode(run, add_special_tokens=False)
                ids += encoded
                mask += [int(loss)] * len(encoded)
                run = ""
            if carries is not None:
                run, loss = run + text, carries
        return Conversation(ids, mask)


def _added(before: str, after: str, end_of_turn: str) -> str:
    """What ``after`` (a rendering with one more message, or the turn opened) adds to
    ``before``: its text past ``before`` when the template rendered the earlier turns
    alike; else (an earlier turn rendered anew) past as many end-of-turn tokens as
    ``before`` holds and what followed the last of them, or failing that past the
    longest common prefix."""
    if after.startswith(before):
        return after[len(before) :]
    turns = before.count(end_of_turn) if end_of_turn else 0
    if turns and after.count(end_of_turn) >= turns:
        pos = -len(end_of_turn)
        for _ in range(turns):
            pos = after.index(end_of_turn, pos + len(end_of_turn))
        pos += len(end_of_turn)
        tail = before[before.rindex(end_of_turn) + len(end_of_turn) :]
        return after[pos + len(tail) :] if after[pos:].startswith(tail) else after[pos:]
    shorter = min(len(before), len(after))
    common = next((i for i in range(shorter) if before[i] != after[i]), shorter)
    return after[common:]


def _clean(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as the template reads it: fields a columnar file fills with null for
    messages without them (parquet's structs: ``tool_calls`` on a user turn) left out,
    and a null content as empty text."""
    if not isinstance(message, Mapping) or "role" not in message:
        raise ConversationError(f"a message must be a mapping with a role, got {message!r}")
    out = {k: v for k, v in message.items() if v is not None}
    out.setdefault("content", "")
    return out
