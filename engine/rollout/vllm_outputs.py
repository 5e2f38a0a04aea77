"""A vLLM completion in the engine's terms, shared by the batched calls
(engine.rollout.vllm) and the streamed ones (engine.rollout.vllm_stream)."""

from __future__ import annotations

from typing import Any

import torch

from engine.errors import EngineError
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


def routed_experts(output: Any, response_len: int) -> torch.Tensor:
    """(n, L, K) int16 experts of a request's prompt and kept response tokens, from the
    first prompt token (vLLM's ``routed_experts``: [tokens it ran, layers, k], the
    last token drawn never ran; L counts every decoder layer)."""
    import numpy as np

    routing = output.outputs[0].routed_experts
    if routing is None:
        raise EngineError(
            "vLLM returned no routed experts although actor_rollout_ref.rollout."
            "enable_rollout_routing_replay=true asked it to record them (this model's MoE"
            " kernel may not capture them): use actor_rollout_ref.actor.router_replay.mode=R2"
        )
    kept = len(output.prompt_token_ids) + response_len
    return torch.from_numpy(np.asarray(routing)[:kept].astype(np.int16))
