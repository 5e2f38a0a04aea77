"""Weights between Hugging Face and Megatron-core layouts (Llama, Qwen2, Qwen3), both ways.

Used for loading a Hugging Face checkpoint into a Megatron-core ``GPTModel``, for
pushing Megatron weights to a rollout engine (which takes HF names; see
engine.rollout.weights) and for exporting. Pure torch: no Megatron import.

Layout (Megatron-core with the Transformer Engine layer spec; ``fused_norms=False``
gives the local spec's separate norm names):

=============================================  ==============================================
Hugging Face                                   Megatron-core
=============================================  ==============================================
model.embed_tokens.weight                      embedding.word_embeddings.weight
layers.i.input_layernorm.weight                decoder.layers.i.self_attention.linear_qkv
                                               .layer_norm_weight (local: .input_layernorm
                                               .weight)
layers.i.self_attn.{q,k,v}_proj.{weight,bias}  decoder.layers.i.self_attention.linear_qkv
                                               .{weight,bias}: grouped by query group (GQA):
                                               for each of the G kv heads, its H/G query
                                               heads, then its key head, then its value head
layers.i.self_attn.{q,k}_norm.weight (Qwen3)   ...self_attention.{q,k}_layernorm.weight
layers.i.self_attn.o_proj.weight               ...self_attention.linear_proj.weight
layers.i.post_attention_layernorm.weight       ...mlp.linear_fc1.layer_norm_weight
                                               (local: .pre_mlp_layernorm.weight)
layers.i.mlp.{gate,up}_proj.weight             ...mlp.linear_fc1.weight = [gate; up]
layers.i.mlp.down_proj.weight                  ...mlp.linear_fc2.weight
model.norm.weight                              decoder.final_layernorm.weight
lm_head.weight (untied only)                   output_layer.weight
=============================================  ==============================================

Tensor parallelism: ``split_for_tp`` / ``merge_from_tp`` turn a full Megatron tensor into
the ``tp`` rank slices and back. Column-parallel weights split along dim 0 (the
grouped qkv layout makes each rank's slice whole query groups; ``linear_fc1`` is split
as gate and up separately, so each rank holds ``[gate_r; up_r]``), row-parallel weights
(``linear_proj``, ``linear_fc2``) along dim 1, the vocabulary along dim 0; norms are
replicated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

NamedTensor = tuple[str, torch.Tensor]


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


# ---------------------------------------------------------------------------
# fused qkv and gate/up


def fuse_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: AttentionShape
) -> torch.Tensor:
    """HF q [H*D, ...], k and v [G*D, ...] → Megatron's grouped [G*(H/G + 2)*D, ...]."""
    g, d, per = shape.num_kv_heads, shape.head_dim, shape.heads_per_group
    rest = q.shape[1:]
    q_g = q.reshape(g, per * d, *rest)
    k_g = k.reshape(g, d, *rest)
    v_g = v.reshape(g, d, *rest)
    return torch.cat([q_g, k_g, v_g], dim=1).reshape(g * (per + 2) * d, *rest)


