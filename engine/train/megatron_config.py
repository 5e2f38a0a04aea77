"""A Hugging Face config as Megatron-core's model arguments, and what cannot be converted.

Torch-free: ``rlctl`` checks a Megatron recipe against the model's config.json before it
launches anything (``conversion_problems`` through ``MegatronParallel.model_problems``).
The weights themselves are converted by ``engine.train.megatron_convert``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Hugging Face model types with a conversion (Llama, Mistral, Qwen2/3 and their MoE,
# DeepSeek-V3 with its multi-latent attention).
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "deepseek_v3")


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


def is_mla(hf_config: Any) -> bool:
    """Multi-latent attention (DeepSeek-V3): queries and keys/values through low-rank
    projections, a rotary part per head beside a position-free one."""
    return getattr(hf_config, "model_type", "") == "deepseek_v3"


def num_experts(hf_config: Any) -> int:
    """Routed experts per MoE layer (Qwen's ``num_experts``, DeepSeek's
    ``n_routed_experts``); 0 for a dense model."""
    return getattr(hf_config, "num_experts", None) or getattr(hf_config, "n_routed_experts", 0) or 0


def moe_layers(hf_config: Any) -> list[bool]:
    """Which layers are mixture-of-experts (all False for a dense model): DeepSeek's after
    the first ``first_k_dense_replace``; Qwen's every ``decoder_sparse_step``-th layer,
    except those in ``mlp_only_layers``."""
    layers = hf_config.num_hidden_layers
    if not num_experts(hf_config):
        return [False] * layers
    if is_mla(hf_config):
        return [i >= hf_config.first_k_dense_replace for i in range(layers)]
    step = getattr(hf_config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(hf_config, "mlp_only_layers", None) or ())
    return [i not in dense and (i + 1) % step == 0 for i in range(layers)]


def _moe_kwargs(hf_config: Any) -> dict[str, Any]:
    """The mixture-of-experts part of the TransformerConfig (empty for a dense model).

    Routing as Hugging Face's Qwen MoE blocks: softmax over the experts in fp32, top k;
    ``norm_topk_prob`` renormalises the k weights, which equals Megatron's softmax over
    the k selected logits (``moe_router_pre_softmax=False``); without it the weights
    are the full softmax's (``pre_softmax=True``). No tokens are dropped. The
    load-balancing loss is off, as in Hugging Face's forward (which adds it only with
    ``output_router_logits``), so that both backends train the same objective."""
    if not any(moe_layers(hf_config)):
        return {}
    kw: dict[str, Any] = {
        "num_moe_experts": num_experts(hf_config),
        "moe_router_topk": hf_config.num_experts_per_tok,
        "moe_ffn_hidden_size": hf_config.moe_intermediate_size,
        "moe_router_pre_softmax": not getattr(hf_config, "norm_topk_prob", False),
        "moe_router_score_function": "softmax",
        "moe_router_dtype": "fp32",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_layer_freq": [int(m) for m in moe_layers(hf_config)],
    }
    shared = shared_expert_size(hf_config)
    if shared:
        kw["moe_shared_expert_intermediate_size"] = shared
    if is_mla(hf_config):
        # DeepSeek-V3: sigmoid scores; the top k chosen on score + a fixed per-expert bias
        # (e_score_correction_bias, not updated here: HF's forward keeps it) among the
        # top ``topk_group`` of ``n_group`` groups (a group scored by its best two), the
        # weights the chosen scores renormalised, × routed_scaling_factor.
        kw.update(
            moe_router_score_function="sigmoid",
            moe_router_pre_softmax=False,
            moe_router_enable_expert_bias=True,
            moe_router_bias_update_rate=0.0,
            moe_router_topk_scaling_factor=float(hf_config.routed_scaling_factor),
        )
        if (getattr(hf_config, "n_group", 1) or 1) > 1:
            kw.update(
                moe_router_num_groups=hf_config.n_group,
                moe_router_group_topk=hf_config.topk_group,
            )
    return kw


def shared_expert_size(hf_config: Any) -> int:
    """The shared experts' width (Qwen2-MoE: one of ``shared_expert_intermediate_size``;
    DeepSeek: ``n_shared_experts`` of ``moe_intermediate_size``, as one MLP); 0 if none."""
    if is_mla(hf_config):
        return (getattr(hf_config, "n_shared_experts", 0) or 0) * hf_config.moe_intermediate_size
    return getattr(hf_config, "shared_expert_intermediate_size", 0) or 0


def has_shared_expert_gate(hf_config: Any) -> bool:
    """Qwen2-MoE scales its shared expert by sigmoid(gate · x)."""
    return hf_config.model_type == "qwen2_moe" and shared_expert_size(hf_config) > 0


def transformer_config_kwargs(hf_config: Any) -> dict[str, Any]:
    """``megatron.core.transformer.TransformerConfig`` arguments (``MLATransformerConfig``
    ones for DeepSeek-V3) for a Hugging Face config of ``MODEL_TYPES`` (parallel sizes
    are added by the caller, from the plan)."""
    _refuse(conversion_problems(hf_config))
    model_type = hf_config.model_type
    shape = AttentionShape.of(hf_config)
    mla = _mla_kwargs(hf_config) if is_mla(hf_config) else {}
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
        "add_qkv_bias": model_type == "qwen2"
        or (model_type == "qwen2_moe" and getattr(hf_config, "qkv_bias", True))
        or bool(getattr(hf_config, "attention_bias", False)),
        # Qwen3's per-head q/k norms; MLA's norms of the low-rank query and key/value
        "qk_layernorm": model_type in ("qwen3", "qwen3_moe") or bool(mla),
        "attention_dropout": float(getattr(hf_config, "attention_dropout", 0.0)),
        "hidden_dropout": 0.0,
        **_moe_kwargs(hf_config),
        **mla,
    }


def _mla_kwargs(hf_config: Any) -> dict[str, Any]:
    """``MLATransformerConfig`` arguments: the low-rank sizes, the head dimensions and the
    rotary embedding (plain, or YaRN with its attention scaling). Megatron's MLA rotates
    de-interleaved rotary dimensions, as HF's ``rope_interleave``."""
    rope, kind = _rope(hf_config)
    kw: dict[str, Any] = {
        "multi_latent_attention": True,
        "q_lora_rank": hf_config.q_lora_rank,
        "kv_lora_rank": hf_config.kv_lora_rank,
        "qk_head_dim": hf_config.qk_nope_head_dim,
        "qk_pos_emb_head_dim": hf_config.qk_rope_head_dim,
        "v_head_dim": hf_config.v_head_dim,
        "rotary_base": float(_rope_theta(hf_config, rope)),
    }
    if kind == "yarn":
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


