"""Forward passes that turn a TokenBatch into per-response-token quantities, and the
micro-batches they run in.

Each micro-batch first drops the columns that are padding in all of its rows (the
left padding of its prompts, the right padding of its responses); the per-token
results are padded back to the batch's response length with zeros, which every
loss masks out. With batches of mixed lengths this skips most of the padding's
compute, at no cost to exactness. With ``packed`` (``model.use_remove_padding``) no
padding reaches the model at all: the rows run end to end (``engine.train.packing``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from engine.algo.entropy import (
    logprobs_from_logits,
    sum_squared_probs_from_logits,
)
from engine.controller.dispatch import take
from engine.train.fused_head import HeadOptions, quantities_from_model
from engine.train.logit_options import PLAIN, LogitOptions
from engine.train.packing import ModelCall, model_call, trim_padding
from engine.train.routing_replay import NO_REPLAY
from engine.types import TokenBatch

__all__ = ["trim_padding"]  # imported from here by the Megatron engine


def response_logprobs(
    model: nn.Module,
    tokens: TokenBatch,
    device: torch.device,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    head: HeadOptions | None = None,
    packed: bool = False,
    ulysses=None,
    options: LogitOptions = PLAIN,
    routing=NO_REPLAY,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(o_t | prefix) for every response token, and optionally the entropy.

    Logits are divided by the sampling temperature, so that these log-probs are those
    of the distribution the rollout sampled from (PPO's ratio needs exactly that).
    The logit at position i predicts token i + 1: only the positions before response
    tokens are asked of the LM head where the model allows (``logits_to_keep``). The
    entropy carries a graph only with ``entropy_grad`` (it is a loss term only when its
    coefficient is not 0; otherwise it is a metric and its backward would be wasted).
    With ``head`` (the model's ``use_fused_kernels``) the logits are never whole:
    ``engine.train.fused_head``. ``packed``: the rows end to end, no padding
    (``engine.train.packing``). ``ulysses``: this rank's sequence-parallel group
    (``engine.train.ulysses``; packed only). ``options``: the role's entropy chunking and
    checkpointing and torch.compile (``engine.train.logit_options``). ``routing``: the
    engine's MoE routing replay (``engine.train.routing_replay``), around the model call.
    """
    call = model_call(model, tokens, device, packed, ulysses)
    if head is not None:
        with routing.around(tokens, call.token_index):
            logp, entropy, _ = _fused(
                model, call, temperature, head, entropy=with_entropy,
                entropy_grad=entropy_grad and torch.is_grad_enabled(), sum_sq=False,
            )  # fmt: skip
        return call.unpack(logp), (call.unpack(entropy) if with_entropy else None)
    with routing.around(tokens, call.token_index):
        logits_BRV = _response_logits(model, call, temperature)
    logp = options.logprobs(logits_BRV, call.targets)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = call.unpack(options.entropy(logits_BRV))
    return call.unpack(logp), entropy


