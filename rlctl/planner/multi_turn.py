"""Multi-turn rollouts in the plan (``actor_rollout_ref.rollout.multi_turn``; the engine's
side is engine/agents/, docs/agents.md).

With multi-turn on, ``data.max_response_length`` is the budget of a whole trajectory:
every model turn and every tool result between them (the tools' tokens sit in the
response, masked out of the losses). The memory model already sizes training, the KV
cache and the token budgets on prompt + response tokens per sample, and a turn's context
(the prompt, the earlier turns and results) never exceeds that, so no length changes.
What multi-turn changes in the plan:

- on vLLM the rollout's TP is chosen as without tools (the group's first member runs
  the loops and the tools, the others step with it: engine/agents/tp_group.py); on
  SGLang it stays at 1, the engine's rule there (``fit.fit_rollout``);
- the budget is checked against the turns it should hold, by a rule of thumb: T turns
  (``max_assistant_turns``) need ``T × MIN_TURN_TOKENS + (T − 1) × R`` tokens, with
  R = ⌈max_tool_response_length / CHARS_PER_TOKEN⌉ + TOOL_MESSAGE_TOKENS, one
  full-length tool result between turns. Short of it, the plan warns and says what to
  change; it does not refuse, because short tasks live on less (the engine cuts a turn at
  the budget and ends a trajectory whose result does not fit; the engine's CPU tool
  task fits a call, its result and the answer in 96 tokens);
- the reasoning shows the budget, and the waiting the tool rounds add to a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlctl.planner.model import (
    CHARS_PER_TOKEN,
    MAX_COUNT,
    MAX_TOKENS,
    MIN_TURN_TOKENS,
    TOOL_MESSAGE_TOKENS,
    InfeasiblePlanError,
)

KEY = "actor_rollout_ref.rollout.multi_turn"


@dataclass(frozen=True)
class MultiTurn:
    """The multi-turn settings the plan reads from the engine config (pinned or default)."""

    turns: int  # max_assistant_turns
    parallel_calls: int  # max_parallel_calls
    tool_chars: int  # max_tool_response_length
    tool_timeout_s: float

    @property
    def rounds(self) -> int:
        """Tool rounds between the turns: a result goes back before each later turn."""
        return self.turns - 1

    @property
    def result_tokens(self) -> int:
        """One tool result at its longest, in tokens, with the chat template around it."""
        return math.ceil(self.tool_chars / CHARS_PER_TOKEN) + TOOL_MESSAGE_TOKENS

    def needed(self, turns: int | None = None) -> int:
        """Tokens the rule asks for ``turns`` turns (default: all of them)."""
        t = self.turns if turns is None else turns
        return t * MIN_TURN_TOKENS + max(0, t - 1) * self.result_tokens

    def turns_that_fit(self, response_len: int) -> int:
        """The most turns, up to ``turns``, whose rule fits ``response_len`` tokens:
        t·MIN + (t − 1)·R ≤ budget ⇔ t ≤ (budget + R) / (MIN + R)."""
        r = self.result_tokens
        return max(0, min(self.turns, (response_len + r) // (MIN_TURN_TOKENS + r)))

    def result_chars_for(self, response_len: int) -> int:
        """The longest ``max_tool_response_length`` with which every turn fits (0: none)."""
        if self.rounds < 1:
            return 0
        room = (response_len - self.turns * MIN_TURN_TOKENS) // self.rounds - TOOL_MESSAGE_TOKENS
        return max(0, room * CHARS_PER_TOKEN)


def multi_turn_of(config: Any) -> MultiTurn | None:
    """The settings when the engine config turns multi-turn on; None otherwise."""
    if config is None:
        return None
    mt = config.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return None
    return MultiTurn(
        turns=mt.max_assistant_turns,
        parallel_calls=mt.max_parallel_calls,
        tool_chars=mt.max_tool_response_length,
        tool_timeout_s=mt.tool_timeout_s,
    )


def check_multi_turn(mt: MultiTurn, rollout_tp: int | None, backend: str = "vllm") -> None:
    """Refuse what no multi-turn run can have: limits below 1 or past any run's size, and
    on SGLang a pinned rollout TP above 1 (the engine refuses it; said here with the
    planner's fix)."""
    for name, value, most in (
        ("max_assistant_turns", mt.turns, MAX_COUNT),
        ("max_parallel_calls", mt.parallel_calls, MAX_COUNT),
        ("max_tool_response_length", mt.tool_chars, MAX_TOKENS),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InfeasiblePlanError(f"{KEY}.{name} must be a positive integer, got {value!r}")
        if value > most:
            raise InfeasiblePlanError(
                f"{KEY}.{name} {value} is more than {most:,}: not a size a run can have",
                hint=f"check {KEY}.{name} (a typo?)",
            )
    if not 0 < mt.tool_timeout_s < math.inf:
        raise InfeasiblePlanError(
            f"{KEY}.tool_timeout_s must be a positive number of seconds, got {mt.tool_timeout_s}"
        )
    if rollout_tp is not None and rollout_tp > 1 and backend == "sglang":
        raise InfeasiblePlanError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size {rollout_tp} with"
            f" {KEY}.enable on SGLang: multi-turn rollouts on SGLang run at tensor parallel 1"
            " (its members do not step together yet; the engine refuses it)",
            hint="use actor_rollout_ref.rollout.name=vllm, or unpin"
            " actor_rollout_ref.rollout.tensor_model_parallel_size (the planner then takes 1)",
        )


def multi_turn_lines(mt: MultiTurn, prompt_len: int, response_len: int) -> list[str]:
    """The budget and what it sizes, for the reasoning; a warning when it falls short."""
    need, r = mt.needed(), mt.result_tokens
    fits = need <= response_len
    rounds = count_noun(mt.rounds, "tool round")
    budget = (
        f"multi-turn budget: data.max_response_length {response_len} tokens is the whole"
        f" trajectory's: up to {count_noun(mt.turns, 'model turn')} (max_assistant_turns) and"
        f" the {rounds} between them, the tools' tokens in the response but not in the"
        f" losses; a tool result is at most {mt.tool_chars} characters"
        f" (max_tool_response_length) ≈ {r} tokens (⌈{mt.tool_chars} / {CHARS_PER_TOKEN}⌉"
        f" + {TOOL_MESSAGE_TOKENS} for its message), {mt.parallel_calls * r} for a turn's"
        f" {count_noun(mt.parallel_calls, 'call')} (max_parallel_calls) at their longest; the"
        f" rule, every turn ≥ {MIN_TURN_TOKENS} tokens with one full-length result between"
        f" turns: {mt.turns} × {MIN_TURN_TOKENS} + {mt.rounds} × {r} = {need}"
        + (
            f" ≤ {response_len}, leaving ~{(response_len - mt.rounds * r) // mt.turns}"
            " tokens a turn"
            if fits
            else f" > {response_len}"
        )
    )
    sizing = (
        f"multi-turn sizing: training, the token budgets and the KV cache take"
        f" {prompt_len} + {response_len} = {prompt_len + response_len} tokens a trajectory,"
        " which bounds every turn's context (the prompt, earlier turns and results, whose"
        f" KV vLLM's and SGLang's prefix caches can reuse); the {rounds} wait for their"
        " slowest call, up to"
        f" {mt.rounds} × {mt.tool_timeout_s:g} s (tool_timeout_s) ="
        f" {mt.rounds * mt.tool_timeout_s:g} s a step besides generation"
    )
    lines = [budget, sizing]
    if not fits:
        lines.append(_warning(mt, response_len))
    return lines


def _warning(mt: MultiTurn, response_len: int) -> str:
    held = mt.turns_that_fit(response_len)
    fixes = [f"raise data.max_response_length to {mt.needed()}"]
    chars = mt.result_chars_for(response_len)
    if chars >= 1:
        fixes.append(f"cut {KEY}.max_tool_response_length to {chars} characters")
    if 2 <= held < mt.turns:
        fixes.append(f"lower {KEY}.max_assistant_turns to {held}")
    return (
        f"warning: multi-turn budget: data.max_response_length {response_len} holds"
        f" {held} of the {count_noun(mt.turns, 'turn')} by the rule ({mt.needed()} tokens for"
        f" all): with long tool results the later turns are cut or never come (the engine"
        " ends a trajectory whose result does not fit); "
        + ", or ".join(fixes)
        + " (a task whose turns and results are short may ignore this)"
    )


def count_noun(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
