"""flash-attention's variable-length kernel as a CPU reference, for the tests of the
packed and Ulysses forwards under a flash-attention model (flash-attention has no CPU
build, so the real kernel runs on GPUs only).

The reference is causal attention within each segment that transformers' flash path
cuts from the positions (``prepare_fa_kwargs_from_position_ids``: the ``cu_seqlens`` it
hands the real kernel), on one row of packed tokens with no mask, as that path takes
them. What runs for real is everything around the kernel: the packing, the positions,
transformers' derivation of the segments and, under Ulysses, the exchanges."""

from __future__ import annotations

import torch


def register(name: str, seen: list) -> None:
    """Register the reference as attention ``name`` (with flash's mask function: no mask
    without padding); each call appends the segments' bounds it used to ``seen``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, _attention(seen))
    AttentionMaskInterface.register(name, flash_attention_mask)


def use(model: torch.nn.Module, name: str) -> None:
    """Make ``model`` call attention ``name``. transformers refuses to switch to a flash
    name without its kernel installed; this sets it as ``set_attn_implementation`` would
    once its checks pass."""
    model.config._attn_implementation_internal = name


def _attention(seen: list):
    from transformers.modeling_flash_attention_utils import (
        _is_packed_sequence,
        prepare_fa_kwargs_from_position_ids,
    )

    def attention(module, q, k, v, attention_mask, *args, scaling=None, **kwargs):
        assert attention_mask is None and q.shape[0] == 1
        positions = kwargs["position_ids"]
        assert _is_packed_sequence(positions, batch_size=1)  # transformers' varlen branch
        (cu, _), _ = prepare_fa_kwargs_from_position_ids(positions)
        seen.append(cu.tolist())
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # grouped KV heads
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out = torch.empty_like(q)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            out[:, :, a:b] = torch.nn.functional.scaled_dot_product_attention(
                q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True, scale=scaling
            )
        return out.transpose(1, 2).contiguous(), None

    return attention
