"""Per-token quantities computed from a language model's logits.

Logits are ``(..., V)`` (usually ``(B, T, V)``, or ``(N, V)`` for packed sequences) and
are by far the largest tensor of the loss computation: every helper here says what it
allocates, and ``chunk_size`` processes the positions (the second-to-last dimension of
the logits) in slices to bound the temporaries. Compute in float32: upcast bf16 logits
before calling (per chunk, if memory is tight).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def entropy_from_logits(logits_BTV: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of softmax(z) at every position: H = logsumexp(z) − Σ_v softmax(z)_v · z_v.

    Numerically stable: z is shifted by its row maximum first (H is shift-invariant), so
    logits of ±1e4 lose no precision; a ``-inf`` logit (a masked vocabulary entry) counts
    as probability 0 and gives neither NaN values nor NaN gradients. A row whose logits are
    all ``-inf`` has no distribution and gives NaN.

    Memory: besides the logits, three (…, V) float tensors live at once (the shifted
    logits, their softmax, and the shifted logits with ``-inf`` replaced by 0, which
    autograd keeps for the backward pass), plus a transient product and a boolean mask. Under
    ``torch.no_grad`` pass ``chunk_size`` to hold these for ``chunk_size`` positions only.
    """
    return _over_positions(_entropy, chunk_size, logits_BTV)


def logprobs_from_logits(
    logits_BTV: torch.Tensor, token_ids_BT: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """log softmax(z)[token] at every position: z[token] − logsumexp(z).

    No log-softmax of the whole vocabulary is materialised: the result is a gather and a
    logsumexp, whose only (…, V) temporary is internal to the logsumexp (and, with
    autograd, its backward's softmax). ``chunk_size`` bounds that temporary to
    ``chunk_size`` positions; the result and its gradient are the same as unchunked.
    """
    if token_ids_BT.shape != logits_BTV.shape[:-1]:
        raise ValueError(
            f"token ids of shape {tuple(token_ids_BT.shape)} do not match logits of shape"
            f" {tuple(logits_BTV.shape)}: expected ids of shape {tuple(logits_BTV.shape[:-1])}"
        )
    return _over_positions(_logprobs, chunk_size, logits_BTV, token_ids_BT)


def sum_squared_probs_from_logits(
    logits_BTV: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """Σ_v softmax(z)_v² at every position, as exp(logsumexp(2z) − 2·logsumexp(z)).

    The optimal token baseline's Logit-Gradient Proxy (``engine.algo.token_baseline``)
    reads it: the squared norm of ∇_z log softmax(z)[o] is 1 − 2π(o) + Σ_v π(v)². Exact
    for logits of ±1e4 (both logsumexps shift by the maximum); a ``-inf`` logit counts as
    probability 0. Memory as ``logprobs_from_logits``: a (…, V) temporary for 2z and the
    logsumexps' internal ones, bounded by ``chunk_size`` positions.
    """
    return _over_positions(_sum_squared_probs, chunk_size, logits_BTV)


def _sum_squared_probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    # The shift is a constant: H(z − c) = H(z) for any c, so its gradient is not needed.
    shifted = logits - logits.detach().amax(dim=-1, keepdim=True)
    probs = torch.softmax(shifted, dim=-1)
    # 0 · (−inf) is NaN; a -inf logit has probability 0 and contributes 0 to Σ p·z.
    finite = shifted.masked_fill(torch.isneginf(shifted), 0.0)
    return torch.logsumexp(shifted, dim=-1) - (probs * finite).sum(dim=-1)


def _logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _over_positions(
    fn: Callable[..., torch.Tensor],
    chunk_size: int | None,
    logits: torch.Tensor,
    *per_position: torch.Tensor,
) -> torch.Tensor:
    """fn(logits, *per_position), applied to slices of ``chunk_size`` positions.

    Positions are the logits' second-to-last dimension (the last of ``per_position``).
    """
    if chunk_size is None:
        return fn(logits, *per_position)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of positions, got {chunk_size}")
    if logits.dim() < 2:
        raise ValueError(f"logits need a position dimension, got shape {tuple(logits.shape)}")
    dim = logits.dim() - 2
    pieces = zip(
        logits.split(chunk_size, dim=dim),
        *(t.split(chunk_size, dim=dim) for t in per_position),
        strict=True,
    )
    return torch.cat([fn(*piece) for piece in pieces], dim=dim)
