"""rlctl.models: the parameter formula against real transformers models, the table
against published sizes, and the resolution order (local config, table, hub)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from engine.schema import MODEL_TYPES
from rlctl.errors import RlctlError
from rlctl.model_table import known_models, table_config
from rlctl.models import UnknownModelError, model_shape, shape_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_counts(model_type: str, **fields):
    """(total params, largest decoder layer, params outside the layers) of a real
    transformers model built on the meta device (no memory, no weights)."""
    return counts_of(transformers.AutoConfig.for_model(model_type, **fields))


def counts_of(config):
    """The units FSDP shards one by one are the decoder layers, and a vision-language
    model's vision blocks too (``_no_split_modules``)."""
    vision = getattr(config, "vision_config", None) is not None
    auto = transformers.AutoModelForImageTextToText if vision else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    if vision:
        units = [*model.model.language_model.layers, *model.model.visual.blocks]
    else:
        units = list(model.model.layers)
    largest = max(sum(p.numel() for p in unit.parameters()) for unit in units)
    return total, largest, total - sum(p.numel() for u in units for p in u.parameters())


def ours(model_type: str, **fields):
    return shape_from_config({"model_type": model_type, **fields}, name="test", source="test")


# Tiny and medium configs of every architecture family the formula knows, including
# the corners: tied and untied heads, q/k/v biases (Qwen2), Llama's attention_bias and
# mlp_bias, queries wider than the residual (Gemma-2), per-head q/k norms (Qwen3),
# routed experts with and without shared experts, MLA with and without a query LoRA.
ARCHITECTURES = {
    "qwen2-tiny": ("qwen2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                 tie_word_embeddings=True)),
    "qwen2-medium": ("qwen2", dict(hidden_size=1024, intermediate_size=2816,
                                   num_hidden_layers=12, num_attention_heads=16,
                                   num_key_value_heads=4, vocab_size=32000,
                                   tie_word_embeddings=False)),
    "llama-tiny-tied": ("llama", dict(hidden_size=96, intermediate_size=256,
                                      num_hidden_layers=3, num_attention_heads=6,
                                      num_key_value_heads=2, vocab_size=512,
                                      tie_word_embeddings=True)),
    "llama-biases": ("llama", dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=8,
                                   vocab_size=700, attention_bias=True, mlp_bias=True)),
    "llama-medium-head-dim": ("llama", dict(hidden_size=2048, intermediate_size=5632,
                                            num_hidden_layers=8, num_attention_heads=16,
                                            num_key_value_heads=4, head_dim=64,
                                            vocab_size=50000)),
    "mistral": ("mistral", dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                num_attention_heads=8, num_key_value_heads=2, vocab_size=2000)),
    "qwen3": ("qwen3", dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3,
                            num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                            vocab_size=1024, tie_word_embeddings=False)),
    "gemma2": ("gemma2", dict(hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=48,
                              vocab_size=640)),
    "qwen3-moe": ("qwen3_moe", dict(hidden_size=128, intermediate_size=384,
                                    moe_intermediate_size=64, num_experts=8,
                                    num_experts_per_tok=2, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    vocab_size=1000, tie_word_embeddings=False)),
    "qwen2-moe-shared": ("qwen2_moe", dict(hidden_size=128, intermediate_size=384,
                                           moe_intermediate_size=64, num_experts=6,
                                           num_experts_per_tok=2,
                                           shared_expert_intermediate_size=256,
                                           num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=4, vocab_size=900,
                                           tie_word_embeddings=False)),
    "qwen2-moe-no-qkv-bias": ("qwen2_moe", dict(hidden_size=128, intermediate_size=384,
                                                moe_intermediate_size=64, num_experts=4,
                                                num_experts_per_tok=2, qkv_bias=False,
                                                shared_expert_intermediate_size=128,
                                                num_hidden_layers=2, num_attention_heads=4,
                                                num_key_value_heads=2, vocab_size=900)),
    "mixtral": ("mixtral", dict(hidden_size=128, intermediate_size=256, num_local_experts=4,
                                num_experts_per_tok=2, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=800)),
    "deepseek-v3-tiny": ("deepseek_v3", dict(hidden_size=256, intermediate_size=512,
                                             moe_intermediate_size=64, n_routed_experts=8,
                                             n_shared_experts=1, num_experts_per_tok=2,
                                             first_k_dense_replace=1, num_hidden_layers=3,
                                             num_attention_heads=8, num_key_value_heads=8,
                                             q_lora_rank=96, kv_lora_rank=64,
                                             qk_nope_head_dim=32, qk_rope_head_dim=16,
                                             v_head_dim=32, vocab_size=1000, n_group=2,
                                             topk_group=1)),
    "deepseek-v3-no-q-lora": ("deepseek_v3", dict(hidden_size=256, intermediate_size=512,
                                                  moe_intermediate_size=64, n_routed_experts=4,
                                                  n_shared_experts=2, num_experts_per_tok=2,
                                                  first_k_dense_replace=2, num_hidden_layers=3,
                                                  num_attention_heads=4, num_key_value_heads=4,
                                                  q_lora_rank=None, kv_lora_rank=64,
                                                  qk_nope_head_dim=32, qk_rope_head_dim=16,
                                                  v_head_dim=32, vocab_size=1000, n_group=1,
                                                  topk_group=1)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_parameter_formula_is_exact(name):
    model_type, fields = ARCHITECTURES[name]
    total, largest, root = hf_counts(model_type, **fields)
    shape = ours(model_type, **fields)
    assert shape.num_params == total
    assert shape.largest_layer_params == largest
    assert shape.root_params == root


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_model_family_is_counted_exactly(model_type):
    """Each Megatron model family's tiny model (engine.models.families): the planner's
    counts from its config.json fields are transformers' counts."""
    from engine.models.tiny import tiny_config

    config = tiny_config(model_type, vocab_size=128, hidden_size=32, num_layers=2)
    shape = shape_from_config(config.to_dict(), name="tiny", source="test")
    assert (shape.num_params, shape.largest_layer_params, shape.root_params) == counts_of(config)


@pytest.mark.parametrize("model_id", known_models())
def test_every_table_row_matches_transformers(model_id):
    """Full-size shapes on the meta device: the table's counts are transformers' counts."""
    fields = table_config(model_id)
    model_type = fields.pop("model_type")
    total, largest, root = hf_counts(model_type, **fields)
    shape = model_shape(model_id)
    assert (shape.num_params, shape.largest_layer_params, shape.root_params) == (
        total,
        largest,
        root,
    )


# Published sizes (model cards / papers): total and, for MoE, activated parameters.
PUBLISHED = {
    # engine/models/tiny.py (its exact count is checked against a built model below)
    "rlctl:tiny": (1_247_360, None),
    "Qwen/Qwen2.5-0.5B": (0.49e9, None),
    "Qwen/Qwen2.5-1.5B": (1.54e9, None),
    "Qwen/Qwen2.5-3B": (3.09e9, None),
    "Qwen/Qwen2.5-7B": (7.61e9, None),
    "Qwen/Qwen2.5-14B": (14.7e9, None),
    "Qwen/Qwen2.5-32B": (32.5e9, None),
    "Qwen/Qwen2.5-72B": (72.7e9, None),
    "Qwen/Qwen2-7B": (7.62e9, None),
    "Qwen/Qwen2.5-VL-3B": (3.75e9, None),
    "Qwen/Qwen2.5-VL-7B": (8.29e9, None),
    "Qwen/Qwen3-0.6B": (0.6e9, None),
    "Qwen/Qwen3-1.7B": (1.7e9, None),
    "Qwen/Qwen3-4B": (4.0e9, None),
    "Qwen/Qwen3-8B": (8.2e9, None),
    "Qwen/Qwen3-14B": (14.8e9, None),
    "Qwen/Qwen3-32B": (32.8e9, None),
    "Qwen/Qwen3-30B-A3B": (30.5e9, 3.3e9),
    "Qwen/Qwen3-235B-A22B": (235e9, 22e9),
    "meta-llama/Llama-3.1-8B": (8.03e9, None),
    "meta-llama/Llama-3.1-70B": (70.6e9, None),
    "meta-llama/Llama-3.1-405B": (405e9, None),
    "meta-llama/Llama-3.2-1B": (1.24e9, None),
    "meta-llama/Llama-3.2-3B": (3.21e9, None),
    "deepseek-ai/DeepSeek-V3": (671e9, 37e9),
    "mistralai/Mistral-7B-v0.1": (7.24e9, None),
    "mistralai/Mistral-7B-v0.3": (7.25e9, None),
    "google/gemma-2-9b": (9.24e9, None),
}


def test_published_table_covers_every_row():
    assert set(PUBLISHED) == set(known_models())


@pytest.mark.parametrize("model_id", sorted(PUBLISHED))
def test_table_counts_match_published_sizes(model_id):
    total, active = PUBLISHED[model_id]
    shape = model_shape(model_id)
    assert shape.num_params == pytest.approx(total, rel=0.03)
    if active is None:
        assert shape.active_params is None and not shape.is_moe
    else:
        assert shape.active_params == pytest.approx(active, rel=0.03)


def test_kv_cache_bytes_per_token():
    # Qwen2.5-7B: 2 (K, V) × 28 layers × 4 KV heads × 128 × 2 bytes
    assert model_shape("Qwen/Qwen2.5-7B").kv_cache_bytes_per_token() == 2 * 28 * 4 * 128 * 2
    # DeepSeek-V3 (MLA): one latent of kv_lora_rank 512 + rope 64 per layer, 61 layers
    assert model_shape("deepseek-ai/DeepSeek-V3").kv_cache_bytes_per_token() == 61 * 576 * 2
    # fp32 (CPU) doubles it
    assert model_shape("Qwen/Qwen2.5-0.5B").kv_cache_bytes_per_token(4) == 2 * 24 * 2 * 64 * 4


def test_moe_shape_details():
    shape = model_shape("Qwen/Qwen3-30B-A3B")
    assert (shape.num_experts, shape.experts_per_token, shape.moe_intermediate_size) == (
        128,
        8,
        768,
    )
    assert shape.mlp_width_per_token == 8 * 768
    assert shape.intermediate_size == 0  # every layer is a mixture of experts
    dsv3 = model_shape("deepseek-ai/DeepSeek-V3")
    assert dsv3.shared_expert_size == 2048
    assert dsv3.mlp_width_per_token == 9 * 2048
    assert dsv3.intermediate_size == 18432  # the three dense layers


# ---------------------------------------------------------------------------
# resolution


def test_table_names_accept_instruct_and_org_variants():
    base = model_shape("Qwen/Qwen2.5-7B")
    for name in ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b", "Qwen2.5-7B-Instruct"):
        shape = model_shape(name)
        assert shape.num_params == base.num_params
        assert shape.source == "built-in table (Qwen/Qwen2.5-7B)"
        assert shape.name == name
    assert model_shape("meta-llama/Meta-Llama-3.1-8B-Instruct").num_params == 8030261248
    assert model_shape("google/gemma-2-9b-it").num_params == 9241705984
    assert (
        model_shape("deepseek-ai/DeepSeek-R1").num_params
        == model_shape("deepseek-ai/DeepSeek-V3").num_params
    )


def test_local_config_json_is_read(tmp_path):
    """A real config.json (as transformers writes it) beats the table, and says so."""
    config = transformers.Qwen2Config(
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=5000,
        tie_word_embeddings=True,
    )
    folder = tmp_path / "Qwen2.5-7B"  # a name the table knows: the folder still wins
    config.save_pretrained(folder)
    shape = model_shape(str(folder))
    assert shape.source == f"config.json at {folder / 'config.json'}"
    assert shape.num_params == counts_of(config)[0]
    assert model_shape(str(folder / "config.json")).num_params == shape.num_params


def test_multimodal_text_config_is_used(tmp_path):
    text = dict(model_type="llama", hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, vocab_size=300)  # fmt: skip
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llava", "text_config": text, "tie_word_embeddings": False})
    )
    assert model_shape(str(tmp_path)).num_params == ours(**text).num_params


