"""Qwen3: Llama's layout with a per-head RMSNorm of queries and keys before RoPE, no
biases unless ``attention_bias``; a sliding window only with ``use_sliding_window``.

=============================================  ==============================================
Hugging Face                                   Megatron-core
=============================================  ==============================================
layers.i.self_attn.{q,k}_norm.weight           ...self_attention.{q,k}_layernorm.weight
=============================================  ==============================================

Under tensor parallelism the norms are replicated and their gradients summed over TP
ranks (``finalize_model_grads``).
"""

from __future__ import annotations

from engine.models.families.base import ModelFamily, WeightNames, use_sliding_window

QK_NORM_NAMES = {
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
}

QWEN3 = ModelFamily(
    model_type="qwen3",
    qk_norm=True,
    sliding_window=use_sliding_window,
    weights=WeightNames(layer=QK_NORM_NAMES),
    # transformers' Qwen3 default head_dim is 128, wider than a tiny model's heads
    tiny=lambda size: {"head_dim": size.head_dim},
)
