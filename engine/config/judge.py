"""``reward_model.judge``: the generative reward model (``reward_model.style=generative``),
an LLM judge served by a second instance of the rollout engine (engine.workers.judge):
the prompt it reads, the verdict it must end with and how that becomes a reward
(engine.reward.verdict), its generation settings; with the rules on them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config.fields import choice, one_of, setting

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

VERDICTS = ("score", "yes_no")
# What a template may name; only these are replaced (other braces, e.g. \boxed{}, stay).
PLACEHOLDERS = ("{prompt}", "{response}", "{ground_truth}")
# The judge's engines: a second instance of the rollout's own (SGLang: not yet).
JUDGE_BACKENDS = ("hf", "vllm")

# The last "\boxed{N}" or "Score: N" (N an integer or a decimal); one capture group.
DEFAULT_SCORE_PATTERN = r"(?:\\boxed\{|score\s*[:=]\s*)\s*(-?\d+(?:\.\d+)?)"
# The last "yes" or "no" standing as a word.
DEFAULT_YES_NO_PATTERN = r"\b(yes|no)\b"

DEFAULT_SCORE_TEMPLATE = """\
You are grading a response to a question. Judge whether it answers the question \
correctly and well; the reference answer is given when there is one.

Question:
{prompt}

Reference answer:
{ground_truth}

Response to grade:
{response}

Rate the response from 0 (wrong or useless) to 10 (correct and complete). Explain \
briefly, then end with a line "Score: N"."""

DEFAULT_YES_NO_TEMPLATE = """\
You are checking a response to a question against its reference answer.

Question:
{prompt}

Reference answer:
{ground_truth}

Response to check:
{response}

Is the response's final answer correct? Explain briefly, then end with one word: \
yes or no."""


@dataclass
class JudgeConfig:
    """An LLM judge (``reward_model.style=generative``): the causal LM at
    ``reward_model.model.path`` reads a prompt built from the template and generates a
    verdict, which a regular expression turns into a reward in [0, 1]."""

    prompt_template: str | None = setting(
        None,
        "The judge's prompt, with {prompt} (the question: the prompt's last user message),"
        " {response} (the policy's response, decoded) and {ground_truth} (the row's"
        " reward_model.ground_truth) replaced; other braces stay as written. null: the"
        " built-in template of the `verdict` (docs/rewards.md).",
    )
    prompt_template_path: str | None = setting(
        None, "A text file holding the template instead (null: `prompt_template`)."
    )
    apply_chat_template: bool = setting(
        True,
        "Send the filled template as the user's message through the judge tokenizer's chat"
        " template (true), or as raw text (false: a base model).",
    )
    verdict: str = setting(
        "score",
        "score: a number on the `score_range` scale, mapped linearly to [0, 1]; yes_no: yes"
        " scores 1, no scores 0.",
    )
    pattern: str | None = setting(
        None,
        "A regular expression with exactly one capture group, searched case-insensitively"
        " in the verdict (after any </think>); its last match decides. null: the last"
        " `\\boxed{N}` or `Score: N` (score), the last standalone yes or no (yes_no).",
    )
    score_range: list[float] = setting(
        factory=lambda: [0.0, 10.0],
        help="verdict=score: [lo, hi], the judge's scale; lo scores 0, hi scores 1, a number"
        " outside it counts as unparsed.",
    )
    unparsed_score: float = setting(
        0.0,
        "The reward of a verdict the pattern does not match (or out of range, or a prompt"
        " over `max_prompt_length`); counted in reward_model/judge_unparsed.",
    )
    max_prompt_length: int = setting(
        2048,
        "Tokens of the judge's prompt at most; a longer one is not judged (it scores"
        " `unparsed_score`, counted in reward_model/judge_overlong).",
    )
    max_new_tokens: int = setting(512, "Tokens of the judge's verdict at most.")
    temperature: float = setting(0.0, "The judge's sampling temperature; 0: greedy.")
    top_p: float = setting(1.0, "The judge's nucleus sampling (with temperature > 0).")


