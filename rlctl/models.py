"""Model shapes: what the planner needs to know about a model, without loading it.

``model_shape(model)`` answers from, in order:

1. a local folder (or a ``config.json`` file) — the Hugging Face config is read;
2. the built-in table below — the published ``config.json`` fields of common models;
3. the Hugging Face Hub — only when ``huggingface_hub`` is importable and
   ``HF_HUB_OFFLINE`` is not set: ``config.json`` alone is fetched (short timeout).

The table holds config fields, not parameter counts: every count is computed from the
shape by one formula (``_count``), the same for a local config, a table row and a hub
config, and ``tests/rlctl/test_models.py`` checks that formula against ``transformers``
models built on the meta device (exact) and the table against published sizes.

Parameter count of a decoder-only transformer, by module (RMSNorm weights only; no
biases unless the architecture has them):

- embeddings ``V·h``; a final norm ``h``; ``lm_head`` ``V·h`` unless tied to the embeddings
- per layer, attention with grouped-query heads (``q = heads·head_dim``,
  ``kv = kv_heads·head_dim``): ``h·q + 2·h·kv + q·h`` weights, ``+ q + 2·kv`` with q/k/v
  biases (Qwen2), ``+ 2·head_dim`` with per-head q/k norms (Qwen3);
  multi-head latent attention (DeepSeek-V3) has its own low-rank projections (``_mla``)
- per layer, a gated MLP ``3·h·I``; a mixture-of-experts layer has ``E`` such experts of
  width ``I_moe``, a router ``h·E``, and shared experts if any
- per layer, two norms ``2·h`` (four for Gemma-2/3)

Imports nothing heavy (no torch or transformers); ``huggingface_hub`` lazily, and the
engine's torch-free model-family rules (which architectures have q/k/v biases or q/k
norms) through ``engine.schema`` where a shape is counted.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl import model_table
from rlctl.errors import RlctlError
from rlctl.model_table import known_models


class UnknownModelError(RlctlError):
    """A model that is neither a local folder, nor in the table, nor reachable on the hub."""

    def __init__(self, message: str, hint: str | None = None, suggestions: tuple[str, ...] = ()):
        super().__init__(message, hint)
        self.suggestions = suggestions


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_params: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (0 when every layer is a mixture of experts)
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int = 0  # MoE: routed experts per MoE layer
    experts_per_token: int = 0
    active_params: int | None = None  # MoE: parameters one token passes through
    source: str = ""  # "config.json at <path>" | "built-in table (<id>)" | "hub metadata (<id>)"
    # Details the memory model needs beyond the headline shape:
    moe_intermediate_size: int = 0  # MoE: width of one expert (and of each shared expert)
    shared_expert_size: int = 0  # MoE: total width of the always-on shared expert(s)
    kv_latent_dim: int = 0  # MLA: cached width per token per layer; 0 = separate K and V heads
    q_dim: int = 0  # query projection width (heads × query head width)
    kv_dim: int = 0  # key + value projection widths together, per token per layer
    largest_layer_params: int = 0  # the biggest decoder layer: the unit FSDP gathers
    root_params: int = 0  # outside the decoder layers: embeddings, final norm, lm_head
    model_type: str = ""
    # A vision-language model's vision tower (in num_params; not in compute_params: its
    # work is per image patch, not per token)
    vision_params: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def compute_params(self) -> int:
        """Parameters that do arithmetic for one token (all of the language model's for a
        dense model)."""
        if self.active_params is not None:
            return self.active_params
        return self.num_params - self.vision_params

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def mlp_width_per_token(self) -> int:
        """Width of the MLP one token activates: the dense I, or k experts + shared ones."""
        if self.is_moe:
            return self.experts_per_token * self.moe_intermediate_size + self.shared_expert_size
        return self.intermediate_size

    def kv_cache_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token takes over all layers, unsharded.

        Standard attention caches K and V per KV head: ``2 · layers · kv_heads ·
        head_dim · bytes``. MLA caches one compressed latent per layer (``kv_latent_dim``
        = kv_lora_rank + rope dim), which is why DeepSeek-V3's cache is small.
        """
        if self.kv_latent_dim:
            return self.num_layers * self.kv_latent_dim * dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


# ---------------------------------------------------------------------------
# resolution


def model_shape(model: str) -> ModelShape:
    """The shape of ``model``: a local folder or config.json, a known name, or a hub id."""
    config, source = _resolve(model)
    return shape_from_config(config, name=str(model).strip(), source=source)


def model_config(model: str) -> dict[str, Any]:
    """The Hugging Face config fields of ``model``, found as ``model_shape`` finds them
    (the built-in table holds the fields that size and convert a model, not all)."""
    return dict(_resolve(model)[0])


