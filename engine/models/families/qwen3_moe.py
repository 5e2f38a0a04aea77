"""Qwen3-MoE: Qwen3's attention (per-head q/k norms) with Qwen2-MoE's routing (softmax,
top k, renormalised with ``norm_topk_prob``) and no shared expert. Its tiny model makes
every layer a mixture of experts of the residual's width, two per token, renormalised.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.models.families.base import ROUTER_NAMES, TinySize, WeightNames
from engine.models.families.qwen3 import QK_NORM_NAMES, QWEN3


def _tiny(size: TinySize) -> dict[str, Any]:
    return {
        "head_dim": size.head_dim,
        "num_experts": size.num_experts or 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": size.hidden_size,
        "norm_topk_prob": True,
    }


QWEN3_MOE = replace(
    QWEN3,
    model_type="qwen3_moe",
    weights=WeightNames(layer={**QK_NORM_NAMES, **ROUTER_NAMES}),
    tiny=_tiny,
)
