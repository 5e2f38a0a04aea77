"""Which training backend builds a role: ``strategy`` fsdp/fsdp2 → ``FSDPEngine``,
megatron → ``MegatronEngine`` (imported only then: megatron-core is an extra).

Both are ``TrainEngine``s (engine.train.protocol), so the actor, critic and reference
workers hold one ``engine`` and never branch on the backend.
"""

from __future__ import annotations

from typing import Any

from engine.config import EngineConfig, ModelConfig
from engine.config.role_keys import ULYSSES_KEYS
from engine.device import DeviceSpec
from engine.train.fsdp import FSDPEngine
from engine.train.logit_options import LogitOptions
from engine.train.protocol import TrainEngine


def actor_engine(cfg: EngineConfig, device: DeviceSpec) -> TrainEngine:
    arr = cfg.actor_rollout_ref
    actor = arr.actor
    if actor.strategy == "megatron":
        return _megatron(
            cfg, device, "actor", arr.model, actor.megatron, actor.optim, cfg.routing_replay.on
        )
    engine = FSDPEngine.from_hf(
        arr.model,
        actor.fsdp_config,
        actor.optim,
        device,
        gradient_checkpointing=arr.model.enable_gradient_checkpointing,
        lora=arr.model.uses_lora,
        ulysses=cfg.ulysses_size("actor"),
        ulysses_key=ULYSSES_KEYS["actor"],
        routing_replay=cfg.routing_replay.on,
    )
    engine.logit_options = LogitOptions.of(actor)  # verl's entropy and compile keys
    return engine


def reference_engine(cfg: EngineConfig, device: DeviceSpec) -> TrainEngine:
    arr = cfg.actor_rollout_ref
    if cfg.ref_strategy == "megatron":
        ref = arr.ref.megatron.resolved(arr.actor.megatron)  # null sizes: the actor's
        return _megatron(cfg, device, "reference", arr.model, ref, None)
    engine = FSDPEngine.from_hf(
        arr.model,
        arr.ref.fsdp_config,
        None,
        device,
        ulysses=cfg.ulysses_size("reference"),
        ulysses_key=ULYSSES_KEYS["reference"],
    )
    engine.logit_options = LogitOptions.of(arr.ref)
    return engine


def critic_model(cfg: EngineConfig) -> ModelConfig:
    """The critic's own model, or the actor's when ``critic.model.path`` is empty
    (``engine.config.train.selected_model``)."""
    from engine.config.train import selected_model

    return selected_model(cfg, "critic")


def critic_engine(cfg: EngineConfig, device: DeviceSpec) -> TrainEngine:
    critic = cfg.critic
    model_cfg = critic_model(cfg)
    if critic.strategy == "megatron":
        return _megatron(cfg, device, "critic", model_cfg, critic.megatron, critic.optim)
    return FSDPEngine.from_hf(
        model_cfg,
        critic.fsdp_config,
        critic.optim,
        device,
        kind="value",
        gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
        ulysses=cfg.ulysses_size("critic"),
        ulysses_key=ULYSSES_KEYS["critic"],
    )


def _megatron(
    cfg: EngineConfig,
    device: DeviceSpec,
    role: str,
    model_cfg: ModelConfig,
    section: Any,
    optim_cfg: Any,
    routing_replay: bool = False,
) -> TrainEngine:
    from engine.models.hf_config import load_hf_config
    from engine.train.megatron import MegatronEngine, MegatronParallel

    return MegatronEngine.from_hf(
        model_cfg.path,
        MegatronParallel.of(section),
        optim_cfg,
        device,
        role=role,
        hf_config=load_hf_config(model_cfg),  # with the model's override_config
        dtype=model_cfg.dtype,
        gradient_checkpointing=model_cfg.enable_gradient_checkpointing and optim_cfg is not None,
        total_steps=max(1, optim_cfg.total_training_steps) if optim_cfg is not None else 1,
        seed=cfg.trainer.seed,
        trust_remote_code=model_cfg.trust_remote_code,
        routing_replay=routing_replay,
    )