def test_vision_towers_are_counted_exactly():
    """Qwen2-VL's and Qwen2.5-VL's vision towers beside their language models, tiny, each
    config saved as transformers saves it (``text_config``) and in the published layout
    (the language model's fields at the top, as Qwen's own config.json has them)."""
    text = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]})  # fmt: skip
    configs = [
        transformers.Qwen2_5_VLConfig(
            text_config=text, tie_word_embeddings=False,
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2,
                               out_hidden_size=64, fullatt_block_indexes=[1]),
        ),
        transformers.Qwen2VLConfig(
            text_config=text, tie_word_embeddings=True,
            vision_config=dict(depth=3, embed_dim=32, mlp_ratio=2, num_heads=2, hidden_size=64),
        ),
    ]  # fmt: skip
    for config in configs:
        expected = counts_of(config)
        saved = config.to_dict()
        published = {**{k: v for k, v in saved.items() if k != "text_config"}, **text}
        for fields in (saved, published):
            shape = shape_from_config(fields, name="tiny", source="test")
            assert (shape.num_params, shape.largest_layer_params, shape.root_params) == expected
            assert shape.model_type == config.model_type
        with torch.device("meta"):
            model = transformers.AutoModelForImageTextToText.from_config(config)
        assert shape.vision_params == sum(p.numel() for p in model.model.visual.parameters())
        assert shape.compute_params == shape.num_params - shape.vision_params


