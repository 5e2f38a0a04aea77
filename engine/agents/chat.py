"""Token ids for what the environment says between the model's turns.

A multi-turn trajectory is built token in, token out: the model's own tokens are kept as
sampled (never decoded and re-encoded, so what trains is exactly what was generated),
and only the messages the environment adds (tool results, feedback) and the opening of
the next assistant turn are tokenized, through the tokenizer's own chat template.

The template renders a whole conversation; the tokens for the added messages are the
difference between the conversation with them and without them, cut right after the
model's end-of-turn token (the model stops on it; what the template writes after it, a
newline in ChatML, belongs to the environment's part). A template that does not render
a conversation as a prefix of its continuation is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ConfigError

# A stand-in conversation the added messages are rendered after: only their rendering
# matters, and ChatML-like templates render each message on its own.
_BEFORE = ({"role": "user", "content": "u"}, {"role": "assistant", "content": "a"})


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
        self._check_prefix()

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The first prompt: the conversation, the tools, the assistant's turn opened."""
        return self._encode(self._render(list(messages), add_generation_prompt=True))

    def continuation_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The tokens after a model turn that ended with the end-of-turn token: the
        ``messages`` (tool results, feedback) and the next assistant turn's opening."""
        before = self._render(list(_BEFORE), add_generation_prompt=False)
        after = self._render([*_BEFORE, *messages], add_generation_prompt=True)
        cut = before.rindex(self.end_of_turn) + len(self.end_of_turn)
        return self._encode(after[cut:])

    def _render(self, messages: list[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=list(self.tools) or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _check_prefix(self) -> None:
        before = self._render(list(_BEFORE), add_generation_prompt=False)
        after = self._render([*_BEFORE, {"role": "tool", "content": "t"}], True)
        if self.end_of_turn not in before or not after.startswith(
            before[: before.rindex(self.end_of_turn)]
        ):
            raise ConfigError(
                [
                    "the tokenizer's chat template does not render a conversation as the"
                    " start of its continuation (or never writes the end-of-turn token"
                    f" {self.end_of_turn!r}): multi-turn rollouts need a template that does"
                    " (Qwen2.5/Qwen3's and ChatML templates do)"
                ]
            )
