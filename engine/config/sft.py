"""``python -m engine.sft``'s schema (``SFT``): verl's SFT trainer's keys
(``sft_sections.SFTConfig`` and its sections), verl's other spellings of
them, its config groups (``engine=megatron``, ``optim=megatron``, ``model=hf_model``),
its rules, and the RL-side config its workers are built from (``engine_view``).

The rules are this trainer's own, each naming the SFT key and the fix; where a check
is the RL trainer's on the same kind of value (an LR scheduler's name, Megatron's
parallel sizes), its function is called with SFT's key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.config.actor import ActorConfig, ActorRolloutRefConfig
from engine.config.aliases import Names
from engine.config.compose import Groups
from engine.config.critic import CriticConfig
from engine.config.engine import EngineConfig
from engine.config.fields import choice, positive
from engine.config.load import Schema
from engine.config.sft_sections import (
    CHECKPOINT_CONTENTS,
    EACH_EPOCH,
    PAD_MODES,
    SFT_STRATEGIES,
    SFT_TRUNCATION,
    SFTConfig,
)
from engine.config.train import DTYPES, ModelConfig, optim_problems
from engine.config.trainer import DEVICES, LOGGERS, RESUME_MODES, TrainerConfig
from engine.errors import ConfigError

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16"}
NAMES = Names(
    aliases={
        "optim.warmup_style": "optim.lr_scheduler_type",  # verl's deprecated name
        "optim.lr_decay_style": "optim.lr_scheduler_type",  # Megatron's
        "engine.use_remove_padding": "model.use_remove_padding",  # Megatron's copy
        # engine=automodel's names
        "engine.activation_checkpointing": "model.enable_gradient_checkpointing",
        "engine.mp_param_dtype": "engine.dtype",
        "optim.wd_incr_style": "optim.weight_decay_incr_style",
    },
    prefixes={},
    values={
        "engine.dtype": _DTYPES,
        "engine.strategy": {"fsdp_turbo": "fsdp2", "automodel": "fsdp2"},
    },
)
_OTHER_ENGINE = "verl's {} engine is not in this engine; use engine=fsdp (FSDP2) or engine=megatron"
GROUPS = Groups(
    groups={
        "engine": {
            "fsdp": {"engine.strategy": "fsdp"},
            "megatron": {"engine.strategy": "megatron"},
            # verl's AutoModel engine: FSDP2 of the HF model when its sizes are all 1
            "automodel": {"engine.strategy": "fsdp2"},
        },
        "optim": {
            "fsdp": {},
            "megatron": {},
            # verl's optim/automodel.yaml defaults (they differ from fsdp's)
            "automodel": {
                "optim.lr": 1e-5,
                "optim.betas": [0.9, 0.999],
                "optim.weight_decay": 0.01,
                "optim.init_lr_ratio": 0.1,
                "optim.min_lr_ratio": 0.01,
                "optim.lr_scheduler_type": "cosine",
            },
        },
        "model": {"hf_model": {}},
        "profiler": {"profiler": {}},
    },
    lacking={
        "torchtitan": _OTHER_ENGINE.format("TorchTitan"),
        "veomni": _OTHER_ENGINE.format("VeOmni"),
        "mlite": (
            "mlite is verl's Megatron-lite plugin engine (the verl_mlite package's config"
            " group), not in this engine; use engine=megatron with its engine.* sizes"
        ),
    },
    bundled={"sft_trainer_engine": {}},
)
OPTIMIZERS = ("adamw", "adam")  # Megatron's adam is AdamW (decoupled weight decay)


def rules(cfg: SFTConfig) -> list[str]:
    return [
        *data_rules(cfg),
        *engine_rules(cfg),
        *model_rules(cfg),
        *optim_rules(cfg),
        *trainer_rules(cfg),
    ]


def validate(cfg: SFTConfig) -> None:
    problems = rules(cfg)
    if problems:
        raise ConfigError(problems)


def data_rules(cfg: SFTConfig) -> list[str]:
    data = cfg.data
    p = choice(data.truncation, SFT_TRUNCATION, "data.truncation", "truncation mode")
    p += choice(data.pad_mode, PAD_MODES, "data.pad_mode", "pad mode")
    p += positive(
        [
            ("data.train_batch_size", data.train_batch_size),
            ("data.micro_batch_size_per_gpu", data.micro_batch_size_per_gpu),
            ("data.max_length", data.max_length),
            ("data.max_token_len_per_gpu", data.max_token_len_per_gpu),
        ]
    )
    if not data.train_file_list:
        p.append("data.train_files is required: a parquet or jsonl file (or a list of them)")
    if data.custom_cls.get("path") or data.custom_cls.get("name"):
        p.append(
            "data.custom_cls: verl's dataset classes yield verl's tensors, which this engine"
            " does not read; write the conversations as a messages column (docs/sft.md)"
        )
    value = data.enable_thinking_default
    if not (value is None or isinstance(value, bool) or str(value).lower() in _THINKING):
        p.append(f"data.enable_thinking_default={value!r}: give true, false or none (not passed)")
    dp = cfg.data_parallel_size
    if data.train_batch_size >= 1 and data.train_batch_size % dp:
        p.append(
            f"data.train_batch_size {data.train_batch_size} must split evenly over the"
            f" {dp} data-parallel ranks (trainer.nnodes × trainer.n_gpus_per_node over the"
            " ranks that share rows); give a multiple of it"
        )
    e = cfg.engine
    if cfg.megatron and e.pipeline_model_parallel_size > 1 and not data.use_dynamic_bsz:
        rows = data.train_batch_size // dp
        if rows and data.micro_batch_size_per_gpu >= 1 and rows % data.micro_batch_size_per_gpu:
            p.append(
                f"data.micro_batch_size_per_gpu {data.micro_batch_size_per_gpu} must divide"
                f" each data-parallel rank's {rows} conversations through a Megatron pipeline"
                " (every stage runs the same micro-batches); or set data.use_dynamic_bsz=true"
            )
    return p


_THINKING = ("none", "null", "true", "false")


def engine_rules(cfg: SFTConfig) -> list[str]:
    e = cfg.engine
    p = choice(e.strategy, SFT_STRATEGIES, "engine.strategy", "training backend")
    p += choice(e.dtype, DTYPES, "engine.dtype", "dtype")
    sizes = {
        "tensor_model_parallel_size": e.tensor_model_parallel_size,
        "pipeline_model_parallel_size": e.pipeline_model_parallel_size,
        "context_parallel_size": e.context_parallel_size,
        "expert_model_parallel_size": e.expert_model_parallel_size,
    }
    world = cfg.trainer.world_size
    if cfg.megatron:
        from engine.config.megatron_parallel import MegatronParallel

        if e.ulysses_sequence_parallel_size != 1:
            p.append(
                f"engine.ulysses_sequence_parallel_size={e.ulysses_sequence_parallel_size} is"
                " FSDP2's; Megatron splits sequences by engine.context_parallel_size: set that"
                " instead, and ulysses_sequence_parallel_size=1"
            )
        if e.dtype == "float16":
            p.append("engine.dtype=float16: the Megatron engine trains in bfloat16 or float32")
        if cfg.trainer.device == "npu":
            p.append(
                "trainer.device=npu: the Megatron engine runs on NVIDIA/AMD GPUs; use engine=fsdp"
            )
        p += MegatronParallel.of(e.megatron()).problems(world, "engine")
    else:
        p += [
            f"engine.{name}={size} is Megatron's: set engine=megatron, or leave it at 1"
            for name, size in sizes.items()
            if size != 1
        ]
        size = e.ulysses_sequence_parallel_size
        if size < 1:
            p.append(f"engine.ulysses_sequence_parallel_size must be >= 1, got {size}")
        elif size > 1 and world % size:
            p.append(
                f"engine.ulysses_sequence_parallel_size {size} must divide the world size"
                f" {world} (trainer.nnodes × trainer.n_gpus_per_node)"
            )
        elif size > 1 and not cfg.model.use_remove_padding:
            p.append(
                f"engine.ulysses_sequence_parallel_size={size} needs"
                " model.use_remove_padding=true (the group splits each packed row)"
            )
    p += automodel_rules(cfg)
    if e.qat.get("enable"):
        p.append("engine.qat.enable=true: quantization-aware training is not in this engine")
    if e.router_replay.get("mode") not in ("disabled", None):
        p.append("engine.router_replay.mode: MoE routing replay is not in this engine; disabled")
    return p


def automodel_rules(cfg: SFTConfig) -> list[str]:
    """engine=automodel's keys: what of verl's AutoModel engine is FSDP2 here."""
    e = cfg.engine
    p = []
    if e.distributed_strategy != "fsdp2":
        p.append(
            f"engine.distributed_strategy={e.distributed_strategy!r}: only fsdp2 here (FSDP2);"
            " set fsdp2, or engine=megatron for Megatron's own sharding"
        )
    megatron_key = {
        "tp_size": "tensor_model_parallel_size",
        "pp_size": "pipeline_model_parallel_size",
        "cp_size": "context_parallel_size",
        "ep_size": "expert_model_parallel_size",
    }
    for name, target in megatron_key.items():
        size = getattr(e, name)
        if size != 1:
            p.append(
                f"engine.{name}={size}: AutoModel's model parallelism is not in this engine"
                f" (FSDP2 shards the whole model); use engine=megatron with"
                f" engine.{target}={size}, or leave it at 1"
            )
    if e.dp_replicate_size != 1:
        p.append(
            f"engine.dp_replicate_size={e.dp_replicate_size}: hybrid sharding is not in this"
            " engine (FSDP2 shards over every rank); leave it at 1"
        )
    if e.enable_fp8:
        p.append("engine.enable_fp8=true: FP8 training is not in this engine; set false")
    return p


def model_rules(cfg: SFTConfig) -> list[str]:
    m = cfg.model
    p = [] if m.path else ["model.path is required: a Hugging Face model id or local folder"]
    for key, what in (
        ("hf_config_path", "a model config apart from the model"),
        (
            "custom_chat_template",
            "a chat template given in the config (save it with the tokenizer)",
        ),
        ("external_lib", "importing a module to register a model"),
    ):
        if getattr(m, key):
            p.append(f"model.{key}: {what} is not in this engine; leave it null")
    if m.mtp.get("enable_train"):
        p.append("model.mtp.enable_train=true: training multi-token-prediction layers is not here")
    if m.lora.get("rank"):
        p.append(
            "model.lora.rank: verl's Megatron LoRA is not here; LoRA is model.lora_rank (FSDP2)"
        )
    if m.lora_rank < 0:
        p.append(f"model.lora_rank must be >= 0 (0: every weight trains), got {m.lora_rank}")
    if m.uses_lora:
        if cfg.megatron:
            p.append("model.lora_rank: LoRA trains under FSDP2 here; set engine=fsdp")
        if not m.lora_alpha > 0:
            p.append(f"model.lora_alpha must be > 0, got {m.lora_alpha}")
        targets = m.target_modules
        if not (targets == "all-linear" or (isinstance(targets, list) and targets)):
            p.append(
                "model.target_modules must be all-linear or a list of module names,"
                f" got {targets!r}"
            )
    opts = m.fused_kernel_options
    if (
        m.use_fused_kernels
        and opts.impl_backend == "liger"
        and cfg.trainer.device in ("cpu", "npu")
    ):
        p.append("model.fused_kernel_options.impl_backend=liger runs on GPUs; use torch")
    return p


def optim_rules(cfg: SFTConfig) -> list[str]:
    o = cfg.optim
    p = optim_problems("optim", o)
    if o.optimizer.lower() not in OPTIMIZERS:
        p.append(f"optim.optimizer={o.optimizer!r}: this engine trains with AdamW; set AdamW")
    if not o.lr > 0:
        p.append(f"optim.lr must be > 0, got {o.lr}")
    if o.clip_grad <= 0:
        p.append(f"optim.clip_grad must be > 0, got {o.clip_grad}")
    return p


def trainer_rules(cfg: SFTConfig) -> list[str]:
    t = cfg.trainer
    p = choice(t.device, DEVICES, "trainer.device", "device")
    p += choice(t.resume_mode, RESUME_MODES, "trainer.resume_mode", "resume mode")
    for logger in t.loggers:
        p += choice(logger, LOGGERS, "trainer.logger", "logger")
    p += positive(
        [
            ("trainer.nnodes", t.nnodes),
            ("trainer.n_gpus_per_node", t.n_gpus_per_node),
            ("trainer.total_epochs", t.total_epochs),
            ("trainer.cpus_per_worker", t.cpus_per_worker),
        ]
    )
    if t.total_training_steps is not None and t.total_training_steps < 1:
        p.append(
            f"trainer.total_training_steps must be positive or null, got {t.total_training_steps}"
        )
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        p.append("trainer.resume_mode=resume_path needs trainer.resume_from_path (a checkpoint)")
    for key in ("save_freq", "test_freq"):
        value = getattr(t, key)
        if not (value == EACH_EPOCH or (isinstance(value, int) and (value == -1 or value > 0))):
            p.append(
                f"trainer.{key} must be -1, a positive step count or {EACH_EPOCH}, got {value!r}"
            )
    if t.default_hdfs_dir:
        p.append(
            "trainer.default_hdfs_dir: copying checkpoints to HDFS is not in this engine;"
            " set trainer.default_local_dir to a bucket URL (s3://, gs://) instead"
        )
    if t.max_ckpt_to_keep is not None and t.max_ckpt_to_keep < 1:
        p.append("trainer.max_ckpt_to_keep must be >= 1 or null (keep all)")
    if t.preemption_save_steps < 0:
        p.append(f"trainer.preemption_save_steps must be >= 0, got {t.preemption_save_steps}")
    if t.hang_timeout_factor != 0 and not t.hang_timeout_factor >= 1:
        p.append(
            f"trainer.hang_timeout_factor must be 0 (off) or >= 1, got {t.hang_timeout_factor}"
        )
    if not t.hang_timeout_floor_s > 0:
        p.append(f"trainer.hang_timeout_floor_s must be > 0, got {t.hang_timeout_floor_s}")
    contents = cfg.checkpoint.save_contents
    for part in contents:
        p += choice(part, CHECKPOINT_CONTENTS, "checkpoint.save_contents", "checkpoint part")
    return p


def conventions(cfg: SFTConfig, given: list[str]) -> None:
    """verl's Megatron absolute ``optim.min_lr``, read as ``min_lr_ratio``."""
    o = cfg.optim
    if o.min_lr > 0 and o.min_lr_ratio == 0 and o.lr > 0:
        o.min_lr_ratio = o.min_lr / o.lr


