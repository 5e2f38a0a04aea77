"""A quantized checkpoint (a ``quantization_config`` in its config.json) is refused for full
training at the engine's start, before Ray or any worker starts, naming the key and the
fixes; an adapter over it passes the check."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.config import load_config
from engine.errors import ConfigError


@pytest.fixture
def quantized(tiny_model_dir, tmp_path):
    model = tmp_path / "gptq"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (model / "config.json").write_text(json.dumps(config))
    return model


def _cfg(model, data, *extra):
    train, _ = data
    return load_config(
        [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=1",
            "data.max_prompt_length=64",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            *extra,
        ]
    )


@pytest.fixture
def data(tmp_path):
    from engine.data.synthetic import write_synthetic_dataset

    return write_synthetic_dataset(tmp_path / "data", n_train=16, n_val=4)


def test_full_training_of_a_quantized_checkpoint_stops_before_ray_starts(quantized, data):
    import ray

    from engine.runtime import run_training

    with pytest.raises(ConfigError) as err:
        run_training(_cfg(quantized, data, "algorithm.adv_estimator=grpo"))
    message = str(err.value)
    assert f"actor_rollout_ref.model.path='{quantized}' is a gptq checkpoint" in message
    assert "actor_rollout_ref.model.lora_rank" in message
    assert not ray.is_initialized()  # nothing started


def test_an_adapter_over_it_passes_and_the_critic_does_not(quantized, data):
    from transformers import AutoConfig

    from engine.config.train import quantized_model_problems

    def hf_config_of(model):
        return AutoConfig.from_pretrained(model.path)

    lora = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16"]
    grpo = _cfg(quantized, data, *lora, "algorithm.adv_estimator=grpo")
    assert quantized_model_problems(grpo, hf_config_of) == []
    ppo = _cfg(quantized, data, *lora, "algorithm.adv_estimator=gae")
    (problem,) = quantized_model_problems(ppo, hf_config_of)
    assert "the critic trains every weight" in problem


def test_a_saved_adapter_over_it_passes_the_check_before_ray(
    quantized, data, tmp_path, monkeypatch
):
    """``lora_adapter_path`` without ``lora_rank`` is LoRA over the frozen base: the run
    goes on to Ray, with the adapter's settings already the config's (read on the driver
    before the data thread and Ray start, engine.runtime.run_training)."""
    from engine import runtime

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    saved = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
    (adapter / "adapter_config.json").write_text(json.dumps(saved))
    (adapter / "adapter_model.safetensors").write_bytes(b"")  # read by the actor, not here

    class RayStarting(Exception):
        pass

    def init_ray(cfg):
        assert cfg.actor_rollout_ref.model.lora_rank == 8  # the adapter's, for every role
        raise RayStarting

    monkeypatch.setattr(runtime, "init_ray", init_ray)
    grpo = "algorithm.adv_estimator=grpo"  # no critic, which would train every weight
    cfg = _cfg(quantized, data, f"actor_rollout_ref.model.lora_adapter_path={adapter}", grpo)
    with pytest.raises(RayStarting):
        runtime.run_training(cfg)


def test_a_local_folder_is_checked_once_before_ray(quantized, data):
    """A local folder's config.json is read for it before Ray (``_check_local_checkpoints``);
    the data thread's ``_check_model_configs`` checks only a hub name's."""
    from engine.runtime import _check_local_checkpoints, _check_model_configs

    cfg = _cfg(quantized, data, "algorithm.adv_estimator=grpo")
    with pytest.raises(ConfigError):
        _check_local_checkpoints(cfg)
    _check_model_configs(cfg)
