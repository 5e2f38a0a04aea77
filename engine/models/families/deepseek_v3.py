"""DeepSeek-V3 (and R1): multi-latent attention (queries and keys/values through
low-rank projections, a rotary part per head beside a position-free one, YaRN) and
mixture-of-experts layers after the first ``first_k_dense_replace``, routed by sigmoid
scores with a fixed per-expert bias among groups of experts, with shared experts.

Megatron-core: ``MLATransformerConfig``; its MLA rotates de-interleaved rotary
dimensions, as HF's ``rope_interleave``. Weights (``shared_experts``: one MLP of
``n_shared_experts`` × the expert width):

=============================================  ==============================================
Hugging Face                                   Megatron-core
=============================================  ==============================================
layers.i.self_attn.q_a_proj.weight             ...self_attention.linear_q_down_proj.weight
layers.i.self_attn.q_a_layernorm.weight        ...self_attention.q_layernorm.weight
layers.i.self_attn.q_b_proj.weight             ...self_attention.linear_q_up_proj.weight
layers.i.self_attn.q_proj.weight (no lora)     ...self_attention.linear_q_proj.weight
layers.i.self_attn.kv_a_proj_with_mqa.weight   ...self_attention.linear_kv_down_proj.weight
layers.i.self_attn.kv_a_layernorm.weight       ...self_attention.kv_layernorm.weight
layers.i.self_attn.kv_b_proj.weight            ...self_attention.linear_kv_up_proj.weight
layers.i.mlp.gate.weight (the router)          ...mlp.router.weight
layers.i.mlp.gate.e_score_correction_bias      ...mlp.router.expert_bias (a buffer)
layers.i.mlp.shared_experts.*_proj.weight      ...mlp.shared_experts.linear_fc{1,2}.weight
=============================================  ==============================================
"""

from __future__ import annotations

from typing import Any

from engine.models.families.base import (
    ROPE_TYPES,
    ROUTER_NAMES,
    Config,
    ModelFamily,
    TinySize,
    WeightNames,
    read,
    rope_kind,
    rope_settings,
    rope_theta,
)

MLA_NAMES = {  # multi-latent attention, Megatron-core's local spec
    "self_attn.q_a_proj.weight": "self_attention.linear_q_down_proj.weight",
    "self_attn.q_a_layernorm.weight": "self_attention.q_layernorm.weight",
    "self_attn.q_b_proj.weight": "self_attention.linear_q_up_proj.weight",
    "self_attn.q_proj.weight": "self_attention.linear_q_proj.weight",  # no q_lora_rank
    "self_attn.kv_a_proj_with_mqa.weight": "self_attention.linear_kv_down_proj.weight",
    "self_attn.kv_a_layernorm.weight": "self_attention.kv_layernorm.weight",
    "self_attn.kv_b_proj.weight": "self_attention.linear_kv_up_proj.weight",
    "mlp.gate.e_score_correction_bias": "mlp.router.expert_bias",
}


def _moe_layers(cfg: Config) -> list[bool]:
    first = read(cfg, "first_k_dense_replace", 0)
    return [i >= first for i in range(int(read(cfg, "num_hidden_layers")))]


def _shared_expert_size(cfg: Config) -> int:
    """``n_shared_experts`` of the expert width, run as one MLP."""
    return (read(cfg, "n_shared_experts", 0) or 0) * read(cfg, "moe_intermediate_size")


def _router(cfg: Config) -> dict[str, Any]:
    """Sigmoid scores; the top k chosen on score + a fixed per-expert bias
    (e_score_correction_bias, not updated here: HF's forward keeps it) among the top
    ``topk_group`` of ``n_group`` groups (a group scored by its best two), the weights
    the chosen scores renormalised, × routed_scaling_factor."""
    kw: dict[str, Any] = {
        "moe_router_score_function": "sigmoid",
        "moe_router_pre_softmax": False,
        "moe_router_enable_expert_bias": True,
        "moe_router_bias_update_rate": 0.0,
        "moe_router_topk_scaling_factor": float(read(cfg, "routed_scaling_factor")),
    }
    if read(cfg, "n_group", 1) > 1:
        kw.update(
            moe_router_num_groups=read(cfg, "n_group"),
            moe_router_group_topk=read(cfg, "topk_group"),
        )
    return kw


def _mla_kwargs(cfg: Config) -> dict[str, Any]:
    """``MLATransformerConfig`` arguments: the low-rank sizes, the head dimensions and the
    rotary embedding (plain, or YaRN with its attention scaling)."""
    rope = rope_settings(cfg)
    kw: dict[str, Any] = {
        "multi_latent_attention": True,
        "q_lora_rank": read(cfg, "q_lora_rank"),
        "kv_lora_rank": read(cfg, "kv_lora_rank"),
        "qk_head_dim": read(cfg, "qk_nope_head_dim"),
        "qk_pos_emb_head_dim": read(cfg, "qk_rope_head_dim"),
        "v_head_dim": read(cfg, "v_head_dim"),
        "rotary_base": float(rope_theta(cfg, rope)),
    }
    if rope_kind(rope) == "yarn":
        kw.update(
            rope_type="yarn",
            rotary_scaling_factor=float(rope["factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            beta_fast=float(rope.get("beta_fast") or 32),
            beta_slow=float(rope.get("beta_slow") or 1),
            mscale=float(rope.get("mscale") or 1.0),
            mscale_all_dim=float(rope.get("mscale_all_dim") or 0.0),
        )
    else:
        kw.update(rope_type="rope", rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=0.0)
    return kw


def _problems(cfg: Config) -> list[str]:
    """Settings Megatron-core routes or rotates differently."""
    problems = []
    if not read(cfg, "rope_interleave", True):
        problems.append(
            "rope_interleave=False: Megatron-core's multi-latent attention rotates the"
            " interleaved layout only"
        )
    if not read(cfg, "norm_topk_prob", True):
        problems.append(
            "norm_topk_prob=False with sigmoid routing: Megatron-core always renormalises"
            " the chosen experts' weights"
        )
    groups, topk = read(cfg, "n_group", 1), read(cfg, "num_experts_per_tok")
    if groups > 1 and topk // read(cfg, "topk_group") != 2:
        problems.append(
            f"num_experts_per_tok {topk} // topk_group {read(cfg, 'topk_group')} must be 2:"
            " Hugging Face scores a group by its best two experts, Megatron-core by its"
            " best k / topk_group"
        )
    return problems


def _tiny(size: TinySize) -> dict[str, Any]:
    """The first layer dense, then experts of half the residual's width in 4 groups, 4
    per token from the best 2 groups, a shared expert, a routing bias."""
    head, hidden = size.head_dim, size.hidden_size
    return {
        "num_key_value_heads": size.num_heads,
        "q_lora_rank": hidden // 2,
        "kv_lora_rank": hidden // 4,
        "qk_nope_head_dim": head,
        "qk_rope_head_dim": head // 2,
        "v_head_dim": head,
        "n_routed_experts": size.num_experts or 8,
        "num_experts_per_tok": 4,
        "n_group": 4,
        "topk_group": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": hidden // 2,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
    }


DEEPSEEK_V3 = ModelFamily(
    model_type="deepseek_v3",
    mla=True,
    moe_layers=_moe_layers,
    shared_expert_size=_shared_expert_size,
    router=_router,
    rope_types=(*ROPE_TYPES, "yarn"),  # MLA's own YaRN embedding
    megatron_kwargs=_mla_kwargs,
    problems=_problems,
    weights=WeightNames(layer={**MLA_NAMES, **ROUTER_NAMES}, shared_expert="shared_experts"),
    tiny=_tiny,
)
