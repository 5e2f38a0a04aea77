"""What an engine that serves turns as they come offers the agent driver: a
``TurnStream`` (vLLM's, ``engine.rollout.vllm_stream``) takes each turn as its own
request and hands back each as it finishes (``engine.agents.driver`` runs the loops
over it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.types import SamplingParams


@dataclass(frozen=True)
class Completion:
    """A finished turn: the request's handle, its tokens (cut after the end token),
    their log-probs (when asked) and whether it ended with the end token."""

    handle: str
    token_ids: list[int]
    logprobs: list[float] | None
    finished: bool


class TurnStream(Protocol):
    def submit(self, prompt_ids: list[int], sampling: SamplingParams) -> str: ...

    def step(self) -> list[Completion]: ...

    def abort(self) -> None: ...