def response_logprobs_at(
    model: nn.Module,
    tokens: TokenBatch,
    device: torch.device,
    ids_BRK: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    packed: bool = False,
    options: LogitOptions = PLAIN,
    routing=NO_REPLAY,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``response_logprobs``, and log π(v | prefix) of the K tokens ``ids_BRK`` names at
    each response position (distillation's teacher top-k), (B, R, K), from the same
    logits. Needs the whole logits: not with the fused head or Ulysses. ``routing``: as
    ``response_logprobs``'s."""
    call = model_call(model, tokens, device, packed)
    if call.pack is None:
        raise ValueError("log-probs at given tokens need the padded or packed layout")
    with routing.around(tokens, call.token_index):
        logits_BRV = _response_logits(model, call, temperature)
    logp = options.logprobs(logits_BRV, call.targets)
    log_z = torch.logsumexp(logits_BRV, dim=-1, keepdim=True)
    at = logits_BRV.gather(-1, call.pack(ids_BRK.long())) - log_z
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = call.unpack(options.entropy(logits_BRV))
    at_BRK = torch.stack([call.unpack(at[..., k]) for k in range(at.shape[-1])], dim=-1)
    return call.unpack(logp), entropy, at_BRK


@torch.no_grad()
def response_topk(
    model: nn.Module, tokens: TokenBatch, device: torch.device, k: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """A teacher's scores: log π(o_t | prefix) of each response token (temperature 1)
    and, with ``k`` > 0, its k most likely tokens at each position and their log-probs
    (B, R, K), padded rows' zeros. Padded layout, for a plain Hugging Face model."""
    call = model_call(model, tokens, device, packed=False)
    logp_BRV = torch.log_softmax(_response_logits(model, call, 1.0), dim=-1)
    logp = logp_BRV.gather(-1, call.targets.unsqueeze(-1)).squeeze(-1)
    if k < 1:
        return call.unpack(logp), None, None
    values, ids = logp_BRV.topk(k, dim=-1)
    real = tokens.response_mask_BR.to(device).bool()  # the rows' own tokens, not padding

    def unpack(x_BRK: torch.Tensor) -> torch.Tensor:
        out = torch.stack([call.unpack(x_BRK[..., j]) for j in range(k)], dim=-1)
        return out * real.unsqueeze(-1)

    return call.unpack(logp) * real, unpack(values), unpack(ids)


def response_logprobs_sum_pi_squared(
    model: nn.Module,
    tokens: TokenBatch,
    device: torch.device,
    temperature: float = 1.0,
    head: HeadOptions | None = None,
    packed: bool = False,
    ulysses=None,
    routing=NO_REPLAY,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(o_t | prefix) and Σ_v π(v | prefix)² at every response position, from the
    same temperature-scaled logits (the optimal token baseline reads both of π_old). Σπ²
    is another reduction over the vocabulary, so only the passes that need it ask."""
    call = model_call(model, tokens, device, packed, ulysses)
    if head is not None:
        with routing.around(tokens, call.token_index):
            logp, _, sum_sq = _fused(
                model, call, temperature, head, entropy=False, entropy_grad=False, sum_sq=True
            )
    else:
        with routing.around(tokens, call.token_index):
            logits_BRV = _response_logits(model, call, temperature)
        logp = logprobs_from_logits(logits_BRV, call.targets)
        sum_sq = sum_squared_probs_from_logits(logits_BRV)
    return call.unpack(logp), call.unpack(sum_sq)


def _fused(model, call: ModelCall, temperature, head, **wanted):
    """``engine.train.fused_head.quantities_from_model`` on the model call."""
    if call.select is not None:
        raise ValueError(
            f"{type(model).__name__} takes no logits_to_keep, which the fused head needs with"
            " packed sequences: set actor_rollout_ref.model.use_remove_padding=false or"
            " use_fused_kernels=false"
        )
    return quantities_from_model(
        model, call.inputs, call.kwargs, call.targets, temperature, head, **wanted
    )


def _response_logits(model: nn.Module, call: ModelCall, temperature: float) -> torch.Tensor:
    """The float32 logits (divided by the temperature) at the positions that predict the
    call's response tokens."""
    logits = model(**call.inputs, **call.kwargs).logits
    logits_BRV = call.head_positions(logits).float()
    if temperature != 1.0:
        logits_BRV = logits_BRV / temperature
    return logits_BRV


def response_values(
    model: nn.Module,
    tokens: TokenBatch,
    device: torch.device,
    packed: bool = False,
    ulysses=None,
) -> torch.Tensor:
    """V(prefix) before each response token, from a one-output token-classification head."""
    call = model_call(model, tokens, device, packed, ulysses)
    # use_cache=False: with a cache transformers ignores the packed rows' positions
    out = model(**call.inputs, **call.kwargs).logits  # (B', S', 1)
    return call.unpack(call.head_positions(out)[..., 0].float())


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