def _resolve(model: str) -> tuple[Mapping[str, Any], str]:
    """(config fields, where they came from) for a local folder or config.json, a known
    name, or a hub id."""
    text = str(model).strip()
    if not text:
        raise UnknownModelError("empty model name", hint="give a Hugging Face id or a local folder")
    path = Path(text).expanduser()
    if path.is_dir() or path.name == "config.json" or _looks_like_path(text):
        config_file = path / "config.json" if path.is_dir() or not path.suffix else path
        if not config_file.is_file():
            raise UnknownModelError(
                f"model {text!r} looks like a local path but {str(config_file)!r} does not exist",
                hint="point at a Hugging Face model folder (one with config.json)",
            )
        return _read_json(config_file), f"config.json at {config_file}"

    table_id = model_table.find(text)
    if table_id is not None:
        return model_table.table_config(table_id), f"built-in table ({table_id})"

    config = _hub_config(text)
    if config is not None:
        return config, f"hub metadata ({text})"

    suggestions = model_table.close_matches(text)
    did_you_mean = f" Did you mean {' or '.join(suggestions)}?" if suggestions else ""
    raise UnknownModelError(
        f"unknown model {text!r}: not a local folder, not in the built-in table, and its"
        f" config could not be fetched from the Hugging Face Hub.{did_you_mean}",
        hint=(
            "give a local folder with config.json (e.g. a downloaded checkpoint), or one of: "
            + ", ".join(known_models())
        ),
        suggestions=suggestions,
    )


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~"))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UnknownModelError(
            f"cannot read {str(path)!r}: {exc}", hint="is it a Hugging Face config.json?"
        ) from None
    if not isinstance(data, dict):
        raise UnknownModelError(f"{str(path)!r} is not a JSON object")
    return data


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
HUB_TIMEOUT_S = 5.0


def _hub_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value.strip().casefold() not in ("", "0", "false", "no", "off")


def _hub_config(model_id: str) -> dict[str, Any] | None:
    """config.json from the hub, or None when offline, not installed, or not found."""
    if _hub_offline() or not _HUB_ID.match(model_id):
        return None
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None
    try:
        path = hf_hub_download(model_id, "config.json", etag_timeout=HUB_TIMEOUT_S)
    except Exception:  # any network, auth or not-found failure means "not resolvable"
        return None
    try:
        return _read_json(Path(path))
    except UnknownModelError:
        return None


# ---------------------------------------------------------------------------
# from config fields to a shape


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return value
    return default


