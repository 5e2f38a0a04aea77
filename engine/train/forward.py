"""Forward passes that turn a TokenBatch into per-response-token quantities."""

from __future__ import annotations

import torch
from torch import nn

from engine.algo.entropy import entropy_from_logits, logprobs_from_logits
from engine.types import TokenBatch


def _model_inputs(tokens: TokenBatch, device: torch.device) -> dict[str, torch.Tensor]:
    return {
        "input_ids": tokens.input_ids_BS.to(device),
        "attention_mask": tokens.attention_mask_BS.to(device),
        "position_ids": tokens.position_ids_BS.to(device),
    }


def response_logprobs(
    model: nn.Module,
    tokens: TokenBatch,
    device: torch.device,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(o_t | prefix) for every response token, and optionally the entropy.

    Logits are divided by the sampling temperature, so that these log-probs are those
    of the distribution the rollout sampled from (PPO's ratio needs exactly that).
    The logit at position i predicts token i + 1: the response's logits are the R
    positions ending one before the last.
    """
    r_len = tokens.response_length
    logits = model(**_model_inputs(tokens, device), use_cache=False).logits
    logits_BRV = logits[:, -r_len - 1 : -1, :].float()
    if temperature != 1.0:
        logits_BRV = logits_BRV / temperature
    responses = tokens.responses_BR.to(device)
    logp = logprobs_from_logits(logits_BRV, responses)
    entropy = entropy_from_logits(logits_BRV) if with_entropy else None
    return logp, entropy


def response_values(model: nn.Module, tokens: TokenBatch, device: torch.device) -> torch.Tensor:
    """V(prefix) before each response token, from a one-output token-classification head."""
    r_len = tokens.response_length
    out = model(**_model_inputs(tokens, device)).logits  # (B, S, 1)
    return out[:, -r_len - 1 : -1, 0].float()


def micro_batches(rows: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, rows)) for i in range(0, rows, size)]
