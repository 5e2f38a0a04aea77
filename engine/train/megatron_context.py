"""Context parallelism for the Megatron engine: a sequence split over the ranks of a
context-parallel group, attention over the whole sequence by gathering keys and values.

Layout. The (padded) sequence is cut into ``2·cp`` equal chunks and rank ``r`` holds
chunks ``r`` and ``2·cp − 1 − r`` (the "zigzag" split Megatron's rotary embedding expects,
``get_pos_emb_on_this_cp_rank``): under a causal mask early chunks see few keys and late
ones many, so pairing them gives every rank the same work.

Attention. Each rank gathers the keys and values of the whole sequence (``gather``,
summing their gradients over the group on the way back) and attends its own queries to
them with the rows of the causal + padding mask at its positions. This is the
"all-gather" form of context parallelism (Transformer Engine's ``cp_comm_type=
"all_gather"``): keys and values of the whole sequence on every rank, which with grouped
query attention is a fraction of the activations, and no ring of partial softmaxes.

Results. Per-position results (log-probs, entropy, values) are computed on each rank's
positions and gathered into sequence order; every rank then computes the same loss from
them, so the gradient going back to a rank is its own positions' (no sum).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def zigzag_index(length: int, cp: int, rank: int, device: torch.device | str = "cpu"):
    """The positions rank ``rank`` of ``cp`` holds in a sequence of ``length`` (a
    multiple of ``2·cp``): chunks ``rank`` and ``2·cp − 1 − rank``."""
    if length % (2 * cp):
        raise ValueError(f"a sequence of {length} cannot be cut into 2 × {cp} equal chunks")
    chunk = length // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    second = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk, device=device)
    return torch.cat([first, second])


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, dim: int, group: Any, sum_grads: bool):
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        length = local.shape[dim] * cp
        parts = [torch.empty_like(local) for _ in range(cp)]
        dist.all_gather(parts, local.contiguous(), group=group)
        order = torch.cat([zigzag_index(length, cp, r, local.device) for r in range(cp)])
        full = torch.empty_like(torch.cat(parts, dim=dim))
        full.index_copy_(dim, order, torch.cat(parts, dim=dim))
        ctx.dim, ctx.group, ctx.sum_grads = dim, group, sum_grads
        ctx.mine = zigzag_index(length, cp, rank, local.device)
        return full

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        if ctx.sum_grads:  # every rank's queries used these keys: their gradients add up
            grad = grad.contiguous()
            dist.all_reduce(grad, group=ctx.group)
        return grad.index_select(ctx.dim, ctx.mine), None, None, None


def gather(local: torch.Tensor, dim: int, group: Any, *, sum_grads: bool) -> torch.Tensor:
    """The whole sequence, in order, from each rank's zigzag positions along ``dim``.
    ``sum_grads``: the gathered tensor feeds different computations on each rank (keys
    and values), so their gradients are summed; otherwise every rank computes the same
    thing from it (the loss) and keeps its own positions' gradient."""
    return _GatherSequence.apply(local, dim, group, sum_grads)
