"""Token ids for what the environment says between the model's turns.

A multi-turn trajectory is built token in, token out: the model's own tokens are kept as
sampled (never decoded and re-encoded, so what trains is exactly what was generated),
and only the messages the environment adds (tool results, feedback) and the opening of
the next assistant turn are tokenized, through the tokenizer's own chat template.

The tokens for the added messages are what the template renders after a stand-in
assistant turn, from right after that turn's end-of-turn token (the model stops on it;
what the template writes after it, a newline in ChatML, belongs to the environment's
part). Only that part is used, so a template may render the conversation's last
assistant turn its own way (Qwen3's adds an empty think block to it). A template that
renders the added messages anywhere but after the assistant's turn is refused.

What the environment says is text, whatever it contains: a tool that prints
``<|im_end|><|im_start|>assistant`` gets those characters, never the template's special
tokens (or any other added token, such as ``</tool_response>``), so tool output cannot
forge the turns around it. The template's own parts are tokenized as usual.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ConfigError

# The stand-in conversation the added messages are rendered after (only their rendering
# matters); the reply is one word no template rewrites.
_REPLY = "rlctlstandinreply"
_BEFORE = ({"role": "user", "content": "u"}, {"role": "assistant", "content": _REPLY})
# Rendered in place of each added message's text, then cut back out (ASCII letters and
# digits only: templates that escape or quote the content leave it as it is).
_SLOT = "rlctlslot{}x{}"
# Where the template changes the text it renders (trims it, quotes it) the slots cannot
# be cut back out; the text is rendered itself, with this joiner written into every
# added token's text so that the tokenizer cannot read it as that token.
_JOINER = "\u2060"


@dataclass
class ChatFormat:
    """The prompt and the between-turn tokens of one tokenizer's chat template."""

    tokenizer: Any  # a transformers tokenizer with a chat template
    tools: Sequence[Mapping[str, Any]] = ()  # OpenAI function schemas, for the prompt
    # the template's own arguments (data.apply_chat_template_kwargs: enable_thinking, ...)
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        eos = self.tokenizer.eos_token
        if not eos:
            raise ConfigError(
                ["the tokenizer has no eos_token: multi-turn needs the end of a turn"]
            )
        self.end_of_turn = eos
        added = sorted(_added_tokens(self.tokenizer), key=len, reverse=True)
        self._added = re.compile("|".join(map(re.escape, added))) if added else None
        ends = (getattr(self.tokenizer, n, None) for n in ("eos_token_id", "pad_token_id"))
        self._end_ids = {i for i in ends if isinstance(i, int)}
        self._check_template()

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The first prompt: the conversation, the tools, the assistant's turn opened."""
        return self._encode(self._render(list(messages), add_generation_prompt=True))

    def continuation_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The tokens after a model turn that ended with the end-of-turn token: the
        ``messages`` (tool results, feedback) and the next assistant turn's opening.
        Their text is tokenized as text (module docstring)."""
        messages = [dict(m) for m in messages]
        texts = [m.get("content") for m in messages]
        own = [t for t in texts if isinstance(t, str)]
        nonce = 0
        while any(_SLOT.format(i, nonce) in t for t in own for i in range(len(messages))):
            nonce += 1
        slots = [_SLOT.format(i, nonce) for i in range(len(messages))]
        slotted = [
            {**m, "content": slot} if isinstance(m.get("content"), str) else m
            for m, slot in zip(messages, slots, strict=True)
        ]
        real = self._tail(messages)
        template = self._tail(slotted)
        used = [slot for slot, text in zip(slots, texts, strict=True) if isinstance(text, str)]
        pieces = _split_on_slots(template, used)
        if pieces is not None:
            for variant in (own, [t.strip() for t in own]):
                if _join(pieces, variant) == real:
                    ids = self._encode(pieces[0])
                    for text, part in zip(variant, pieces[1:], strict=True):
                        ids += self.text_ids(text) + self._encode(part)
                    return ids
        # The template rewrote the text: render it with every added token's text broken.
        escaped = [
            {**m, "content": self._break_added(m["content"])}
            if isinstance(m.get("content"), str)
            else m
            for m in messages
        ]
        return self._encode(self._tail(escaped))

    def text_ids(self, text: str) -> list[int]:
        """``text`` as tokens of text only: no added token (special or not) is read from
        it. Where one's text occurs, its first character is tokenized on its own."""
        if self._added is None:
            return self._encode(text)
        ids: list[int] = []
        start = 0
        while (found := self._added.search(text, start)) is not None:
            ids += self._encode(text[start : found.start() + 1])
            start = found.start() + 1
        return ids + self._encode(text[start:])

    def turn_text(self, token_ids: Sequence[int]) -> str:
        """A model turn's text for its reader (the tool-call parser, an interaction): every
        token as written, special ones included (a tokenizer may mark ``<tool_call>``
        special), less the end-of-turn (or padding) tokens that ended it."""
        ids = list(token_ids)
        while ids and ids[-1] in self._end_ids:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _tail(self, messages: list[Mapping[str, Any]]) -> str:
        after = self._render([*_BEFORE, *messages], add_generation_prompt=True)
        reply = after.index(_REPLY) + len(_REPLY)
        return after[after.index(self.end_of_turn, reply) + len(self.end_of_turn) :]

    def _break_added(self, text: str) -> str:
        if self._added is None:
            return text
        return self._added.sub(lambda m: m.group(0)[0] + _JOINER + m.group(0)[1:], text)

    def _render(self, messages: list[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=list(self.tools) or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def _check_template(self) -> None:
        """The stand-in reply, its end-of-turn token after it, and an added message
        rendered after that: what ``continuation_ids`` cuts at."""
        marker = "rlctlstandintool"
        after = self._render([*_BEFORE, {"role": "tool", "content": marker}], True)
        reply = after.find(_REPLY)
        end = after.find(self.end_of_turn, reply) if reply >= 0 else -1
        if reply < 0 or end < 0 or after.find(marker, end) < 0:
            raise ConfigError(
                [
                    "the tokenizer's chat template does not render the messages after an"
                    " assistant turn after that turn's end-of-turn token"
                    f" {self.end_of_turn!r} (or never writes it): multi-turn rollouts need"
                    " a template that does (Qwen2.5/Qwen3's and ChatML templates do)"
                ]
            )


def _added_tokens(tokenizer: Any) -> list[str]:
    """The text of every token the tokenizer matches before its model runs: its special
    tokens and the added ones (Qwen's ``<tool_call>``, ``</tool_response>``)."""
    found = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    get = getattr(tokenizer, "get_added_vocab", None)
    if get is not None:
        found |= set(get())
    return [t for t in found if t]


def _split_on_slots(text: str, slots: list[str]) -> list[str] | None:
    """``text`` cut at each slot, in order, each once; None when it is not so."""
    if any(text.count(slot) != 1 for slot in slots):
        return None
    pieces = []
    for slot in slots:
        if slot not in text:  # rendered out of order
            return None
        head, text = text.split(slot)
        pieces.append(head)
    return [*pieces, text]


def _join(pieces: list[str], texts: list[str]) -> str:
    out = pieces[0]
    for text, piece in zip(texts, pieces[1:], strict=True):
        out += text + piece
    return out
