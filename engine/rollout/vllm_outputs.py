"""A vLLM completion in the engine's terms, shared by the batched calls
(engine.rollout.vllm) and the streamed ones (engine.rollout.vllm_stream)."""

from __future__ import annotations

from typing import Any

from engine.rollout.base import finish_row


def finish_completion(
    completion: Any, eos_token_ids: set[int], ignore_eos: bool, want_logprobs: bool
) -> tuple[list[int], list[float] | None, bool]:
    """One vLLM completion in the engine's terms (``finish_row``): its tokens cut after
    the first EOS, the sampled tokens' log-probs when asked, whether it finished."""
    ids = list(completion.token_ids)
    lps = (
        [step[token].logprob for token, step in zip(ids, completion.logprobs, strict=True)]
        if want_logprobs
        else None
    )
    return finish_row(ids, lps, eos_token_ids, ignore_eos)
