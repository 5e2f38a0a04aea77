"""Forward passes that turn a TokenBatch into per-response-token quantities, and the
micro-batches they run in.

Each micro-batch first drops the columns that are padding in all of its rows (the
left padding of its prompts, the right padding of its responses); the per-token
results are padded back to the batch's response length with zeros, which every
loss masks out. With batches of mixed lengths this skips most of the padding's
compute, at no cost to exactness.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from engine.algo.entropy import (
    entropy_from_logits,
    logprobs_from_logits,
    sum_squared_probs_from_logits,
)
from engine.controller.dispatch import take
from engine.train.fused_head import HeadOptions, quantities_from_model
from engine.types import TokenBatch


def trim_padding(tokens: TokenBatch) -> TokenBatch:
    """The same rows without the columns that are padding in every one of them."""
    attention = tokens.attention_mask_BS
    r_len = tokens.response_length
    response_width = max(1, int(attention[:, -r_len:].sum(dim=1).max()))
    prompt_width = int(attention[:, :-r_len].sum(dim=1).max())
    start = attention.shape[1] - r_len - prompt_width
    stop = attention.shape[1] - r_len + response_width
    return TokenBatch(
        input_ids_BS=tokens.input_ids_BS[:, start:stop],
        attention_mask_BS=attention[:, start:stop],
        position_ids_BS=tokens.position_ids_BS[:, start:stop],
        response_mask_BR=tokens.response_mask_BR[:, :response_width],
    )


def _pad_responses(values_BR: torch.Tensor, r_len: int) -> torch.Tensor:
    return nn.functional.pad(values_BR, (0, r_len - values_BR.shape[1]))


def _model_inputs(tokens: TokenBatch, device: torch.device) -> dict[str, torch.Tensor]:
    return {
        "input_ids": tokens.input_ids_BS.to(device),
        "attention_mask": tokens.attention_mask_BS.to(device),
        "position_ids": tokens.position_ids_BS.to(device),
    }


@functools.cache
def _takes_logits_to_keep(model_type: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


def response_logprobs(
    model: nn.Module,
    tokens: TokenBatch,
    device: torch.device,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    head: HeadOptions | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(o_t | prefix) for every response token, and optionally the entropy.

    Logits are divided by the sampling temperature, so that these log-probs are those
    of the distribution the rollout sampled from (PPO's ratio needs exactly that).
    The logit at position i predicts token i + 1: the response's logits are the R
    positions ending one before the last, and only those R + 1 are asked of the
    LM head where the model allows (``logits_to_keep``). The entropy carries a graph
    only with ``entropy_grad`` (it is a loss term only when its coefficient is not 0;
    otherwise it is a metric and its backward would be wasted). With ``head`` (the
    model's ``use_fused_kernels``) the logits are never whole: ``engine.train.fused_head``.
    """
    r_len = tokens.response_length
    if head is not None:
        logp, entropy, _ = _fused(
            model, tokens, device, temperature, head, entropy=with_entropy,
            entropy_grad=entropy_grad and torch.is_grad_enabled(), sum_sq=False,
        )  # fmt: skip
        return _pad_responses(logp, r_len), (
            _pad_responses(entropy, r_len) if with_entropy else None
        )
    trimmed, logits_BRV = _response_logits(model, tokens, device, temperature)
    logp = logprobs_from_logits(logits_BRV, trimmed.responses_BR.to(device))
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = _pad_responses(entropy_from_logits(logits_BRV), r_len)
    return _pad_responses(logp, r_len), entropy


