"""Llama (2, 3.x) and Mistral: the plain decoder that ``ModelFamily``'s defaults
describe, nothing of their own.

Shape: RMSNorm, gated SiLU MLP, grouped-query attention; ``attention_bias`` puts biases
on q, k, v and o. RoPE: none, or Llama 3.x's scaling (Megatron-core's fixed constants).
Weights: only the names every family has (``engine.train.megatron_convert``). Mistral's
sliding window (v0.1: ``sliding_window`` 4096) has no conversion; v0.2 onwards leave it
null, and so does its tiny model.
"""

from __future__ import annotations

from engine.models.families.base import ModelFamily

LLAMA = ModelFamily(model_type="llama")

MISTRAL = ModelFamily(model_type="mistral", tiny=lambda size: {"sliding_window": None})
