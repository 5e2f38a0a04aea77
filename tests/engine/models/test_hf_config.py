"""``<model>.override_config`` (verl's key): the fields replaced in the model's Hugging
Face config when the actor, reference and critic build it, the same fields given to the
rollout engines, and a field the config lacks refused by its key before workers start."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.config import load_config
from engine.errors import ConfigError
from engine.models.hf_config import config_overrides, load_hf_config, loading_kwargs
from engine.rollout.translate import EngineSettings
from engine.train.fsdp import load_hf_model

ACTOR = "actor_rollout_ref.model"


def _config(model_dir, *overrides, check=True):
    return load_config(
        [f"{ACTOR}.path={model_dir}", "data.train_files=t.parquet", *overrides], check=check
    )


def test_verl_command_line_sets_the_fields(tiny_model_dir):
    cfg = _config(
        tiny_model_dir,
        f"+{ACTOR}.override_config.max_position_embeddings=32768",
        f"+{ACTOR}.override_config.attention_dropout=0.25",
    )
    model = cfg.actor_rollout_ref.model
    assert model.override_config == {"max_position_embeddings": 32768, "attention_dropout": 0.25}
    hf = load_hf_config(model)
    assert hf.max_position_embeddings == 32768 and hf.attention_dropout == 0.25
    assert hf.hidden_size == 128  # the rest is the folder's


def test_verls_model_config_level_and_attn_implementation(tiny_model_dir):
    cfg = _config(
        tiny_model_dir,
        f"+{ACTOR}.override_config.model_config.max_position_embeddings=4096",
        f"+{ACTOR}.override_config.attn_implementation=eager",
    )
    model = cfg.actor_rollout_ref.model
    assert config_overrides(model) == {"max_position_embeddings": 4096}  # what rollouts get
    assert loading_kwargs(model) == {"attn_implementation": "eager"}
    assert load_hf_config(model).max_position_embeddings == 4096
    loaded = load_hf_model(model)
    assert loaded.config._attn_implementation == "eager"
    # a key beside verl's level would be read by nothing
    stray = _config(tiny_model_dir, f"+{ACTOR}.override_config.model_config.rope_theta=1",
                    f"+{ACTOR}.override_config.moe_config.freeze_moe_router=true")  # fmt: skip
    with pytest.raises(ConfigError) as err:
        load_hf_config(stray.actor_rollout_ref.model)
    assert f"{ACTOR}.override_config.moe_config: beside verl's model_config level" in str(err.value)


def test_a_field_the_config_lacks_is_refused_by_its_key(tiny_model_dir):
    cfg = _config(tiny_model_dir, f"+{ACTOR}.override_config.max_position_embedding=64")
    with pytest.raises(ConfigError) as err:
        load_hf_config(cfg.actor_rollout_ref.model)
    (problem,) = err.value.problems
    assert problem.startswith(
        f"{ACTOR}.override_config.max_position_embedding: the model's config (Qwen2Config)"
        " has no field 'max_position_embedding'"
    )
    assert "did you mean 'max_position_embeddings'?" in problem


def test_a_sub_configs_fields_are_set_in_it():
    from transformers import Qwen2_5_VLConfig

    from engine.models.hf_config import apply_overrides, override_problems

    hf = Qwen2_5_VLConfig()
    key = f"{ACTOR}.override_config"
    overrides = {"text_config": {"max_position_embeddings": 1234}, "tie_word_embeddings": True}
    assert override_problems(hf, overrides, key) == []
    apply_overrides(hf, overrides)
    assert hf.text_config.max_position_embeddings == 1234 and hf.tie_word_embeddings is True
    (problem,) = override_problems(hf, {"text_config": {"no_such": 1}}, key)
    assert problem.startswith(
        f"{key}.text_config.no_such: the model's config (Qwen2_5_VLTextConfig)"
    )
    # a field of the text config given at the top (verl's Qwen3-VL example): said where it is
    (problem,) = override_problems(hf, {"max_position_embeddings": 32768}, key)
    assert f"its text_config has it: set {key}.text_config.max_position_embeddings" in problem


def test_the_training_roles_build_the_overridden_model(tiny_model_dir):
    """The actor's (and reference's) and the critic's models are built from the
    overridden config, with the folder's weights."""
    cfg = _config(
        tiny_model_dir,
        f"+{ACTOR}.override_config.attention_dropout=0.25",
        f"+{ACTOR}.override_config.max_position_embeddings=32768",
    )
    actor = load_hf_model(cfg.actor_rollout_ref.model)
    assert actor.config.max_position_embeddings == 32768
    assert actor.model.layers[0].self_attn.attention_dropout == 0.25  # the layers read it
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert plain.model.layers[0].self_attn.attention_dropout == 0.0
    assert all(
        torch.equal(a, b) for a, b in zip(actor.parameters(), plain.parameters(), strict=True)
    )
    critic = load_hf_model(cfg.actor_rollout_ref.model, kind="value")
    assert critic.config.max_position_embeddings == 32768 and critic.score.out_features == 1


