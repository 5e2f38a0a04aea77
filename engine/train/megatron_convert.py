"""Weights between Hugging Face and Megatron-core layouts, both ways, for every model
family (``engine.models.families``): the names all of them share here, each family's
own (q/k norms, routers, multi-latent attention...) in its ``WeightNames``.

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
layers.i.self_attn.o_proj.weight               ...self_attention.linear_proj.weight
layers.i.post_attention_layernorm.weight       ...mlp.linear_fc1.layer_norm_weight
                                               (local: .pre_mlp_layernorm.weight)
layers.i.mlp.{gate,up}_proj.weight             ...mlp.linear_fc1.weight = [gate; up]
layers.i.mlp.down_proj.weight                  ...mlp.linear_fc2.weight
model.norm.weight                              decoder.final_layernorm.weight
lm_head.weight (untied only)                   output_layer.weight
=============================================  ==============================================

Mixture-of-experts layers, by their checkpoint names (what ``save_pretrained`` writes
and vLLM/SGLang load; transformers 5 fuses the experts in memory, see
engine.rollout.weights); the router and the shared experts' HF name are the family's:

=============================================  ==============================================
layers.i.mlp.experts.j.{gate,up}_proj.weight   ...mlp.experts.local_experts.j.linear_fc1
                                               .weight = [gate; up]
layers.i.mlp.experts.j.down_proj.weight        ...mlp.experts.local_experts.j.linear_fc2.weight
layers.i.mlp.<shared>.{gate,up,down}_proj      ...mlp.shared_experts.linear_fc{1,2}.weight
.weight
=============================================  ==============================================

Expert ``j`` is numbered in the whole model here; an expert-parallel rank holds the
experts ``ep_rank·E/EP ...`` under local numbers 0..E/EP-1 (``shift_expert``).

Tensor parallelism: ``split_for_tp`` / ``merge_from_tp`` turn a full Megatron tensor into
the ``tp`` rank slices and back. Column-parallel weights split along dim 0 (the
grouped qkv layout makes each rank's slice whole query groups; ``linear_fc1`` is split
as gate and up separately, so each rank holds ``[gate_r; up_r]``), row-parallel weights
(``linear_proj``, ``linear_fc2``) along dim 1, the vocabulary along dim 0; norms are
replicated. Experts, routed and shared, split as the dense MLP: the shared experts over
the TP ranks, each routed expert over its expert-tensor-parallel (ETP) ranks, the TP
size unless set; expert parallelism then gives each rank E/EP of the routed experts,
whole in number and ETP-sliced (``megatron_model.split_size`` says which count a weight
splits by). MLA's up projections split by heads (dim 0); its down projections are whole
on every rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from engine.models.families.base import WeightNames
from engine.models.megatron_config import AttentionShape

NamedTensor = tuple[str, torch.Tensor]
COMMON_NAMES_ONLY = WeightNames()  # a family with no names of its own (Llama)


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


def _simple_layer_names(fused_norms: bool, names: WeightNames) -> dict[str, str]:
    """HF per-layer suffix → Megatron per-layer suffix, for one-to-one tensors: every
    family's, then the family's own."""
    common = {
        "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight"
        if fused_norms
        else "input_layernorm.weight",
        "post_attention_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"
        if fused_norms
        else "pre_mlp_layernorm.weight",
        "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    }
    return common | dict(names.layer)


# The MLPs of a layer: the dense one, the shared expert(s) (Qwen2-MoE: shared_expert;
# DeepSeek: shared_experts, one MLP), routed expert j.
_HF_MLP = re.compile(r"mlp\.(?:(shared_experts?)\.|experts\.(\d+)\.)?(gate|up|down)_proj\.weight")
_MC_MLP = re.compile(
    r"mlp\.(?:(shared_experts)\.|experts\.local_experts\.(\d+)\.)?linear_fc([12])\.weight"
)
_MC_EXPERT = re.compile(r"(\.mlp\.experts\.local_experts\.)(\d+)\.")


def _mlp_names(
    shared: bool, expert: str | None, shared_expert: str = "shared_expert"
) -> tuple[str, str]:
    """(HF, Megatron) name prefixes of one MLP of a layer (HF names the shared experts
    ``shared_expert`` in Qwen2-MoE, ``shared_experts`` in DeepSeek)."""
    if shared:
        return f"mlp.{shared_expert}.", "mlp.shared_experts."
    if expert is not None:
        return f"mlp.experts.{expert}.", f"mlp.experts.local_experts.{expert}."
    return "mlp.", "mlp."


def is_expert(name: str) -> bool:
    """Whether a Megatron name is a routed expert's (held by one expert-parallel rank)."""
    return _MC_EXPERT.search(name) is not None