def gpt_model_kwargs(hf_config: Any) -> dict[str, Any]:
    """``megatron.core.models.gpt.GPTModel`` arguments other than the config and layer spec."""
    rope, kind = _rope(hf_config)
    theta = _rope_theta(hf_config, rope)
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
    sliding-window attention, MLP biases, a RoPE scaling Megatron-core lacks."""
    model_type = getattr(hf_config, "model_type", "")
    if model_type not in MODEL_TYPES:
        return [
            f"no Megatron-core conversion for model_type {model_type!r}; supported:"
            f" {', '.join(MODEL_TYPES)} (use strategy fsdp2 for this model)"
        ]
    problems = []
    windowed = (
        getattr(hf_config, "use_sliding_window", False)
        if model_type.startswith("qwen")
        else getattr(hf_config, "sliding_window", None) is not None
    )
    if windowed:
        problems.append(
            f"sliding-window attention (sliding_window={hf_config.sliding_window}) has no"
            " Megatron-core conversion here"
        )
    if getattr(hf_config, "mlp_bias", False):
        problems.append("mlp_bias=True has no Megatron-core conversion here (add_bias_linear)")
    rope, rope_type = _rope(hf_config)
    if is_mla(hf_config):
        problems += _mla_problems(hf_config)
        if rope_type == "yarn":
            rope_type = "default"  # MLA's own YaRN embedding
    if rope_type not in ("default", "llama3"):
        problems.append(
            f"RoPE scaling {rope.get('rope_type', rope.get('type'))!r} ({rope}) has no"
            f" Megatron-core equivalent here; supported: none, or llama3 with"
            f" {_LLAMA3_FIXED_ROPE}"
        )
    return problems


def _mla_problems(hf_config: Any) -> list[str]:
    """DeepSeek-V3 settings Megatron-core routes or rotates differently."""
    problems = []
    if not getattr(hf_config, "rope_interleave", True):
        problems.append(
            "rope_interleave=False: Megatron-core's multi-latent attention rotates the"
            " interleaved layout only"
        )
    if not getattr(hf_config, "norm_topk_prob", True):
        problems.append(
            "norm_topk_prob=False with sigmoid routing: Megatron-core always renormalises"
            " the chosen experts' weights"
        )
    groups, topk = getattr(hf_config, "n_group", 1) or 1, hf_config.num_experts_per_tok
    if groups > 1 and topk // hf_config.topk_group != 2:
        problems.append(
            f"num_experts_per_tok {topk} // topk_group {hf_config.topk_group} must be 2:"
            " Hugging Face scores a group by its best two experts, Megatron-core by its"
            " best k / topk_group"
        )
    return problems


def _rope(hf_config: Any) -> tuple[dict[str, Any], str]:
    """The RoPE settings and their kind: "default", "llama3" (with Megatron-core's fixed
    constants), "yarn" (multi-latent attention converts it) or "unsupported".
    transformers 5 keeps them in ``rope_parameters``, 4.x in ``rope_theta``/
    ``rope_scaling``."""
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope.update(getattr(hf_config, "rope_scaling", None) or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "llama3":
        fixed = all(rope.get(k) == v for k, v in _LLAMA3_FIXED_ROPE.items())
        return rope, "llama3" if fixed else "unsupported"
    return rope, kind if kind in ("default", "yarn") else "unsupported"


def _rope_theta(hf_config: Any, rope: dict[str, Any]) -> float:
    return rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))


def _refuse(problems: list[str]) -> None:
    if problems:
        raise ValueError(problems[0])