def test_the_critic_on_the_actors_model_takes_its_own_over_the_actors(tiny_model_dir):
    from engine.config.train import selected_model

    cfg = _config(
        tiny_model_dir,
        f"+{ACTOR}.override_config.attention_dropout=0.25",
        f"+{ACTOR}.override_config.max_position_embeddings=4096",
        "+critic.model.override_config.attention_dropout=0.5",
    )
    critic = selected_model(cfg, "critic")
    assert critic.override_config == {"attention_dropout": 0.5, "max_position_embeddings": 4096}
    assert cfg.actor_rollout_ref.model.override_config["attention_dropout"] == 0.25  # unchanged


def test_the_rollout_engines_get_the_same_fields():
    overrides = {"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0}}
    cfg = load_config(["actor_rollout_ref.model.path=m", "data.train_files=t"])
    settings = EngineSettings("m", frozenset({2}), 64, hf_overrides=overrides)
    rollout = cfg.actor_rollout_ref.rollout
    assert settings.engine_args(rollout, "vllm")["hf_overrides"] == overrides
    sglang = settings.engine_args(rollout, "sglang")["json_model_override_args"]
    assert json.loads(sglang) == overrides
    plain = EngineSettings("m", frozenset({2}), 64)
    assert "hf_overrides" not in plain.engine_args(rollout, "vllm")
    assert "json_model_override_args" not in plain.engine_args(rollout, "sglang")


def test_checked_before_workers_start_naming_each_roles_key(tiny_model_dir):
    from engine.runtime import _check_model_configs

    critic = [
        "algorithm.adv_estimator=gae",
        f"critic.model.path={tiny_model_dir}",
        "+critic.model.override_config.hidden_dropout=0.1",
    ]
    cfg = _config(tiny_model_dir, f"+{ACTOR}.override_config.embd_pdrop=0.0", *critic,
                  check=False)  # fmt: skip
    with pytest.raises(ConfigError) as err:
        _check_model_configs(cfg)
    first, second = err.value.problems
    assert first.startswith(f"{ACTOR}.override_config.embd_pdrop: the model's config")
    assert second.startswith("critic.model.override_config.hidden_dropout: the model's config")
    _check_model_configs(_config(tiny_model_dir, f"+{ACTOR}.override_config.attention_dropout=0"))


def test_the_rollout_role_builds_its_engine_with_the_actors_overrides(tiny_model_dir):
    from engine.device import DEVICES
    from engine.workers.rollout_engine import engine_settings

    cfg = _config(
        tiny_model_dir,
        "actor_rollout_ref.rollout.name=vllm",
        f"+{ACTOR}.override_config.max_position_embeddings=32768",
        f"+{ACTOR}.override_config.attn_implementation=eager",  # transformers' alone
    )
    settings = engine_settings(cfg, DEVICES["cpu"], {2}, separate=False)
    assert settings.hf_overrides == {"max_position_embeddings": 32768}
    plain = engine_settings(_config(tiny_model_dir), DEVICES["cpu"], {2}, separate=False)
    assert plain.hf_overrides == {}


def test_a_megatron_role_converts_the_overridden_config(tiny_model_dir, monkeypatch):
    """The Megatron roles build from the same overridden config (its conversion reads it)."""
    from engine.device import DEVICES
    from engine.train import engines
    from engine.train.megatron import MegatronEngine

    seen = {}
    monkeypatch.setattr(MegatronEngine, "from_hf", lambda *a, **kw: seen.update(kw))
    cfg = _config(
        tiny_model_dir,
        "actor_rollout_ref.actor.strategy=megatron",
        f"+{ACTOR}.override_config.max_position_embeddings=4096",
    )
    engines.actor_engine(cfg, DEVICES["cpu"])
    assert seen["hf_config"].max_position_embeddings == 4096