def response_logprobs_sum_pi_squared(
    model: nn.Module,
    tokens: TokenBatch,
    device: torch.device,
    temperature: float = 1.0,
    head: HeadOptions | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(o_t | prefix) and Σ_v π(v | prefix)² at every response position, from the
    same temperature-scaled logits (the optimal token baseline reads both of π_old). Σπ²
    is another reduction over the vocabulary, so only the passes that need it ask."""
    r_len = tokens.response_length
    if head is not None:
        logp, _, sum_sq = _fused(
            model, tokens, device, temperature, head, entropy=False, entropy_grad=False,
            sum_sq=True,
        )  # fmt: skip
    else:
        trimmed, logits_BRV = _response_logits(model, tokens, device, temperature)
        logp = logprobs_from_logits(logits_BRV, trimmed.responses_BR.to(device))
        sum_sq = sum_squared_probs_from_logits(logits_BRV)
    return _pad_responses(logp, r_len), _pad_responses(sum_sq, r_len)


def _model_kwargs(model: nn.Module, kept: int) -> dict:
    kwargs: dict = {"use_cache": False}
    if _takes_logits_to_keep(type(model)):
        kwargs["logits_to_keep"] = kept + 1
    return kwargs


def _fused(model, tokens, device, temperature, head, **wanted):
    """``engine.train.fused_head.quantities_from_model`` on the trimmed batch."""
    trimmed = trim_padding(tokens)
    kept = trimmed.response_length
    return quantities_from_model(
        model,
        _model_inputs(trimmed, device),
        _model_kwargs(model, kept),
        trimmed.responses_BR.to(device),
        temperature,
        head,
        **wanted,
    )


def _response_logits(
    model: nn.Module, tokens: TokenBatch, device: torch.device, temperature: float
) -> tuple[TokenBatch, torch.Tensor]:
    """The batch without its all-padding columns, and the float32 logits (divided by the
    temperature) at the positions that predict its response tokens."""
    trimmed = trim_padding(tokens)
    kept = trimmed.response_length
    logits = model(**_model_inputs(trimmed, device), **_model_kwargs(model, kept)).logits
    logits_BRV = logits[:, -kept - 1 : -1, :].float()
    if temperature != 1.0:
        logits_BRV = logits_BRV / temperature
    return trimmed, logits_BRV


def response_values(model: nn.Module, tokens: TokenBatch, device: torch.device) -> torch.Tensor:
    """V(prefix) before each response token, from a one-output token-classification head."""
    r_len = tokens.response_length
    trimmed = trim_padding(tokens)
    kept = trimmed.response_length
    out = model(**_model_inputs(trimmed, device)).logits  # (B, S', 1)
    return _pad_responses(out[:, -kept - 1 : -1, 0].float(), r_len)


def micro_batches(rows: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, rows)) for i in range(0, rows, size)]


def token_budget_micro_batches(
    tokens: TokenBatch, max_tokens: int, device: torch.device
) -> list[slice]:
    """Contiguous micro-batches of at most ``max_tokens`` padded tokens each (rows ×
    the widest prompt + the widest response among them, as ``trim_padding`` leaves
    them); a row longer than the budget goes alone.

    Every rank of the data-parallel group must run the same number of forward passes
    (FSDP's collectives pair up), so the count is the largest any rank needs: ranks
    that need fewer split their biggest micro-batches, which only makes them cheaper.
    ``device`` is where the count is all-reduced (the collective backend's device).
    """
    r_len = tokens.response_length
    attention = tokens.attention_mask_BS
    prompt_lens = attention[:, :-r_len].sum(dim=1).tolist()
    response_lens = attention[:, -r_len:].sum(dim=1).clamp(min=1).tolist()
    parts: list[slice] = []
    start, widest_p, widest_r = 0, 0, 0
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        wp, wr = max(widest_p, p), max(widest_r, r)
        if i > start and (i + 1 - start) * (wp + wr) > max_tokens:
            parts.append(slice(start, i))
            start, wp, wr = i, p, r
        widest_p, widest_r = wp, wr
    if len(tokens):
        parts.append(slice(start, len(tokens)))
    return _split_to_count(parts, _group_max(len(parts), device))


def _group_max(count: int, device: torch.device) -> int:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return count
    value = torch.tensor([count], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


def _split_to_count(parts: list[slice], count: int) -> list[slice]:
    """Halve the micro-batch with the most rows until there are ``count`` of them
    (``count`` never exceeds the rows: each rank holds as many rows as the others)."""
    parts = list(parts)
    while len(parts) < count:
        i = max(range(len(parts)), key=lambda j: parts[j].stop - parts[j].start)
        part = parts[i]
        if part.stop - part.start < 2:
            raise ValueError(f"cannot make {count} micro-batches of {part.stop} rows")
        mid = (part.start + part.stop) // 2
        parts[i : i + 1] = [slice(part.start, mid), slice(mid, part.stop)]
    return parts


def plan_micro_batches(
    tokens: TokenBatch, size: int, max_tokens: int | None, device: torch.device
) -> list[slice]:
    """Fixed-size micro-batches, or token-budget ones when ``max_tokens`` is set
    (``use_dynamic_bsz``)."""
    if max_tokens is None:
        return micro_batches(len(tokens), size)
    return token_budget_micro_batches(tokens, max_tokens, device)


def forward_in_micro_batches(
    tokens: TokenBatch,
    size: int,
    max_tokens: int | None,
    device: torch.device,
    forward: Callable[[TokenBatch], torch.Tensor],
) -> torch.Tensor:
    """``forward`` (a per-response-token quantity) over the micro-batches of ``tokens``
    (``plan_micro_batches``), gathered on the CPU in row order."""
    rows = plan_micro_batches(tokens, size, max_tokens, device)
    return torch.cat([forward(take(tokens, r)).cpu() for r in rows])