def expert_index(name: str) -> int:
    match = _MC_EXPERT.search(name)
    if match is None:
        raise ValueError(f"{name!r} is not a routed expert's")
    return int(match.group(2))


def shift_expert(name: str, offset: int) -> str:
    """Renumber a routed expert's name by ``offset`` (global ↔ an expert-parallel rank's
    local numbers); other names unchanged."""
    return _MC_EXPERT.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + offset}.", name, count=1)


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
    names: WeightNames = COMMON_NAMES_ONLY,
) -> dict[str, torch.Tensor]:
    """A full (unsharded) HF state dict as a Megatron-core GPTModel state dict (``names``:
    the model family's own, ``family(model_type).weights``)."""
    simple = _simple_layer_names(fused_norms, names)
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
        qkv = re.fullmatch(r"self_attn\.([qkv])_proj\.(weight|bias)", suffix)
        mlp = _HF_MLP.fullmatch(suffix)
        if qkv:
            key = f"self_attention.linear_qkv.{qkv.group(2)}"
            pending.setdefault((layer, key), {})[qkv.group(1)] = tensor
        elif mlp and mlp.group(3) == "down":
            out[prefix + _mlp_names(bool(mlp.group(1)), mlp.group(2))[1] + "linear_fc2.weight"] = (
                tensor
            )
        elif mlp:
            key = _mlp_names(bool(mlp.group(1)), mlp.group(2))[1] + "linear_fc1.weight"
            pending.setdefault((layer, key), {})[mlp.group(3)] = tensor
        else:
            raise KeyError(f"no Megatron-core name for {name!r}")
    for (layer, key), parts in pending.items():
        name = f"decoder.layers.{layer}.{key}"
        if key.startswith("self_attention."):
            if set(parts) != {"q", "k", "v"}:
                raise KeyError(f"{name}: q/k/v incomplete ({sorted(parts)})")
            out[name] = fuse_qkv(parts["q"], parts["k"], parts["v"], shape)
        else:
            if set(parts) != {"gate", "up"}:
                raise KeyError(f"{name}: gate/up incomplete ({sorted(parts)})")
            out[name] = fuse_gate_up(parts["gate"], parts["up"])
    return out


def megatron_to_hf_pairs(
    pairs: Iterable[NamedTensor],
    shape: AttentionShape,
    *,
    fused_norms: bool = True,
    names: WeightNames = COMMON_NAMES_ONLY,
) -> Iterator[NamedTensor]:
    """Megatron-core (name, full tensor) pairs as HF pairs, lazily: the form the rollout
    weight sync consumes (engine.rollout.weights.bucketize)."""
    simple = {v: k for k, v in _simple_layer_names(fused_norms, names).items()}
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
        elif mlp := _MC_MLP.fullmatch(suffix):
            shared, expert = bool(mlp.group(1)), mlp.group(2)
            hf_mlp = prefix + _mlp_names(shared, expert, names.shared_expert)[0]
            if mlp.group(3) == "2":
                yield f"{hf_mlp}down_proj.weight", tensor
            else:
                gate, up = split_gate_up(tensor)
                yield f"{hf_mlp}gate_proj.weight", gate
                yield f"{hf_mlp}up_proj.weight", up
        else:
            raise KeyError(f"no Hugging Face name for {name!r}")


def megatron_to_hf(
    state: dict[str, torch.Tensor], shape: AttentionShape, **names: Any
) -> dict[str, torch.Tensor]:
    return dict(megatron_to_hf_pairs(state.items(), shape, **names))


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
            (
                "linear_qkv.weight",
                "linear_qkv.bias",
                "linear_fc1.weight",
                "word_embeddings.weight",
                # MLA: the up projections are column-parallel by heads (the down
                # projections are whole on every rank: megatron.DuplicatedLinear)
                "linear_q_proj.weight",
                "linear_q_up_proj.weight",
                "linear_kv_up_proj.weight",
            )
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
