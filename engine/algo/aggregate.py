"""Loss aggregation: how a (batch, time) matrix of per-token losses becomes a scalar.

The training backend splits a mini-batch into micro-batches (and over data-parallel
ranks) and accumulates gradients. For the sum of the micro-batch losses to equal the
loss of the whole mini-batch, every mode divides by a normaliser of the *whole*
mini-batch (``LossScale``), never of the micro-batch it happens to see. With
``scale=None`` the micro-batch is taken to be the whole batch.

Let m be the response mask, L the padded length, S the set of sequences with at
least one valid token (|S| its size over the whole mini-batch) and N = Σ m the valid
tokens of the whole mini-batch:

=========================  =====================================================
token-mean                 Σ_b Σ_t l·m / N                        (DAPO, verl's default)
seq-mean-token-sum         Σ_b (Σ_t l·m) / |S|
seq-mean-token-mean        Σ_b (Σ_t l·m / Σ_t m) / |S|            (original GRPO)
seq-mean-token-sum-norm    Σ_b Σ_t l·m / (|S| · C), C constant    (Dr.GRPO; C = max length)
token-sum                  Σ_b Σ_t l·m
=========================  =====================================================

Data-parallel note: FSDP averages gradients over the D ranks, so a backend whose ranks
each return (their part of) the global sum above multiplies the loss by D before
``backward`` to undo that mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.algo.masked import masked_sum
from engine.algo.registry import Registry


@dataclass(frozen=True)
class LossScale:
    """Normalisers of the whole mini-batch a micro-batch belongs to."""

    num_tokens: float  # valid tokens, N
    num_seqs: float  # sequences with at least one valid token, |S|

    @classmethod
    def of(cls, mask_BT: torch.Tensor) -> LossScale:
        """The normalisers of ``mask_BT`` taken as the whole batch."""
        return cls(
            num_tokens=float(mask_BT.sum()),
            num_seqs=float((mask_BT.sum(dim=-1) > 0).sum()),
        )

    @classmethod
    def of_micro_batches(cls, masks: list[torch.Tensor]) -> LossScale:
        """The normalisers of a mini-batch given as its micro-batches' masks."""
        parts = [cls.of(m) for m in masks]
        return cls(sum(p.num_tokens for p in parts), sum(p.num_seqs for p in parts))


# fn(loss_BT, mask_BT, scale, loss_scale_factor) -> scalar
Aggregator = Callable[[torch.Tensor, torch.Tensor, LossScale, float], torch.Tensor]
LOSS_AGGREGATIONS: Registry[Aggregator] = Registry("loss aggregation mode")


def aggregate_loss(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: str,
    scale: LossScale | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to the scalar the optimizer sees (see the module table).

    ``loss_scale_factor`` is the constant C of seq-mean-token-sum-norm (default: the
    padded length L of ``mask_BT``; pass the configured maximum response length so that
    it does not vary with how a batch was padded).
    """
    if scale is None:
        scale = LossScale.of(mask_BT)
    if loss_scale_factor is None:
        loss_scale_factor = float(mask_BT.shape[-1])
    return LOSS_AGGREGATIONS.get(mode)(loss_BT, mask_BT, scale, loss_scale_factor)


def _safe(denominator: float) -> float:
    # An all-masked batch has no tokens: its loss is 0, not NaN.
    return max(denominator, 1.0)


@LOSS_AGGREGATIONS.register("token-mean")
def _token_mean(loss_BT, mask_BT, scale, _c):
    return masked_sum(loss_BT, mask_BT) / _safe(scale.num_tokens)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_BT, mask_BT, scale, _c):
    return masked_sum(loss_BT, mask_BT) / _safe(scale.num_seqs)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_BT, mask_BT, scale, _c):
    per_seq_B = masked_sum(loss_BT, mask_BT, dim=-1) / mask_BT.sum(dim=-1).clamp(min=1)
    return per_seq_B.sum() / _safe(scale.num_seqs)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_BT, mask_BT, scale, c):
    return masked_sum(loss_BT, mask_BT) / (_safe(scale.num_seqs) * c)


@LOSS_AGGREGATIONS.register("token-sum")
def _token_sum(loss_BT, mask_BT, _scale, _c):
    return masked_sum(loss_BT, mask_BT)
