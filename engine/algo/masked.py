"""Masked reductions over padded (batch, time) tensors.

Every tensor in the algorithm library is right-padded to a common length; a
``mask_BT`` of 1.0 marks the real (response) tokens. Padding never contributes
to a sum, a mean, a variance or a normaliser.
"""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x·mask over ``dim`` (all elements when None). NaN/inf in masked slots are ignored."""
    # where(), not x * mask: 0 * inf would be NaN.
    values = torch.where(mask.bool(), x, torch.zeros_like(x))
    return values.sum() if dim is None else values.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x·mask / Σ mask. A slice with no valid element gives 0, not NaN."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid elements of ``x`` (a scalar).

    With ``unbiased`` the sum of squares is divided by N - 1 (Bessel's
    correction); a single valid element has variance 0.
    """
    mean = masked_mean(x, mask)
    sq = masked_sum(torch.where(mask.bool(), x - mean, 0.0) ** 2, mask)  # no inf·0 in backward
    count = mask.sum()
    if unbiased:
        return sq / (count - 1).clamp(min=1)
    return sq / count.clamp(min=1)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the valid elements; padding comes back as 0.

    With ``shift_mean=False`` the mean is added back (scale only), as PPO
    implementations do for returns.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = torch.where(mask.bool(), x - mean, 0.0) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))


def last_valid_index(mask_BT: torch.Tensor) -> torch.Tensor:
    """Per row, the index of the last position where the mask is set (0 for an empty
    row). Not ``mask.sum() - 1``: a multi-turn row has unmasked tool tokens between the
    model's turns."""
    positions_T = torch.arange(mask_BT.shape[-1], device=mask_BT.device)
    return torch.where(mask_BT > 0, positions_T, torch.zeros_like(positions_T)).amax(dim=-1)
