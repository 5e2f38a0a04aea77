"""The judge's text in and out: its prompt filled from a template, and its verdict turned
into a reward (``reward_model.judge``; pure functions, no model).

The verdict's last match of the pattern decides: a judge that reasons ("a score of 3
would be too low... Score: 8") names its answer last. Text up to a closing ``</think>``
is the judge's reasoning and is not searched."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engine.config.judge import JudgeConfig, template_text, verdict_pattern

THINK_END = "</think>"


def fill_template(template: str, prompt: str, response: str, ground_truth: str) -> str:
    """The template with its placeholders replaced, each once and in one pass (a response
    that itself contains "{prompt}" is left as written); other braces stay as they are."""
    values = {"{prompt}": prompt, "{response}": response, "{ground_truth}": ground_truth}
    return re.sub(r"\{prompt\}|\{response\}|\{ground_truth\}", lambda m: values[m[0]], template)


def question_text(messages: list[dict[str, Any]]) -> str:
    """What {prompt} stands for: the last user message of the prompt's chat (its text
    parts, for a message whose content is a list of parts)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content", "")
            if isinstance(content, list):
                return "\n".join(
                    str(part.get("text", "")) for part in content if isinstance(part, dict)
                )
            return str(content)
    return ""


def ground_truth_text(ground_truth: Any) -> str:
    return "" if ground_truth is None else str(ground_truth)


@dataclass(frozen=True)
class Verdict:
    reward: float
    parsed: bool  # False: the pattern did not match, or the score was off the scale
    raw: str | None = None  # the captured text of the deciding match


class VerdictParser:
    """A verdict's text -> a reward in [0, 1], or ``unparsed_score`` (``parsed`` False)."""

    def __init__(self, judge: JudgeConfig) -> None:
        self.mode = judge.verdict
        self.regex = re.compile(verdict_pattern(judge), re.IGNORECASE)
        self.lo, self.hi = judge.score_range
        self.unparsed = judge.unparsed_score

    def __call__(self, text: str) -> Verdict:
        if THINK_END in text:
            text = text.rsplit(THINK_END, 1)[1]
        matches = list(self.regex.finditer(text))
        if not matches:
            return Verdict(self.unparsed, False)
        raw = matches[-1].group(1)
        if raw is None:  # the group sits in a branch that did not take part
            return Verdict(self.unparsed, False)
        if self.mode == "yes_no":
            word = raw.strip().lower()
            if word in ("yes", "no"):
                return Verdict(1.0 if word == "yes" else 0.0, True, raw)
            return Verdict(self.unparsed, False, raw)
        try:
            value = float(raw.strip())
        except ValueError:
            return Verdict(self.unparsed, False, raw)
        if not self.lo <= value <= self.hi:  # off the scale: not followed, not clamped
            return Verdict(self.unparsed, False, raw)
        return Verdict((value - self.lo) / (self.hi - self.lo), True, raw)


class JudgePrompts:
    """Each sample's judge prompt, as text (``text``) and as the judge's token ids."""

    def __init__(self, judge: JudgeConfig, tokenizer: Any) -> None:
        self.template = template_text(judge)
        self.chat = judge.apply_chat_template
        self.tokenizer = tokenizer

    def text(self, messages: list[dict[str, Any]], response: str, ground_truth: Any) -> str:
        return fill_template(
            self.template, question_text(messages), response, ground_truth_text(ground_truth)
        )

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        if not self.chat:
            return [self.tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]
        return [
            list(
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": t}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=True,
                )["input_ids"]
            )
            for t in texts
        ]