def split_qkv(
    qkv: torch.Tensor, shape: AttentionShape
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of ``fuse_qkv``."""
    g, d, per = shape.num_kv_heads, shape.head_dim, shape.heads_per_group
    rest = qkv.shape[1:]
    if qkv.shape[0] != g * (per + 2) * d:
        raise ValueError(f"linear_qkv has {qkv.shape[0]} rows; {shape} needs {g * (per + 2) * d}")
    grouped = qkv.reshape(g, (per + 2) * d, *rest)
    q, k, v = torch.split(grouped, [per * d, d, d], dim=1)
    return (
        q.reshape(g * per * d, *rest),
        k.reshape(g * d, *rest),
        v.reshape(g * d, *rest),
    )


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if fc1.shape[0] % 2:
        raise ValueError(f"linear_fc1 has an odd number of rows ({fc1.shape[0]})")
    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate, up


# ---------------------------------------------------------------------------
# whole state dicts


_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MC_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def _simple_layer_names(fused_norms: bool) -> dict[str, str]:
    """HF per-layer suffix → Megatron per-layer suffix, for one-to-one tensors."""
    return {
        "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight"
        if fused_norms
        else "input_layernorm.weight",
        "post_attention_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"
        if fused_norms
        else "pre_mlp_layernorm.weight",
        "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
        "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
        "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
        "mlp.down_proj.weight": "mlp.linear_fc2.weight",
    }


_GLOBAL = {
    "model.embed_tokens.weight": "embedding.word_embeddings.weight",
    "model.norm.weight": "decoder.final_layernorm.weight",
    "lm_head.weight": "output_layer.weight",
}


def hf_to_megatron(
    state: dict[str, torch.Tensor],
    shape: AttentionShape,
    *,
    tie_word_embeddings: bool,
    fused_norms: bool = True,
) -> dict[str, torch.Tensor]:
    """A full (unsharded) HF state dict as a Megatron-core GPTModel state dict."""
    simple = _simple_layer_names(fused_norms)
    out: dict[str, torch.Tensor] = {}
    pending: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        if name in _GLOBAL:
            if name == "lm_head.weight" and tie_word_embeddings:
                continue
            out[_GLOBAL[name]] = tensor
            continue
        match = _HF_LAYER.match(name)
        if not match:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            raise KeyError(f"no Megatron-core name for {name!r}")
        layer, suffix = int(match.group(1)), match.group(2)
        prefix = f"decoder.layers.{layer}."
        if suffix in simple:
            out[prefix + simple[suffix]] = tensor
            continue
        part = re.fullmatch(
            r"self_attn\.([qkv])_proj\.(weight|bias)|mlp\.(gate|up)_proj\.weight", suffix
        )
        if not part:
            raise KeyError(f"no Megatron-core name for {name!r}")
        if part.group(1):
            pending.setdefault((layer, "qkv." + part.group(2)), {})[part.group(1)] = tensor
        else:
            pending.setdefault((layer, "fc1.weight"), {})[part.group(3)] = tensor
    for (layer, what), parts in sorted(pending.items()):
        prefix = f"decoder.layers.{layer}."
        if what.startswith("qkv."):
            if set(parts) != {"q", "k", "v"}:
                raise KeyError(f"layer {layer}: q/k/v incomplete ({sorted(parts)})")
            leaf = what.split(".")[1]
            out[f"{prefix}self_attention.linear_qkv.{leaf}"] = fuse_qkv(
                parts["q"], parts["k"], parts["v"], shape
            )
        else:
            if set(parts) != {"gate", "up"}:
                raise KeyError(f"layer {layer}: gate/up incomplete ({sorted(parts)})")
            out[f"{prefix}mlp.linear_fc1.weight"] = fuse_gate_up(parts["gate"], parts["up"])
    return out


def megatron_to_hf_pairs(
    pairs: Iterable[NamedTensor], shape: AttentionShape, *, fused_norms: bool = True
) -> Iterator[NamedTensor]:
    """Megatron-core (name, full tensor) pairs as HF pairs, lazily: the form the rollout
    weight sync consumes (engine.rollout.weights.bucketize)."""
    simple = {v: k for k, v in _simple_layer_names(fused_norms).items()}
    global_names = {v: k for k, v in _GLOBAL.items()}
    for name, tensor in pairs:
        if name in global_names:
            yield global_names[name], tensor
            continue
        if name.endswith("._extra_state"):
            continue  # Transformer Engine's fp8 metadata
        match = _MC_LAYER.match(name)
        if not match:
            raise KeyError(f"no Hugging Face name for {name!r}")
        layer, suffix = match.group(1), match.group(2)
        prefix = f"model.layers.{layer}."
        if suffix in simple:
            yield prefix + simple[suffix], tensor
        elif suffix.startswith("self_attention.linear_qkv."):
            leaf = suffix.rsplit(".", 1)[1]
            q, k, v = split_qkv(tensor, shape)
            yield from (
                (f"{prefix}self_attn.q_proj.{leaf}", q),
                (f"{prefix}self_attn.k_proj.{leaf}", k),
                (f"{prefix}self_attn.v_proj.{leaf}", v),
            )
        elif suffix == "mlp.linear_fc1.weight":
            gate, up = split_gate_up(tensor)
            yield f"{prefix}mlp.gate_proj.weight", gate
            yield f"{prefix}mlp.up_proj.weight", up
        else:
            raise KeyError(f"no Hugging Face name for {name!r}")


def megatron_to_hf(
    state: dict[str, torch.Tensor], shape: AttentionShape, *, fused_norms: bool = True
) -> dict[str, torch.Tensor]:
    return dict(megatron_to_hf_pairs(state.items(), shape, fused_norms=fused_norms))


# ---------------------------------------------------------------------------
# tensor-parallel slices


def tp_split_dim(name: str) -> int | None:
    """The dimension a Megatron weight is split along under tensor parallelism (None:
    replicated)."""
    if name.endswith(("layer_norm_weight", "layernorm.weight", "_extra_state")):
        return None
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    if (
        name.endswith(
            ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "word_embeddings.weight")
        )
        or name == "output_layer.weight"
    ):
        return 0
    return None


def split_for_tp(name: str, tensor: torch.Tensor, tp: int) -> list[torch.Tensor]:
    """The ``tp`` rank slices of a full Megatron tensor."""
    dim = tp_split_dim(name)
    if dim is None or tp == 1:
        return [tensor] * tp
    if tensor.shape[dim] % tp:
        raise ValueError(f"{name}: dim {dim} ({tensor.shape[dim]}) is not divisible by tp={tp}")
    if name.endswith("linear_fc1.weight"):
        gate, up = split_gate_up(tensor)
        return [
            torch.cat([g, u], dim=0)
            for g, u in zip(gate.chunk(tp, dim=0), up.chunk(tp, dim=0), strict=True)
        ]
    return list(tensor.chunk(tp, dim=dim))


def merge_from_tp(name: str, slices: list[torch.Tensor]) -> torch.Tensor:
    """The full Megatron tensor from its rank slices (the inverse of ``split_for_tp``)."""
    dim = tp_split_dim(name)
    if dim is None or len(slices) == 1:
        return slices[0]
    if name.endswith("linear_fc1.weight"):
        halves = [split_gate_up(s) for s in slices]
        return torch.cat([torch.cat([g for g, _ in halves]), torch.cat([u for _, u in halves])])
    return torch.cat(slices, dim=dim)


# ---------------------------------------------------------------------------
# model config


def transformer_config_kwargs(hf_config: Any) -> dict[str, Any]:
    """``megatron.core.transformer.TransformerConfig`` arguments for a Llama/Qwen2/Qwen3
    Hugging Face config (parallel sizes are added by the caller, from the plan)."""
    model_type = getattr(hf_config, "model_type", "")
    if model_type not in ("llama", "qwen2", "qwen3", "mistral"):
        raise ValueError(
            f"no Megatron-core conversion for model_type {model_type!r}; supported: llama,"
            " mistral, qwen2, qwen3"
        )
    windowed = (
        getattr(hf_config, "use_sliding_window", False)
        if model_type.startswith("qwen")
        else getattr(hf_config, "sliding_window", None) is not None
    )
    if windowed:
        raise ValueError(
            f"sliding-window attention (sliding_window={hf_config.sliding_window}) has no"
            " Megatron-core conversion here"
        )
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("mlp_bias=True has no Megatron-core conversion here (add_bias_linear)")
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
        "add_qkv_bias": model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
        "qk_layernorm": model_type == "qwen3",
        "attention_dropout": float(getattr(hf_config, "attention_dropout", 0.0)),
        "hidden_dropout": 0.0,
    }


def gpt_model_kwargs(hf_config: Any) -> dict[str, Any]:
    """``megatron.core.models.gpt.GPTModel`` arguments other than the config and layer spec."""
    # transformers 5 keeps RoPE settings in rope_parameters, 4.x in rope_theta/rope_scaling.
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope.update(getattr(hf_config, "rope_scaling", None) or {})
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    kwargs = {
        "vocab_size": hf_config.vocab_size,
        "max_sequence_length": hf_config.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_base": int(theta),
        "share_embeddings_and_output_weights": bool(hf_config.tie_word_embeddings),
    }
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "llama3" and all(
        rope.get(k) == v for k, v in _LLAMA3_FIXED_ROPE.items()
    ):  # Megatron-core implements Llama 3.x scaling with these constants and any factor
        kwargs.update(rope_scaling=True, rope_scaling_factor=float(rope["factor"]))
    elif rope_type != "default":
        raise ValueError(
            f"RoPE scaling {rope_type!r} ({rope}) has no Megatron-core equivalent here; supported:"
            f" none, or llama3 with {_LLAMA3_FIXED_ROPE}"
        )
    return kwargs


_LLAMA3_FIXED_ROPE = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