SFT = Schema(
    root=SFTConfig,
    names=NAMES,
    groups=GROUPS,
    validate=validate,
    conventions=conventions,
    path_keys=("data.train_files", "data.val_files", "trainer.logger"),
    program="python -m engine.sft",
)


def engine_view(cfg: SFTConfig, total_steps: int) -> EngineConfig:
    """The RL trainer's config that builds this run's workers and what it shares with
    RL (the worker hosts, the training engines through ``engine.train.engines``, the
    checkpoints, the trackers, the watchdog): the SFT model as the actor's, its backend,
    optimizer (the schedule ``total_steps`` long) and micro-batches; nothing else of it
    is read. One owner, ``cfg``: this is derived, never stored."""
    e, d, t = cfg.engine, cfg.data, cfg.trainer
    model = ModelConfig(
        **{
            f.name: getattr(cfg.model, f.name)
            for f in dataclasses.fields(ModelConfig)
            if f.name != "dtype"
        },
        dtype=e.dtype,
    )
    optim = dataclasses.replace(cfg.optim, total_training_steps=total_steps)
    actor = ActorConfig(
        strategy="megatron" if cfg.megatron else "fsdp2",
        ppo_micro_batch_size_per_gpu=d.micro_batch_size_per_gpu,
        use_dynamic_bsz=d.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=d.max_token_len_per_gpu,
        grad_clip=cfg.optim.clip_grad,
        ulysses_sequence_parallel_size=1 if cfg.megatron else e.ulysses_sequence_parallel_size,
        optim=optim,
        fsdp_config=e.fsdp(),
        megatron=e.megatron(),
    )
    trainer = TrainerConfig(
        project_name=t.project_name,
        experiment_name=t.experiment_name,
        nnodes=t.nnodes,
        n_gpus_per_node=t.n_gpus_per_node,
        device=t.device,
        cpus_per_worker=t.cpus_per_worker,
        total_training_steps=total_steps,
        resume_mode=t.resume_mode,
        resume_from_path=t.resume_from_path,
        logger=t.logger,
        default_local_dir=t.default_local_dir,
        run_dir=t.run_dir,
        max_actor_ckpt_to_keep=t.max_ckpt_to_keep,
        preemption_save_steps=t.preemption_save_steps,
        max_consecutive_skipped_updates=t.max_consecutive_skipped_updates,
        hang_timeout_factor=t.hang_timeout_factor,
        hang_timeout_floor_s=t.hang_timeout_floor_s,
        export_hf_dir=t.export_hf_dir,
        seed=t.seed,
    )
    return EngineConfig(
        actor_rollout_ref=ActorRolloutRefConfig(model=model, actor=actor),
        critic=CriticConfig(enable=False),
        trainer=trainer,
    )