def template_text(judge: JudgeConfig) -> str:
    """The template the judge fills: the file's, the inline one, or the built-in."""
    if judge.prompt_template_path:
        return Path(judge.prompt_template_path).expanduser().read_text()
    if judge.prompt_template is not None:
        return judge.prompt_template
    return DEFAULT_SCORE_TEMPLATE if judge.verdict == "score" else DEFAULT_YES_NO_TEMPLATE


def verdict_pattern(judge: JudgeConfig) -> str:
    if judge.pattern is not None:
        return judge.pattern
    return DEFAULT_SCORE_PATTERN if judge.verdict == "score" else DEFAULT_YES_NO_PATTERN


def judge_rules(cfg: EngineConfig) -> list[str]:
    """The generative style's rules (reward_model.enable and style=generative)."""
    judge = cfg.reward_model.judge
    key = "reward_model.judge"
    p = choice(judge.verdict, VERDICTS, f"{key}.verdict", "verdict")
    backend = cfg.actor_rollout_ref.rollout.name
    if backend not in JUDGE_BACKENDS:
        p.append(
            f"reward_model.style=generative with actor_rollout_ref.rollout.name={backend}: the"
            f" judge runs on a second instance of the rollout engine, which {backend} cannot"
            f" serve yet; use rollout.name {one_of(JUDGE_BACKENDS)}, or the discriminative"
            " style"
        )
    if cfg.reward_model.model.input_tokenizer is not None:
        p.append(
            "reward_model.model.input_tokenizer is for the discriminative style: the judge"
            " reads the decoded response through its own template; remove it"
        )
    p += _template_problems(judge, key)
    p += _pattern_problems(judge, key)
    lo_hi = judge.score_range
    if len(lo_hi) != 2 or not all(math.isfinite(x) for x in lo_hi) or lo_hi[0] >= lo_hi[1]:
        p.append(
            f"{key}.score_range {lo_hi} must be two finite numbers [lo, hi] with lo < hi"
            " (the judge's scale, e.g. [0, 10])"
        )
    for name, value in (
        ("max_prompt_length", judge.max_prompt_length),
        ("max_new_tokens", judge.max_new_tokens),
    ):
        if value < 1:
            p.append(f"{key}.{name} must be a positive integer, got {value}")
    if judge.max_prompt_length <= cfg.data.max_response_length:
        p.append(
            f"{key}.max_prompt_length {judge.max_prompt_length} must be more than"
            f" data.max_response_length {cfg.data.max_response_length}: the judge's prompt"
            " holds the whole response and the template; raise it"
        )
    if judge.temperature < 0:
        p.append(f"{key}.temperature must be >= 0 (0: greedy), got {judge.temperature}")
    if not 0 < judge.top_p <= 1:
        p.append(f"{key}.top_p must be in (0, 1], got {judge.top_p}")
    return p


def _template_problems(judge: JudgeConfig, key: str) -> list[str]:
    if judge.prompt_template_path and judge.prompt_template is not None:
        return [
            f"{key}.prompt_template and {key}.prompt_template_path are both set: keep one"
            " (inline text or a file)"
        ]
    if judge.prompt_template_path:
        path = Path(judge.prompt_template_path).expanduser()
        if not path.is_file():
            return [
                f"{key}.prompt_template_path {judge.prompt_template_path!r} is not a file:"
                " give the path of a text file holding the template"
            ]
    text = template_text(judge)
    where = f"{key}.prompt_template" + ("_path's file" if judge.prompt_template_path else "")
    if "{response}" not in text:
        return [
            f"{where} has no {{response}} placeholder, so the judge would never see the"
            f" response it grades: add {{response}} where it goes (placeholders:"
            f" {', '.join(PLACEHOLDERS)})"
        ]
    return []


def _pattern_problems(judge: JudgeConfig, key: str) -> list[str]:
    pattern = verdict_pattern(judge)
    try:
        groups = re.compile(pattern, re.IGNORECASE).groups
    except re.error as error:
        return [f"{key}.pattern {pattern!r} is not a regular expression ({error}): fix it"]
    if groups != 1:
        return [
            f"{key}.pattern {pattern!r} has {groups} capture groups; it needs exactly one,"
            " around the score (or the yes/no word): make the others non-capturing, (?:...)"
        ]
    return []
