"""The rollout's engine, built from the config as training's are (engine.train.engines):
``hf`` (the FSDP actor's own module, or a plain copy of its own), ``vllm`` or ``sglang``,
and where its weights come from (``WeightSource``): the worker never branches on how
it was built, only on that value.
"""

from __future__ import annotations

import enum
from typing import Any

from engine.config import EngineConfig
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.models.hf_config import config_overrides, load_hf_config
from engine.rollout.base import RolloutEngine
from engine.rollout.hf import eos_ids
from engine.rollout.translate import EngineSettings
from engine.train.fsdp import DTYPES, full_parameters, load_hf_model


class WeightSource(enum.Enum):
    """Where the rollout's weights come from."""

    ACTOR_MODULE = "actor_module"  # HF generating with the FSDP actor's module: never synced
    ACTOR_BESIDE = "actor_beside"  # a copy of its own, synced from the actor in this process
    BRIDGE = "bridge"  # placement=separate: the controller pushes them over a bridge


def weight_source(cfg: EngineConfig, colocated_actor: bool) -> WeightSource:
    """A separate rollout has no actor beside it; a Megatron actor's weights cannot
    generate, and vLLM and SGLang always hold their own copy."""
    if not colocated_actor:
        return WeightSource.BRIDGE
    arr = cfg.actor_rollout_ref
    if arr.rollout.name == "hf" and arr.actor.strategy != "megatron":
        return WeightSource.ACTOR_MODULE
    return WeightSource.ACTOR_BESIDE


def rollout_dtype(cfg: EngineConfig, device: DeviceSpec) -> Any:
    """The rollout's weights' dtype (None on CPU: float32, as trained)."""
    return DTYPES[cfg.actor_rollout_ref.rollout.dtype] if device.supports_bf16 else None


def rollout_engine(
    cfg: EngineConfig,
    device: DeviceSpec,
    tokenizer: Any,
    actor_module: Any | None,
    separate: bool,
) -> RolloutEngine:
    """The configured engine. ``actor_module``: the colocated FSDP actor's module (an HF
    rollout generates with it, vLLM and SGLang read its EOS ids), None for a Megatron
    actor or a separate rollout (a copy of its own, the EOS ids from the model folder)."""
    rollout_cfg = cfg.actor_rollout_ref.rollout
    model = cfg.actor_rollout_ref.model
    if rollout_cfg.name == "hf":
        from engine.rollout.hf import HFRollout

        module = actor_module if actor_module is not None else _own_hf_model(cfg, device)
        return HFRollout(
            module,
            tokenizer,
            device.torch_device(),
            micro_batch_size=rollout_cfg.micro_batch_size,
            logprobs=rollout_cfg.calculate_log_probs,
            routing=rollout_cfg.enable_rollout_routing_replay,
            # the actor's FSDP shards, gathered for each generation
            gather=full_parameters if actor_module is not None else None,
        )
    eos_source = actor_module if actor_module is not None else generation_config(model)
    settings = engine_settings(cfg, device, eos_ids(tokenizer, eos_source), separate)
    # A LoRA actor's adapter served by the engine itself (else: merged weights).
    lora_rank = model.lora_rank if rollout_cfg.lora_as_adapter else 0
    if rollout_cfg.name == "vllm":
        from engine.rollout.vllm import VLLMRollout

        return VLLMRollout(rollout_cfg, settings, lora_rank=lora_rank)
    if rollout_cfg.name == "sglang":
        from engine.rollout.sglang import SGLangRollout

        return SGLangRollout(
            rollout_cfg,
            settings,
            local_rank=device.torch_device().index or 0,
            lora_rank=lora_rank,
            lora_targets=model.target_modules,
        )
    raise EngineError(f"unknown actor_rollout_ref.rollout.name {rollout_cfg.name!r}")


def _own_hf_model(cfg: EngineConfig, device: DeviceSpec) -> Any:
    """The HF rollout's own model (a Megatron actor, or a separate rollout), on the
    device in the rollout dtype; its weights come from the actor before it generates."""
    module = load_hf_model(cfg.actor_rollout_ref.model)
    module.requires_grad_(False)
    return module.to(device=device.torch_device(), dtype=rollout_dtype(cfg, device))


def engine_settings(
    cfg: EngineConfig, device: DeviceSpec, eos_token_ids: Any, separate: bool
) -> EngineSettings:
    """What the vLLM or SGLang engine of this rollout is built from."""
    rollout_cfg = cfg.actor_rollout_ref.rollout
    model = cfg.actor_rollout_ref.model
    # The engine holds what the actor pushes: the rollout dtype on accelerators,
    # float32 on CPU (where the actor trains in float32, see DeviceSpec.supports_bf16).
    engine_dtype = rollout_cfg.dtype if device.supports_bf16 else "float32"
    # the context: rollout.max_model_len (verl's key), or a prompt and its response
    max_model_len = (
        rollout_cfg.max_model_len or cfg.data.max_prompt_length + cfg.data.max_response_length
    )
    return EngineSettings(
        model_path=model.path,
        eos_token_ids=frozenset(eos_token_ids),
        max_model_len=max_model_len,
        seed=cfg.trainer.seed,
        trust_remote_code=model.trust_remote_code,
        # The first generation pushes the actor's weights: no second read from disk.
        load_format="dummy",
        local_world_size=(
            rollout_cfg.separate_n_gpus_per_node if separate else cfg.trainer.n_gpus_per_node
        ),
        bucket_bytes=rollout_cfg.update_weights_bucket_megabytes * 2**20,
        dtype=engine_dtype,
        kv_cache_bytes=(
            _cpu_kv_cache_bytes(cfg, engine_dtype, max_model_len) if device.type == "cpu" else None
        ),
        # the model the actor trains: its override_config (the HF rollout runs or loads
        # the actor's model, which has it already)
        hf_overrides=config_overrides(model),
        mm_processor_kwargs=dict(cfg.data.mm_processor_kwargs),
    )


def _cpu_kv_cache_bytes(cfg: EngineConfig, dtype: str, max_model_len: int) -> int:
    """On CPU vLLM sizes its KV cache as a fraction of the host's RAM per engine (two
    workers at the default 0.5 would ask for all of it): size it for what one engine
    generates per training step instead, every sequence at full length."""
    from engine.rollout.translate import kv_cache_bytes_for

    rollout = cfg.actor_rollout_ref.rollout
    hf_config = load_hf_config(cfg.actor_rollout_ref.model)
    devices = (
        rollout.separate_nnodes * rollout.separate_n_gpus_per_node
        if rollout.placement == "separate"
        else cfg.world_size
    )
    engines = max(1, devices // rollout.tensor_model_parallel_size)
    prompts = cfg.data.train_batch_size
    if cfg.async_training.mode == "fully_async":  # up to the admission cap in flight
        from engine.config.async_training import admission_cap

        prompts = admission_cap(cfg)
    rows = -(-prompts * rollout.n // engines)
    return kv_cache_bytes_for(hf_config, dtype, max_model_len, rows)


def generation_config(model_cfg: Any) -> Any:
    """An object with the model's ``generation_config`` (its EOS ids), read from the
    model folder: a Megatron actor has no HF module to ask."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(
            model_cfg.path, trust_remote_code=model_cfg.trust_remote_code
        )
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        config = None
    return SimpleNamespace(generation_config=config)
