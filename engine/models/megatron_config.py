"""A Hugging Face config as Megatron-core's model arguments, and what cannot be converted.

Torch-free: ``rlctl`` checks a Megatron recipe against the model's config.json before it
launches anything (``conversion_problems`` through ``MegatronParallel.model_problems``).
The weights themselves are converted by ``engine.train.megatron_convert``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.models.families import MODEL_TYPES, family_rules
from engine.models.families.base import rope_kind, rope_settings, rope_theta


@dataclass(frozen=True)
class AttentionShape:
    num_heads: int  # query heads (H)
    num_kv_heads: int  # key/value heads = query groups (G)
    head_dim: int  # D

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_heads} must be a multiple of"
                f" num_key_value_heads {self.num_kv_heads}"
            )

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def of(cls, hf_config: Any) -> AttentionShape:
        heads = hf_config.num_attention_heads
        kv = getattr(hf_config, "num_key_value_heads", None) or heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        return cls(heads, kv, head_dim)


def _family(hf_config: Any):
    return family_rules(getattr(hf_config, "model_type", ""))


def is_mla(hf_config: Any) -> bool:
    """Multi-latent attention (DeepSeek-V3): queries and keys/values through low-rank
    projections, a rotary part per head beside a position-free one."""
    return _family(hf_config).mla


def num_experts(hf_config: Any) -> int:
    """Routed experts per MoE layer (Qwen's ``num_experts``, DeepSeek's
    ``n_routed_experts``); 0 for a dense model."""
    return getattr(hf_config, "num_experts", None) or getattr(hf_config, "n_routed_experts", 0) or 0


def moe_layers(hf_config: Any) -> list[bool]:
    """Which layers are mixture-of-experts (all False for a dense model), as the family
    says (DeepSeek's after the first ``first_k_dense_replace``; Qwen's every
    ``decoder_sparse_step``-th layer, except those in ``mlp_only_layers``)."""
    if not num_experts(hf_config):
        return [False] * hf_config.num_hidden_layers
    return _family(hf_config).moe_layers(hf_config)


def _moe_kwargs(hf_config: Any) -> dict[str, Any]:
    """The mixture-of-experts part of the TransformerConfig (empty for a dense model):
    routed as Hugging Face routes (the family's ``router``), no tokens dropped. The
    load-balancing loss is off, as in Hugging Face's forward (which adds it only with
    ``output_router_logits``), so that both backends train the same objective."""
    if not any(moe_layers(hf_config)):
        return {}
    kw: dict[str, Any] = {
        "num_moe_experts": num_experts(hf_config),
        "moe_router_topk": hf_config.num_experts_per_tok,
        "moe_ffn_hidden_size": hf_config.moe_intermediate_size,
        "moe_router_dtype": "fp32",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_layer_freq": [int(m) for m in moe_layers(hf_config)],
        **_family(hf_config).router(hf_config),
    }
    shared = shared_expert_size(hf_config)
    if shared:
        kw["moe_shared_expert_intermediate_size"] = shared
    return kw


def shared_expert_size(hf_config: Any) -> int:
    """The shared experts' width (Qwen2-MoE: one of ``shared_expert_intermediate_size``;
    DeepSeek: ``n_shared_experts`` of ``moe_intermediate_size``, as one MLP); 0 if none."""
    return _family(hf_config).shared_expert_size(hf_config)


def has_shared_expert_gate(hf_config: Any) -> bool:
    """Qwen2-MoE scales its shared expert by sigmoid(gate · x)."""
    return _family(hf_config).shared_expert_gate and shared_expert_size(hf_config) > 0


def transformer_config_kwargs(hf_config: Any) -> dict[str, Any]:
    """``megatron.core.transformer.TransformerConfig`` arguments (``MLATransformerConfig``
    ones for DeepSeek-V3) for a Hugging Face config of ``MODEL_TYPES`` (parallel sizes
    are added by the caller, from the plan)."""
    _refuse(conversion_problems(hf_config))
    family = _family(hf_config)
    shape = AttentionShape.of(hf_config)
    return {
        "num_layers": hf_config.num_hidden_layers,
        "hidden_size": hf_config.hidden_size,
        "ffn_hidden_size": hf_config.intermediate_size,
        "num_attention_heads": shape.num_heads,
        "num_query_groups": shape.num_kv_heads,
        "kv_channels": shape.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf_config.rms_norm_eps,
        "gated_linear_unit": True,
        "activation": "silu",  # the caller passes torch.nn.functional.silu
        "add_bias_linear": False,
        "add_qkv_bias": family.qkv_bias(hf_config),
        # Qwen3's per-head q/k norms; MLA's norms of the low-rank query and key/value
        "qk_layernorm": family.qk_norm or family.mla,
        "attention_dropout": float(getattr(hf_config, "attention_dropout", 0.0)),
        "hidden_dropout": 0.0,
        **_moe_kwargs(hf_config),
        **family.megatron_kwargs(hf_config),
    }


def gpt_model_kwargs(hf_config: Any) -> dict[str, Any]:
    """``megatron.core.models.gpt.GPTModel`` arguments other than the config and layer spec."""
    rope, kind = _rope(hf_config)
    theta = rope_theta(hf_config, rope)
    kwargs = {
        "vocab_size": hf_config.vocab_size,
        "max_sequence_length": hf_config.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_base": int(theta),
        "share_embeddings_and_output_weights": bool(hf_config.tie_word_embeddings),
    }
    _refuse(conversion_problems(hf_config))
    if kind == "llama3":  # Megatron-core's Llama 3.x constants, any factor
        kwargs.update(rope_scaling=True, rope_scaling_factor=float(rope["factor"]))
    return kwargs


_LLAMA3_FIXED_ROPE = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def conversion_problems(hf_config: Any) -> list[str]:
    """Why this model cannot be converted (empty when it can): an unknown model type,
    sliding-window attention, MLP or output-projection biases, a RoPE scaling
    Megatron-core lacks, and what the family itself refuses."""
    model_type = getattr(hf_config, "model_type", "")
    if model_type not in MODEL_TYPES:
        return [
            f"no Megatron-core conversion for model_type {model_type!r}; supported:"
            f" {', '.join(MODEL_TYPES)} (use strategy fsdp2 for this model)"
        ]
    family = _family(hf_config)
    problems = []
    if family.sliding_window(hf_config):
        problems.append(
            f"sliding-window attention (sliding_window={hf_config.sliding_window}) has no"
            " Megatron-core conversion here"
        )
    if getattr(hf_config, "mlp_bias", False):
        problems.append("mlp_bias=True has no Megatron-core conversion here (add_bias_linear)")
    if family.o_proj_bias(hf_config):
        # Megatron's only switch for it (add_bias_linear) puts biases on the MLP too; the
        # weight load would otherwise stop on the missing o_proj bias, after the start.
        problems.append(
            "attention_bias=True puts a bias on the attention's output projection, which has"
            " no Megatron-core conversion here (add_bias_linear)"
        )
    problems += family.problems(hf_config)
    rope, rope_type = _rope(hf_config)
    if rope_type not in family.rope_types:
        problems.append(
            f"RoPE scaling {rope.get('rope_type', rope.get('type'))!r} ({rope}) has no"
            f" Megatron-core equivalent here; supported: none, or llama3 with"
            f" {_LLAMA3_FIXED_ROPE}"
        )
    return problems


def _rope(hf_config: Any) -> tuple[dict[str, Any], str]:
    """The RoPE settings and their kind: "default", "llama3" (with Megatron-core's fixed
    constants), "yarn" (multi-latent attention converts it) or "unsupported"."""
    rope = rope_settings(hf_config)
    kind = rope_kind(rope)
    if kind == "llama3":
        fixed = all(rope.get(k) == v for k, v in _LLAMA3_FIXED_ROPE.items())
        return rope, "llama3" if fixed else "unsupported"
    return rope, kind if kind in ("default", "yarn") else "unsupported"


def _refuse(problems: list[str]) -> None:
    if problems:
        raise ValueError(problems[0])