def shape_from_config(config: Mapping[str, Any], name: str, source: str) -> ModelShape:
    """A ``ModelShape`` from Hugging Face config fields (a config.json or a table row)."""
    cfg: Mapping[str, Any] = config
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), Mapping):
        cfg = {**cfg["text_config"], "tie_word_embeddings": cfg.get("tie_word_embeddings")}
    vision = _vision_counts(config)
    if vision is not None:  # its language model is counted as the decoder it is
        cfg = {**cfg, "model_type": VISION_LANGUAGE_TYPES[str(config["model_type"])]}
    h = _get(cfg, "hidden_size", "n_embd", "d_model")
    layers = _get(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _get(cfg, "num_attention_heads", "n_head")
    vocab = _get(cfg, "vocab_size")
    missing = [
        k
        for k, v in (
            ("hidden_size", h),
            ("num_hidden_layers", layers),
            ("num_attention_heads", heads),
            ("vocab_size", vocab),
        )
        if v is None
    ]
    if missing:
        raise UnknownModelError(
            f"{source}: config lacks {', '.join(missing)}; cannot size model {name!r}",
            hint="is this a decoder-only language model's config.json?",
        )
    _check_fields(cfg, source, name)
    counts = _count(cfg)
    if vision is not None:  # FSDP units: its blocks; the patch embedding and merger: root
        total, block, depth = vision
        counts["total"] += total
        counts["largest_layer"] = max(counts["largest_layer"], block)
        counts["root"] += total - depth * block
    return ModelShape(
        name=name,
        num_params=counts["total"],
        hidden_size=int(h),
        num_layers=int(layers),
        num_attention_heads=int(heads),
        num_kv_heads=counts["kv_heads"],
        head_dim=counts["head_dim"],
        intermediate_size=counts["intermediate"],
        vocab_size=int(vocab),
        tie_word_embeddings=counts["tied"],
        num_experts=counts["experts"],
        experts_per_token=counts["experts_per_token"],
        active_params=counts["active"] if counts["experts"] else None,
        source=source,
        moe_intermediate_size=counts["moe_intermediate"],
        shared_expert_size=counts["shared_width"],
        kv_latent_dim=counts["kv_latent"],
        q_dim=counts["q_dim"],
        kv_dim=counts["kv_dim"],
        largest_layer_params=counts["largest_layer"],
        root_params=counts["root"],
        model_type=str((config if vision else cfg).get("model_type", "")),
        vision_params=vision[0] if vision else 0,
    )


# Vision-language model types whose vision tower is counted, and the decoder type their
# language model is counted as (q/k/v biases: Qwen2's)
VISION_LANGUAGE_TYPES = {"qwen2_vl": "qwen2", "qwen2_5_vl": "qwen2"}


def _vision_counts(config: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(parameters, parameters of one block, blocks) of a Qwen2-VL or Qwen2.5-VL vision
    tower, from its ``vision_config`` as transformers builds it; None for another model.
    A 3-D convolution makes the patches (no bias), each block is attention and an MLP
    with biases, and the merger an MLP over each 2 x 2 group of patches."""
    model_type = str(config.get("model_type", ""))
    v = config.get("vision_config")
    if model_type not in VISION_LANGUAGE_TYPES or not isinstance(v, Mapping):
        return None
    merge = int(v.get("spatial_merge_size", 2)) ** 2
    channels = int(v.get("in_channels", v.get("in_chans", 3)))
    patch = channels * int(v.get("temporal_patch_size", 2)) * int(v.get("patch_size", 14)) ** 2
    if model_type == "qwen2_5_vl":  # RMSNorm, a gated MLP
        e, inner = int(v["hidden_size"]), int(v["intermediate_size"])
        norms, mlp = 2 * e, 2 * (e * inner + inner) + inner * e + e
        norm, out = e, int(v["out_hidden_size"])
    else:  # Qwen2-VL: LayerNorm, a plain MLP
        e = int(v["embed_dim"])
        inner = e * int(v.get("mlp_ratio", 4))
        norms, mlp = 4 * e, e * inner + inner + inner * e + e
        norm, out = 2 * e, int(v["hidden_size"])
    block = norms + 4 * e * e + 4 * e + mlp  # attention: qkv and its output, with biases
    wide = e * merge
    merger = norm + wide * wide + wide + wide * out + out
    depth = int(v["depth"])
    return e * patch + depth * block + merger, block, depth


# The config fields the sizes are computed from: whole numbers, at least 1 (sizes and
# the divisors of layer patterns) or 0 (counts that may be absent). A local config.json
# is the user's file: anything else is refused naming the field, not met as a TypeError.
_SIZES = (
    "hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "num_layers",
    "num_attention_heads", "n_head", "num_key_value_heads", "head_dim", "vocab_size",
    "intermediate_size", "n_inner", "moe_intermediate_size", "moe_layer_freq",
    "decoder_sparse_step",
)  # fmt: skip
_COUNTS = (
    "num_experts", "n_routed_experts", "num_local_experts", "num_experts_per_tok", "moe_topk",
    "n_shared_experts", "shared_expert_intermediate_size", "kv_lora_rank", "q_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "first_k_dense_replace",
)  # fmt: skip
_MLA = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MAX_LAYERS = 100_000
MAX_SIZE = 2**40


def _check_fields(cfg: Mapping[str, Any], source: str, name: str) -> None:
    problems = []
    for key in (*_SIZES, *_COUNTS):
        value = cfg.get(key)
        if value is None:
            continue
        least = 1 if key in _SIZES else 0
        most = MAX_LAYERS if key in ("num_hidden_layers", "n_layer", "num_layers") else MAX_SIZE
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
            problems.append(f"{key} {value!r} is not a whole number from {least} to {most}")
    if cfg.get("kv_lora_rank"):
        problems += [f"{key} is missing (kv_lora_rank is set)" for key in _MLA if key not in cfg]
    layers = cfg.get("mlp_only_layers")
    if layers is not None and not (
        isinstance(layers, list) and all(isinstance(i, int) for i in layers)
    ):
        problems.append(f"mlp_only_layers {layers!r} is not a list of layer indices")
    if problems:
        raise UnknownModelError(
            f"{source}: cannot size model {name!r}: " + "; ".join(problems),
            hint="is this a Hugging Face config.json as the model's library wrote it?",
        )


def _tied(cfg: Mapping[str, Any]) -> bool:
    value = cfg.get("tie_word_embeddings")
    if value is not None:
        return bool(value)
    # Each architecture's own config class default (PretrainedConfig's True is overridden
    # by Llama, Qwen, Mistral and DeepSeek configs; Gemma keeps it).
    return str(cfg.get("model_type", "")).startswith("gemma")


def _mla(cfg: Mapping[str, Any], h: int, heads: int) -> tuple[int, int, int, int]:
    """Multi-head latent attention: (params, q width, k+v width, cached latent width)."""
    q_lora = cfg.get("q_lora_rank")
    kv_lora = int(cfg["kv_lora_rank"])
    nope = int(cfg["qk_nope_head_dim"])
    rope = int(cfg["qk_rope_head_dim"])
    v_dim = int(cfg["v_head_dim"])
    q_head = nope + rope
    # with a low-rank query: q_a, its norm, q_b; without: one projection
    q_params = h * q_lora + q_lora + q_lora * heads * q_head if q_lora else h * heads * q_head
    kv_params = h * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
    o_params = heads * v_dim * h
    return q_params + kv_params + o_params, heads * q_head, heads * (q_head + v_dim), kv_lora + rope


def _count(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter count the planner uses, from config fields (see the module doc)."""
    from engine.schema import family_rules

    model_type = str(cfg.get("model_type", ""))
    h = int(_get(cfg, "hidden_size", "n_embd", "d_model"))
    layers = int(_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = int(_get(cfg, "num_attention_heads", "n_head"))
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=h // heads))
    vocab = int(cfg["vocab_size"])
    tied = _tied(cfg)

    # attention, per layer
    kv_latent = 0
    if cfg.get("kv_lora_rank"):
        attn, q_dim, kv_dim, kv_latent = _mla(cfg, h, heads)
        head_dim = int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
    else:
        q_dim, kv_one = heads * head_dim, kv_heads * head_dim
        kv_dim = 2 * kv_one
        attn = h * q_dim + 2 * h * kv_one + q_dim * h
        family = family_rules(model_type)  # the engine's shape rules of the model type
        if family.qkv_bias(cfg):
            attn += q_dim + 2 * kv_one
        if family.o_proj_bias(cfg):
            attn += h
        if family.qk_norm or model_type in ("gemma3", "gemma3_text"):
            attn += 2 * head_dim  # per-head q_norm and k_norm

    norms = (4 if model_type.startswith("gemma") and model_type != "gemma" else 2) * h

    # MLPs, per layer
    intermediate = int(_get(cfg, "intermediate_size", "n_inner", default=4 * h))
    mlp_bias = bool(cfg.get("mlp_bias"))
    dense_mlp = 3 * h * intermediate + ((2 * intermediate + h) if mlp_bias else 0)

    experts = int(_get(cfg, "num_experts", "n_routed_experts", "num_local_experts", default=0))
    k = int(_get(cfg, "num_experts_per_tok", "moe_topk", default=0)) if experts else 0
    moe_inter = int(_get(cfg, "moe_intermediate_size", default=intermediate)) if experts else 0
    one_expert = 3 * h * moe_inter
    moe_mlp = experts * one_expert + h * experts  # experts + router
    shared_width = 0
    if experts and cfg.get("n_shared_experts"):  # DeepSeek: one MLP of width n_shared · I_moe
        shared_width = int(cfg["n_shared_experts"]) * moe_inter
        moe_mlp += 3 * h * shared_width
    elif experts and cfg.get("shared_expert_intermediate_size"):
        shared_width = int(cfg["shared_expert_intermediate_size"])
        moe_mlp += 3 * h * shared_width + h  # Qwen2-MoE: a shared expert and its sigmoid gate

    moe_layers = [_is_moe_layer(cfg, model_type, i) for i in range(layers)] if experts else []
    n_moe = sum(moe_layers)
    n_dense = layers - n_moe
    dense_layer = attn + dense_mlp + norms
    moe_layer = attn + moe_mlp + norms

    root = vocab * h + h + (0 if tied else vocab * h)
    total = root + n_dense * dense_layer + n_moe * moe_layer
    active = total - n_moe * (experts - k) * one_expert
    largest = max(dense_layer if n_dense else 0, moe_layer if n_moe else 0)
    return {
        "total": total,
        "active": active,
        "root": root,
        "largest_layer": largest,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate": intermediate if n_dense else 0,
        "tied": tied,
        "experts": experts,
        "experts_per_token": k,
        "moe_intermediate": moe_inter,
        "shared_width": shared_width,
        "kv_latent": kv_latent,
        "q_dim": q_dim,
        "kv_dim": kv_dim,
    }


def _is_moe_layer(cfg: Mapping[str, Any], model_type: str, i: int) -> bool:
    if "first_k_dense_replace" in cfg or model_type.startswith("deepseek"):
        first = int(cfg.get("first_k_dense_replace") or 0)
        freq = int(cfg.get("moe_layer_freq") or 1)
        return i >= first and i % freq == 0
    if i in (cfg.get("mlp_only_layers") or []):
        return False
    step = int(cfg.get("decoder_sparse_step") or 1)
    return (i + 1) % step == 0
