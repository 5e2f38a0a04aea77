"""Qwen2-MoE: Qwen2's attention (q/k/v biases while ``qkv_bias``, on by default) with
mixture-of-experts layers (every ``decoder_sparse_step``-th but ``mlp_only_layers``),
routed by a softmax over the experts, top k (renormalised with ``norm_topk_prob``), and
one always-on shared expert of ``shared_expert_intermediate_size`` scaled by
sigmoid(gate · x).

=============================================  ==============================================
Hugging Face                                   Megatron-core
=============================================  ==============================================
layers.i.mlp.gate.weight (the router)          decoder.layers.i.mlp.router.weight
layers.i.mlp.shared_expert.{gate,up,down}      ...mlp.shared_experts.linear_fc{1,2}.weight
_proj.weight
layers.i.mlp.shared_expert_gate.weight         ...mlp.shared_experts.gate_weight
=============================================  ==============================================
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.models.families.base import (
    ROUTER_NAMES,
    Config,
    TinySize,
    WeightNames,
    attention_bias,
    read,
)
from engine.models.families.qwen2 import QWEN2


def _qkv_bias(cfg: Config) -> bool:
    return bool(read(cfg, "qkv_bias", True)) or attention_bias(cfg)


def _tiny(size: TinySize) -> dict[str, Any]:
    return {
        "num_experts": size.num_experts or 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": size.hidden_size,
        "shared_expert_intermediate_size": size.hidden_size,
    }


QWEN2_MOE = replace(
    QWEN2,
    model_type="qwen2_moe",
    qkv_bias=_qkv_bias,
    shared_expert_gate=True,
    weights=WeightNames(
        layer={**ROUTER_NAMES, "mlp.shared_expert_gate.weight": "mlp.shared_experts.gate_weight"}
    ),
    tiny=_tiny,
)
