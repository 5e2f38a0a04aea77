"""One multi-turn trajectory: the model's tokens and the environment's, told apart.

The response is every token after the prompt, turn after turn: the model's (mask 1,
their sampling log-probs kept) and the environment's (tool results, feedback and the
next turn's opening: mask 0, log-prob 0.0). The losses and the KL use the mask, so no
gradient flows through tokens the model did not write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Why a trajectory ended.
ANSWERED = "answered"  # the model ended a turn without calling a tool
MAX_TURNS = "max_turns"  # the turn limit
LENGTH = "length"  # the response token budget (or a turn cut without its end token)


@dataclass(frozen=True)
class AgentLimits:
    max_turns: int = 4  # model turns in one trajectory
    max_response_tokens: int = 1024  # model and environment tokens after the prompt, in all
    max_tool_response_chars: int = 2000  # each tool result, cut and marked beyond this
    tool_timeout_s: float = 30.0  # each tool call
    max_user_turns: int | None = None  # environment turns (tool results, feedback); None: any

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_response_tokens", "max_tool_response_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentLimits.{name} must be at least 1")
        if self.max_user_turns is not None and self.max_user_turns < 1:
            raise ValueError("AgentLimits.max_user_turns must be at least 1, or None")
        if not self.tool_timeout_s > 0:
            raise ValueError("AgentLimits.tool_timeout_s must be positive")


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1: the model's token
    logprobs: list[float] = field(default_factory=list)  # sampling log-prob; 0.0 off-mask
    turns: int = 0  # model turns
    ended: str | None = None  # ANSWERED | MAX_TURNS | LENGTH; None while running
    user_turns: int = 0  # environment turns added (tool results, feedback)
    tool_calls: int = 0  # calls whose tool ran (engine.agents.tools.EXECUTED)
    tool_errors: int = 0  # calls that failed (unknown tool, bad arguments, raised) and
    # malformed calls the parser could not read
    tool_timeouts: int = 0
    tool_latency_s: float = 0.0  # summed over calls
    interaction: str | None = None  # the row's interaction (engine.agents.interactions)
    interaction_state: Any = None  # what its start() returned
    turn_scores: list[float] = field(default_factory=list)  # its score of each answer
    feedback_turns: int = 0  # answers it sent back to the model

    @property
    def running(self) -> bool:
        return self.ended is None

    @property
    def finished(self) -> bool:
        """Ended by the model itself, not cut by a limit."""
        return self.ended == ANSWERED

    def room(self, limits: AgentLimits) -> int:
        return limits.max_response_tokens - len(self.response_ids)

    def add_model_turn(
        self, token_ids: list[int], logprobs: list[float] | None, limits: AgentLimits
    ) -> list[int]:
        """Append one model turn, cut to the token budget; returns what was kept."""
        kept = token_ids[: self.room(limits)]
        self.response_ids += kept
        self.response_mask += [1] * len(kept)
        self.logprobs += list(logprobs[: len(kept)]) if logprobs is not None else [0.0] * len(kept)
        self.turns += 1
        return kept

    def add_environment(self, token_ids: list[int], limits: AgentLimits) -> bool:
        """Append what the environment says; False (and the trajectory ends) when it does
        not fit the budget whole: a cut tool result would open a turn the model never saw."""
        if len(token_ids) > self.room(limits):
            self.ended = LENGTH
            return False
        self.response_ids += token_ids
        self.response_mask += [0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        return True
