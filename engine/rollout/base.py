"""The interface every rollout backend implements.

Batched prompts in (token ids, one row per sample), token ids and optional
log-probs out, plus the hooks a colocated engine needs around training:

- ``sync_weights``: after an actor update, receive new weights (name, tensor)
  pairs, bucket by bucket. The HF backend generates with the actor's own module,
  so it has nothing to copy.
- ``sleep`` / ``wake``: release the engine's memory (KV cache, its weight copy)
  while the actor trains, and take it back before generating.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from engine.types import GenerationOutput, GenerationRequest


class RolloutEngine(Protocol):
    def generate(self, request: GenerationRequest) -> GenerationOutput: ...

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


def trim_response(
    token_ids: list[int], eos_token_ids: set[int], ignore_eos: bool
) -> tuple[list[int], bool]:
    """Cut a generated row after its first EOS (kept: the policy learns to stop; what
    follows is padding). Returns the tokens and whether the row finished with EOS."""
    if not ignore_eos:
        for i, token in enumerate(token_ids):
            if token in eos_token_ids:
                return token_ids[: i + 1], True
    return token_ids, False


def finish_row(
    token_ids: list[int],
    logprobs: list[float] | None,
    eos_token_ids: set[int],
    ignore_eos: bool,
) -> tuple[list[int], list[float] | None, bool]:
    """One engine completion in the HF backend's terms: cut after the first EOS (kept),
    log-probs cut alike; finished when it ends with EOS."""
    tokens, finished = trim_response(list(token_ids), eos_token_ids, ignore_eos)
    if logprobs is not None:
        if len(logprobs) < len(tokens):
            raise RuntimeError(
                f"the engine returned {len(logprobs)} log-probs for {len(tokens)} tokens"
            )
        logprobs = list(logprobs[: len(tokens)])
    return tokens, logprobs, finished
