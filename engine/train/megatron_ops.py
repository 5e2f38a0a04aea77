"""Tensor helpers of the Megatron engine: the attention mask, the positions check,
log-probs, entropy and Σπ² over a vocabulary split across TP ranks, padding, atomic
saves."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from engine.errors import EngineError

# ---------------------------------------------------------------------------
# masks and log-probs


def attention_mask_B1SS(
    attention_mask_BS: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Megatron's boolean mask (True: masked): causal, padding keys masked. Every query
    keeps itself, so that padding rows stay finite (they are never read). ``rows``: the
    query positions to build (context parallelism: this rank's), all by default; the
    mask is (B, 1, len(rows), S), never the whole S × S when only some rows are used."""
    s = attention_mask_BS.shape[1]
    device = attention_mask_BS.device
    keys = torch.arange(s, device=device)
    queries = keys if rows is None else rows.to(device)
    causal = keys[None, :] <= queries[:, None]
    itself = keys[None, :] == queries[:, None]
    allowed = causal & (attention_mask_BS.bool()[:, None, None, :] | itself)
    return ~allowed


def check_consecutive_positions(position_ids_BS: torch.Tensor, mask_BS: torch.Tensor) -> None:
    """Megatron's rotary embedding uses the column index as the position; that equals HF's
    ``position_ids`` up to a per-row shift (which rotary attention ignores) only when a
    row's valid positions increase by one per column."""
    offset = position_ids_BS - torch.arange(position_ids_BS.shape[1], device=mask_BS.device)
    valid = mask_BS.bool()
    big = torch.iinfo(offset.dtype).max
    low = offset.masked_fill(~valid, big).amin(dim=1)
    high = offset.masked_fill(~valid, -big).amax(dim=1)
    bad = valid.any(dim=1) & (low != high)
    if bool(bad.any()):
        raise EngineError(
            "the Megatron engine needs each row's positions to be consecutive (one sequence"
            " per row, padding only on the left and right); packed rows are not supported"
        )


def vocab_parallel_logprobs_entropy(
    logits_BRv: torch.Tensor,
    targets_BR: torch.Tensor,
    with_entropy: bool,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log-probs of ``targets`` and the entropy from this TP rank's vocabulary slice of
    the logits, without gathering the vocabulary; the entropy carries a graph only with
    ``entropy_grad``.

    Each TP rank computes the same (replicated) loss from these, so the reductions use
    Megatron's ``reduce_from_tensor_model_parallel_region`` (all-reduce forward, identity
    backward): each rank's logits get exactly the gradient of their own slice."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

    group = ps.get_tensor_model_parallel_group()
    v_local = logits_BRv.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * v_local
    with torch.no_grad():  # the shift cancels in every result: no gradient through it
        top = logits_BRv.amax(dim=-1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    shifted = logits_BRv - top.unsqueeze(-1)
    exp = shifted.exp()
    sum_exp = reduce_from_tensor_model_parallel_region(exp.sum(dim=-1))
    log_z = sum_exp.log()
    local = targets_BR - start
    mine = (local >= 0) & (local < v_local)
    picked = shifted.gather(-1, local.clamp(0, v_local - 1).unsqueeze(-1)).squeeze(-1)
    target_logit = reduce_from_tensor_model_parallel_region(picked * mine)
    logp = target_logit - log_z
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            weighted = reduce_from_tensor_model_parallel_region((exp * shifted).sum(dim=-1))
            entropy = log_z - weighted / sum_exp
    return logp, entropy


def vocab_parallel_logprobs_at(logits_BRv: torch.Tensor, ids_BRK: torch.Tensor) -> torch.Tensor:
    """log-probs (B, R, K) of the tokens ``ids_BRK`` from this TP rank's vocabulary slice
    of the logits: the logsumexp and each id's logit (held by one rank, 0 on the others)
    all-reduced over the TP group, gradients as in ``vocab_parallel_logprobs_entropy``."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

    group = ps.get_tensor_model_parallel_group()
    v_local = logits_BRv.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * v_local
    with torch.no_grad():
        top = logits_BRv.amax(dim=-1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    shifted = logits_BRv - top.unsqueeze(-1)
    log_z = reduce_from_tensor_model_parallel_region(shifted.exp().sum(dim=-1)).log()
    local = ids_BRK - start
    mine = (local >= 0) & (local < v_local)
    picked = shifted.gather(-1, local.clamp(0, v_local - 1))
    return reduce_from_tensor_model_parallel_region(picked * mine) - log_z.unsqueeze(-1)


def vocab_parallel_sum_squared_probs(logits_BRv: torch.Tensor) -> torch.Tensor:
    """Σ_v softmax(z)_v² over the whole vocabulary from this TP rank's slice of the logits:
    with z shifted by the global maximum, Σ_v e^{2z_v} / (Σ_v e^{z_v})², each sum
    all-reduced over the TP group. For the π_old pass only (no gradient through it)."""
    from megatron.core import parallel_state as ps

    group = ps.get_tensor_model_parallel_group()
    with torch.no_grad():
        top = logits_BRv.amax(dim=-1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        exp = (logits_BRv - top.unsqueeze(-1)).exp()
        sums = torch.stack([exp.sum(dim=-1), exp.square().sum(dim=-1)])
        dist.all_reduce(sums, group=group)
        return sums[1] / sums[0].square()


def pad_responses(values_BR: torch.Tensor, r_len: int) -> torch.Tensor:
    return F.pad(values_BR, (0, r_len - values_BR.shape[1]))


def atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)