def test_missing_local_config_is_an_error(tmp_path):
    with pytest.raises(UnknownModelError, match=r"config\.json"):
        model_shape(str(tmp_path))
    with pytest.raises(UnknownModelError, match="does not exist"):
        model_shape("./no/such/folder")


def test_config_without_the_shape_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UnknownModelError, match="hidden_size"):
        model_shape(str(tmp_path))


def test_unknown_model_names_close_matches(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UnknownModelError) as info:
        model_shape("Qwen/Qwen2.5-8B-Instruct")
    err = info.value
    assert isinstance(err, RlctlError)
    assert "Qwen/Qwen2.5-8B-Instruct" in str(err)
    assert "Qwen/Qwen2.5-7B" in err.suggestions
    assert "local folder" in err.hint


def _fake_hub(monkeypatch, tmp_path, config):
    calls = []

    def hf_hub_download(repo_id, filename, **kwargs):
        calls.append((repo_id, filename, kwargs))
        if config is None:
            raise OSError("404")
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        return str(path)

    monkeypatch.setitem(
        sys.modules, "huggingface_hub", types.SimpleNamespace(hf_hub_download=hf_hub_download)
    )
    return calls


def test_hub_is_asked_only_when_online(monkeypatch, tmp_path):
    config = dict(model_type="llama", hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, vocab_size=300)  # fmt: skip
    calls = _fake_hub(monkeypatch, tmp_path, config)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UnknownModelError):
        model_shape("someone/tiny-llama")
    assert calls == []

    monkeypatch.delenv("HF_HUB_OFFLINE")
    shape = model_shape("someone/tiny-llama")
    assert shape.source == "hub metadata (someone/tiny-llama)"
    assert shape.num_params == ours(**config).num_params
    assert calls[0][:2] == ("someone/tiny-llama", "config.json")
    assert calls[0][2]["etag_timeout"] <= 10
    # the table answers before the hub is asked
    model_shape("Qwen/Qwen3-8B")
    assert len(calls) == 1


def test_unreachable_hub_is_an_unknown_model(monkeypatch, tmp_path):
    _fake_hub(monkeypatch, tmp_path, None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(UnknownModelError, match="could not be fetched"):
        model_shape("someone/missing")


def test_shape_round_trips_through_json():
    shape = model_shape("deepseek-ai/DeepSeek-V3")
    data = json.loads(json.dumps(shape.to_json()))
    assert type(shape)(**data) == shape


def test_the_tiny_quickstart_model_matches_what_the_engine_builds(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlctl.models import model_shape

    built = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model_shape("rlctl:tiny").num_params == built.num_parameters()
