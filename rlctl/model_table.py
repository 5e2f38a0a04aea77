"""The built-in table of model shapes: published config.json fields of well-known
Hugging Face models, so ``rlctl plan`` sizes them without a download; names are matched
case-insensitively, without the organisation and the -instruct/-chat/-it/-base suffix."""

from __future__ import annotations

import difflib
from typing import Any

_QWEN25 = dict(model_type="qwen2", vocab_size=152064, tie_word_embeddings=False)
_QWEN25_SMALL = dict(model_type="qwen2", vocab_size=151936, tie_word_embeddings=True)
_QWEN3 = dict(model_type="qwen3", vocab_size=151936, head_dim=128)
_LLAMA3 = dict(model_type="llama", vocab_size=128256)
_QWEN25_VL_VISION = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, in_channels=3,
    patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
)  # fmt: skip

# fmt: off
_TABLE: dict[str, dict[str, Any]] = {
    # the engine's tiny quickstart model (engine/models/tiny.py defaults), built where the job runs
    "rlctl:tiny": dict(
        model_type="qwen2", vocab_size=2048, tie_word_embeddings=True, hidden_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512,
    ),
    # Qwen2.5 (qwen2 architecture: q/k/v biases); 0.5B–3B tie lm_head to the embeddings
    "Qwen/Qwen2.5-0.5B": dict(
        _QWEN25_SMALL, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, intermediate_size=4864,
    ),
    "Qwen/Qwen2.5-1.5B": dict(
        _QWEN25_SMALL, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, intermediate_size=8960,
    ),
    "Qwen/Qwen2.5-3B": dict(
        _QWEN25_SMALL, hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, intermediate_size=11008,
    ),
    "Qwen/Qwen2.5-7B": dict(
        _QWEN25, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, intermediate_size=18944,
    ),
    "Qwen/Qwen2.5-14B": dict(
        _QWEN25, hidden_size=5120, num_hidden_layers=48, num_attention_heads=40,
        num_key_value_heads=8, intermediate_size=13824,
    ),
    "Qwen/Qwen2.5-32B": dict(
        _QWEN25, hidden_size=5120, num_hidden_layers=64, num_attention_heads=40,
        num_key_value_heads=8, intermediate_size=27648,
    ),
    "Qwen/Qwen2.5-72B": dict(
        _QWEN25, hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, intermediate_size=29568,
    ),
    # Qwen2.5-VL: Qwen2.5's language model beside a 32-block vision tower (675M parameters)
    "Qwen/Qwen2.5-VL-3B": dict(
        _QWEN25_SMALL, model_type="qwen2_5_vl", hidden_size=2048, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, intermediate_size=11008,
        vision_config=dict(_QWEN25_VL_VISION, out_hidden_size=2048),
    ),
    "Qwen/Qwen2.5-VL-7B": dict(
        _QWEN25, model_type="qwen2_5_vl", hidden_size=3584, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
        vision_config=dict(_QWEN25_VL_VISION, out_hidden_size=3584),
    ),
    # Qwen2-7B: the shape of Qwen2.5-7B (verl's GSM8K GRPO examples use it)
    "Qwen/Qwen2-7B": dict(
        _QWEN25, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, intermediate_size=18944,
    ),
    # Qwen3 (no q/k/v biases; per-head q/k RMSNorm; head_dim 128 throughout)
    "Qwen/Qwen3-0.6B": dict(
        _QWEN3, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, intermediate_size=3072, tie_word_embeddings=True,
    ),
    "Qwen/Qwen3-1.7B": dict(
        _QWEN3, hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, intermediate_size=6144, tie_word_embeddings=True,
    ),
    "Qwen/Qwen3-4B": dict(
        _QWEN3, hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=9728, tie_word_embeddings=True,
    ),
    "Qwen/Qwen3-8B": dict(
        _QWEN3, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=12288, tie_word_embeddings=False,
    ),
    "Qwen/Qwen3-14B": dict(
        _QWEN3, hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
        num_key_value_heads=8, intermediate_size=17408, tie_word_embeddings=False,
    ),
    "Qwen/Qwen3-32B": dict(
        _QWEN3, hidden_size=5120, num_hidden_layers=64, num_attention_heads=64,
        num_key_value_heads=8, intermediate_size=25600, tie_word_embeddings=False,
    ),
    "Qwen/Qwen3-30B-A3B": dict(
        _QWEN3, model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, intermediate_size=6144,
        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
    ),
    "Qwen/Qwen3-235B-A22B": dict(
        _QWEN3, model_type="qwen3_moe", hidden_size=4096, num_hidden_layers=94,
        num_attention_heads=64, num_key_value_heads=4, intermediate_size=12288,
        moe_intermediate_size=1536, num_experts=128, num_experts_per_tok=8,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
    ),
    # Llama 3.1 / 3.2 (3.2's 1B and 3B tie lm_head)
    "meta-llama/Llama-3.1-8B": dict(
        _LLAMA3, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, tie_word_embeddings=False,
    ),
    "meta-llama/Llama-3.1-70B": dict(
        _LLAMA3, hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, intermediate_size=28672, tie_word_embeddings=False,
    ),
    "meta-llama/Llama-3.1-405B": dict(
        _LLAMA3, hidden_size=16384, num_hidden_layers=126, num_attention_heads=128,
        num_key_value_heads=8, intermediate_size=53248, tie_word_embeddings=False,
    ),
    "meta-llama/Llama-3.2-1B": dict(
        _LLAMA3, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, intermediate_size=8192, tie_word_embeddings=True,
    ),
    "meta-llama/Llama-3.2-3B": dict(
        _LLAMA3, hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
        num_key_value_heads=8, head_dim=128, intermediate_size=8192, tie_word_embeddings=True,
    ),
    # DeepSeek-V3 (R1 shares the architecture): MLA attention, 3 dense layers then MoE
    # (256 routed experts, 8 per token, 1 shared); the multi-token-prediction module of
    # the checkpoint (num_nextn_predict_layers) is not part of the 671B.
    "deepseek-ai/DeepSeek-V3": dict(
        model_type="deepseek_v3", vocab_size=129280, hidden_size=7168,
        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
        intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=256,
        n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=3,
        moe_layer_freq=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, tie_word_embeddings=False,
        n_group=8, topk_group=4, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_scaling=dict(type="yarn", factor=40, original_max_position_embeddings=4096,
                          beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
    ),
    # Mistral 7B: v0.1 and v0.2 have a 32000-token vocabulary, v0.3 32768
    "mistralai/Mistral-7B-v0.1": dict(
        model_type="mistral", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
        tie_word_embeddings=False,
    ),
    "mistralai/Mistral-7B-v0.3": dict(
        model_type="mistral", vocab_size=32768, hidden_size=4096, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
        tie_word_embeddings=False,
    ),
    # Gemma-2 9B: head_dim 256 (queries are wider than the residual), four norms a layer
    "google/gemma-2-9b": dict(
        model_type="gemma2", vocab_size=256000, hidden_size=3584, num_hidden_layers=42,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, intermediate_size=14336,
        tie_word_embeddings=True,
    ),
}
# fmt: on

# Other names for table rows (after _table_key normalisation: lower case, no org,
# no -instruct/-chat/-it/-base).
_ALIASES: dict[str, str] = {
    "deepseek-r1": "deepseek-ai/DeepSeek-V3",
    "deepseek-r1-0528": "deepseek-ai/DeepSeek-V3",
    "deepseek-v3-0324": "deepseek-ai/DeepSeek-V3",
    "mistral-7b": "mistralai/Mistral-7B-v0.3",
    "mistral-7b-v0.2": "mistralai/Mistral-7B-v0.1",
    "qwen3-235b-a22b-2507": "Qwen/Qwen3-235B-A22B",
    "qwen3-30b-a3b-2507": "Qwen/Qwen3-30B-A3B",
    # reward models: the body they were fine-tuned from (a one-label head for lm_head)
    "skywork-reward-v2-qwen3-0.6b": "Qwen/Qwen3-0.6B",
}

_SUFFIXES = ("-instruct", "-chat", "-it", "-base")


def _table_key(name: str) -> str:
    """'Qwen/Qwen2.5-7B-Instruct' -> 'qwen2.5-7b'; 'Meta-Llama-3.1-8B-Instruct' -> 'llama-3.1-8b'."""
    key = name.strip().rstrip("/").split("/")[-1].casefold()
    for suffix in _SUFFIXES:
        key = key.replace(suffix, "")
    if key.startswith("meta-llama-"):
        key = key[len("meta-") :]
    return key


_TABLE_INDEX: dict[str, str] = {_table_key(k): k for k in _TABLE}
_TABLE_INDEX.update(_ALIASES)


def find(name: str) -> str | None:
    """The table's model id for ``name`` (any case, with or without the organisation or
    a -instruct/-chat/-it/-base suffix, or an alias), or None."""
    return _TABLE_INDEX.get(_table_key(name))


def close_matches(name: str) -> tuple[str, ...]:
    """Up to three table ids whose names are close to ``name`` (for "did you mean")."""
    keys = difflib.get_close_matches(_table_key(name), list(_TABLE_INDEX), n=3, cutoff=0.6)
    return tuple(_TABLE_INDEX[k] for k in keys)


def known_models() -> tuple[str, ...]:
    """The built-in table's model ids."""
    return tuple(_TABLE)


def table_config(model_id: str) -> dict[str, Any]:
    """The table's config fields for ``model_id`` (a copy)."""
    return dict(_TABLE[model_id])
