"""The model-family registry (engine.models.families) is complete: every family has each
part, ``MODEL_TYPES`` is the registry, the registry loads no torch, and every family's
tiny model converts to Megatron-core names and back and translates into a
TransformerConfig without a problem. (A Megatron-core build of every family against
Hugging Face: tests/engine/train/test_megatron_backend.py::test_every_family_matches_hf;
the planner's counts of every family: tests/rlctl/test_models.py.)"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models.families import FAMILIES, MODEL_TYPES, family, family_rules
from engine.models.families.base import PLAIN_DECODER, ModelFamily, TinySize, WeightNames
from engine.schema import MODEL_TYPES as SCHEMA_MODEL_TYPES

ROOT = Path(__file__).resolve().parents[3]

# The sizes the tests build every family at (small enough to run in a blink).
TINY = dict(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)


def test_model_types_are_the_registry():
    assert MODEL_TYPES == tuple(FAMILIES) == SCHEMA_MODEL_TYPES
    assert all(f.model_type == name for name, f in FAMILIES.items())
    # the order messages list them in (as before the registry)
    assert MODEL_TYPES[:3] == ("llama", "mistral", "qwen2")


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_family_has_each_part(model_type):
    """Each part of the record is there and answers for the family's tiny config, the
    same for the config object (the engine's) and its config.json fields (the planner's)."""
    pytest.importorskip("transformers")
    from engine.models.tiny import tiny_config

    f = family(model_type)
    cfg = tiny_config(model_type, **TINY)
    for form in (cfg, cfg.to_dict()):
        # (a) the shape
        assert isinstance(f.qkv_bias(form), bool) and isinstance(f.o_proj_bias(form), bool)
        assert isinstance(f.qk_norm, bool) and isinstance(f.mla, bool)
        assert f.sliding_window(form) is False
        assert len(f.moe_layers(form)) == TINY["num_layers"]
        assert f.shared_expert_size(form) >= 0
        assert isinstance(f.shared_expert_gate, bool)
        # (b) the Megatron-core translation
        assert isinstance(f.router(form), dict)
        assert isinstance(f.megatron_kwargs(form), dict)
        assert f.problems(form) == []
    assert {"default", "llama3"} <= set(f.rope_types)
    # (c) the weight names, (d) the tiny config
    assert isinstance(f.weights, WeightNames) and isinstance(f.weights.shared_expert, str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in f.weights.layer.items())
    assert isinstance(f.tiny(TinySize(32, 4)), dict)
    checked = {"model_type", "qkv_bias", "o_proj_bias", "qk_norm", "mla", "sliding_window"}
    checked |= {"moe_layers", "shared_expert_size", "shared_expert_gate", "router"}
    checked |= {"megatron_kwargs", "problems", "rope_types", "weights", "tiny"}
    assert checked == {p.name for p in dataclasses.fields(ModelFamily)}, "a new part: test it"


def test_unknown_types():
    with pytest.raises(ValueError, match="no model family 'gpt2'; registered: llama, mistral"):
        family("gpt2")
    assert family_rules("gemma2") is PLAIN_DECODER
    assert family_rules("qwen3").qk_norm


def test_the_registry_loads_no_torch():
    probe = (
        "import sys, engine.models.families; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_family_converts_both_ways(model_type):
    """The family's tiny model: checkpoint names to Megatron-core's and back, every
    tensor in place, with the family's names; its config translates without a problem."""
    torch = pytest.importorskip("torch")
    from engine.config.megatron_parallel import MegatronParallel
    from engine.models.megatron_config import (
        AttentionShape,
        conversion_problems,
        gpt_model_kwargs,
        transformer_config_kwargs,
    )
    from engine.models.tiny import random_model, tiny_config
    from engine.rollout.weights import as_checkpoint, checkpoint_reverter
    from engine.train.megatron_convert import hf_to_megatron, megatron_to_hf

    cfg = tiny_config(model_type, **TINY)
    assert cfg.model_type == model_type
    assert conversion_problems(cfg) == []
    assert MegatronParallel(2, sequence_parallel=True).model_problems(cfg) == []
    kw = transformer_config_kwargs(cfg)
    assert kw["qk_layernorm"] == (family(model_type).qk_norm or family(model_type).mla)
    gpt_model_kwargs(cfg)

    model = random_model(cfg, seed=0)
    state = dict(as_checkpoint(model.state_dict().items(), checkpoint_reverter(model)))
    state.pop("lm_head.weight")  # tied
    shape = AttentionShape.of(cfg)
    names = family(model_type).weights
    mc = hf_to_megatron(state, shape, tie_word_embeddings=True, fused_norms=False, names=names)
    back = megatron_to_hf(mc, shape, fused_norms=False, names=names)
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)