def with_device(cfg: SFTConfig, device: str) -> SFTConfig:
    """The config with ``trainer.device`` resolved (auto: what the cluster has)."""
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, device=device))


def summary(cfg: SFTConfig) -> str:
    """``--check``'s paragraph: what will run, on what, in which batch sizes."""
    d, e = cfg.data, cfg.engine
    backend = (
        f"megatron (TP {e.tensor_model_parallel_size}, PP {e.pipeline_model_parallel_size},"
        f" CP {e.context_parallel_size})"
        if cfg.megatron
        else f"fsdp2 (Ulysses {e.ulysses_sequence_parallel_size})"
    )
    micro = (
        f"micro-batches of {d.max_token_len_per_gpu} tokens"
        if d.use_dynamic_bsz
        else f"micro-batches of {d.micro_batch_size_per_gpu} conversations"
    )
    lora = f", LoRA rank {cfg.model.lora_rank}" if cfg.model.uses_lora else ""
    return (
        f"config ok: supervised fine-tuning of {cfg.model.path}{lora}, loss on the"
        f" assistant's tokens\n"
        f"  {d.train_batch_size} conversations per step over {cfg.data_parallel_size}"
        f" data-parallel rank(s), {micro}, up to {d.max_length} tokens each\n"
        f"  on {cfg.trainer.world_size} device(s) ({cfg.trainer.nnodes} node(s) ×"
        f" {cfg.trainer.n_gpus_per_node}), {backend},"
        f" packed: {'yes' if cfg.model.use_remove_padding and not cfg.megatron else 'no'}"
    )


def resolved_freq(value: Any, steps_per_epoch: int) -> int:
    """``save_freq``/``test_freq`` as a step count (-1: none but the last step)."""
    return steps_per_epoch if value == EACH_EPOCH else int(value)
