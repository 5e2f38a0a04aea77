"""Qwen2 (Qwen2.5): Llama's layout with biases on q, k and v, never on o; its config
carries a sliding-window size that ``use_sliding_window`` switches on (no conversion
then). The default of ``engine.models.tiny``.
"""

from __future__ import annotations

from engine.models.families.base import ModelFamily, always, never, use_sliding_window

QWEN2 = ModelFamily(
    model_type="qwen2",
    qkv_bias=always,
    o_proj_bias=never,
    sliding_window=use_sliding_window,
)
