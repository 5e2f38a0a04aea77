"""What a model family is: the ``ModelFamily`` record each module of this package fills
in, the helpers that read a Hugging Face config whatever form it has, and the defaults
(a plain Llama-shaped decoder) a family overrides.

A config here is either a ``transformers`` config object (the engine's) or the
``config.json`` fields as a mapping (the planner's, on a machine without
transformers): ``field`` reads both. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Config = Any  # a transformers PretrainedConfig, or its config.json fields as a Mapping


def read(cfg: Config, key: str, default: Any = None) -> Any:
    """A config field (``default`` when it is absent or null)."""
    value = cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, key, None)
    return default if value is None else value


# ---------------------------------------------------------------------------
# rules most families share


def attention_bias(cfg: Config) -> bool:
    """Llama's switch: ``attention_bias`` puts biases on q, k, v and o."""
    return bool(read(cfg, "attention_bias", False))


def always(cfg: Config) -> bool:
    return True


def never(cfg: Config) -> bool:
    return False


def sliding_window_set(cfg: Config) -> bool:
    """Sliding-window attention is on when ``sliding_window`` is set (Llama, Mistral)."""
    return read(cfg, "sliding_window") is not None


def use_sliding_window(cfg: Config) -> bool:
    """Qwen's configs carry a ``sliding_window`` size and switch it on separately."""
    return bool(read(cfg, "use_sliding_window", False))


def sparse_step_layers(cfg: Config) -> list[bool]:
    """Which layers are mixtures of experts, as Qwen's MoE configs say it: every
    ``decoder_sparse_step``-th layer, except those in ``mlp_only_layers``."""
    step = read(cfg, "decoder_sparse_step", 1) or 1
    dense = set(read(cfg, "mlp_only_layers", ()))
    layers = int(read(cfg, "num_hidden_layers"))
    return [i not in dense and (i + 1) % step == 0 for i in range(layers)]


def shared_expert_intermediate_size(cfg: Config) -> int:
    """The always-on shared expert's width, as Qwen2-MoE names it (0: none)."""
    return read(cfg, "shared_expert_intermediate_size", 0) or 0


def softmax_router(cfg: Config) -> dict[str, Any]:
    """Megatron-core's router as Hugging Face's Qwen MoE blocks route: softmax over the
    experts in fp32, top k; ``norm_topk_prob`` renormalises the k weights, which equals
    Megatron's softmax over the k selected logits (``moe_router_pre_softmax=False``);
    without it the weights are the full softmax's (``pre_softmax=True``)."""
    return {
        "moe_router_pre_softmax": not read(cfg, "norm_topk_prob", False),
        "moe_router_score_function": "softmax",
    }


def nothing(*args: Any) -> dict[str, Any]:
    return {}


def no_problems(cfg: Config) -> list[str]:
    return []


# ---------------------------------------------------------------------------
# RoPE settings (transformers 5 keeps them in ``rope_parameters``, 4.x in
# ``rope_theta``/``rope_scaling``)


def rope_settings(cfg: Config) -> dict[str, Any]:
    rope = dict(read(cfg, "rope_parameters", None) or {})
    rope.update(read(cfg, "rope_scaling", None) or {})
    return rope


def rope_kind(rope: Mapping[str, Any]) -> str:
    return rope.get("rope_type", rope.get("type", "default"))


def rope_theta(cfg: Config, rope: Mapping[str, Any]) -> float:
    return rope.get("rope_theta", read(cfg, "rope_theta", 10000.0))


# ---------------------------------------------------------------------------
# the record


@dataclass(frozen=True)
class WeightNames:
    """A family's weight names beyond every family's (embeddings, norms, the fused q/k/v,
    o_proj, the MLPs and the routed experts: ``engine.train.megatron_convert``)."""

    # HF per-layer suffix -> Megatron per-layer suffix, one tensor each way
    layer: Mapping[str, str] = field(default_factory=dict)
    # what HF calls a layer's always-on shared expert(s) (Megatron: ``shared_experts``)
    shared_expert: str = "shared_expert"


@dataclass(frozen=True)
class TinySize:
    """The sizes ``engine.models.tiny`` asks a family's tiny test model for."""

    hidden_size: int
    num_heads: int
    num_experts: int = 0  # 0: the family's own default (a mixture-of-experts family)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


# A mixture-of-experts layer's router, as every supported MoE family names it.
ROUTER_NAMES = {"mlp.gate.weight": "mlp.router.weight"}

ROPE_TYPES = ("default", "llama3")  # what Megatron-core's GPTModel rotary embedding takes


@dataclass(frozen=True)
class ModelFamily:
    """One Hugging Face ``model_type`` the Megatron backend converts, and what the
    planner needs to know of its shape. The defaults are a plain Llama-shaped decoder
    (RMSNorm, gated SiLU MLP, grouped-query attention, RoPE)."""

    model_type: str

    # (a) the shape, torch-free: the planner sizes with it, the conversion builds it
    qkv_bias: Callable[[Config], bool] = attention_bias  # biases on q, k and v
    o_proj_bias: Callable[[Config], bool] = attention_bias  # a bias on the output projection
    qk_norm: bool = False  # per-head RMSNorm of queries and keys (Qwen3)
    mla: bool = False  # multi-latent attention (DeepSeek-V3): low-rank q and kv
    sliding_window: Callable[[Config], bool] = sliding_window_set  # whether it is on
    # mixtures of experts (asked only of a config with routed experts)
    moe_layers: Callable[[Config], list[bool]] = sparse_step_layers
    shared_expert_size: Callable[[Config], int] = shared_expert_intermediate_size
    shared_expert_gate: bool = False  # the shared expert scaled by sigmoid(gate · x)

    # (b) the translation into Megatron-core's TransformerConfig
    router: Callable[[Config], dict[str, Any]] = softmax_router  # routing as HF routes
    rope_types: tuple[str, ...] = ROPE_TYPES  # RoPE kinds it converts
    megatron_kwargs: Callable[[Config], dict[str, Any]] = nothing  # arguments of its own
    problems: Callable[[Config], list[str]] = no_problems  # settings it cannot convert

    # (c) the weight names (HF <-> Megatron-core)
    weights: WeightNames = WeightNames()

    # (d) its tiny test model: config fields over engine.models.tiny's base sizes
    tiny: Callable[[TinySize], dict[str, Any]] = nothing


# Rules for a model type without a family (the planner sizes more architectures than
# the Megatron backend converts): a plain decoder's.
PLAIN_DECODER = ModelFamily(model_type="")
