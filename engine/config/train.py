"""What every training role (actor, reference, critic) configures the same way: its
model, its optimizer, and its backend's settings (``fsdp_config`` for ``strategy``
fsdp/fsdp2, ``megatron`` for ``strategy=megatron``), read by ``engine.train``; and the
Megatron rules, which span the roles that use it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.config.fields import choice, one_of, setting

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

TRAIN_STRATEGIES = ("fsdp", "fsdp2", "megatron")
FUSED_BACKENDS = ("torch", "liger")  # engine.train.fused_head
DTYPES = ("float32", "bfloat16", "float16")
LR_SCHEDULERS = ("constant", "cosine")


@dataclass
class FusedKernelOptions:
    """How ``use_fused_kernels`` computes log-probs from the hidden states
    (``engine.train.fused_head``)."""

    impl_backend: str = setting(
        "torch",
        f"{one_of(FUSED_BACKENDS)}. torch: the LM head chunk by chunk, any device; liger: Liger's fused linear"
        " cross-entropy Triton kernel for the log-probs (GPUs, liger-kernel>=0.8.5"
        " installed), entropy by the torch path. (verl's triton backend is not here.)",
    )
    chunk_size: int = setting(
        512,
        "Tokens whose logits exist at once (torch backend; and the entropy with liger): the"
        " logits' memory is chunk_size × vocabulary × ~10 B instead of every token's.",
    )


@dataclass
class ModelConfig:
    """A Hugging Face model: where it is and how it is loaded."""

    path: str = setting(
        "",
        "Hugging Face model id or local folder (required for the actor; the critic's"
        " empty path means the actor's model).",
    )
    tokenizer_path: str | None = setting(None, "Tokenizer id or folder; null: the model's.")
    trust_remote_code: bool = setting(
        False, "Run the model's own Python code from the hub or its folder (transformers')."
    )
    enable_gradient_checkpointing: bool = setting(
        True, "Recompute activations in the backward pass instead of keeping them (less memory)."
    )
    use_remove_padding: bool = setting(
        False,
        "verl's padding removal: each micro-batch's rows packed end to end, no padding at"
        " all (FSDP roles; docs/training.md). false: each micro-batch still drops the"
        " columns that are padding in all its rows.",
    )
    use_fused_kernels: bool = setting(
        False,
        "Log-probs and entropy from the hidden states chunk by chunk, never the whole"
        " tokens × vocabulary logits (verl's name; FSDP actor and reference; the megatron"
        " strategy and the critic refuse it).",
    )
    fused_kernel_options: FusedKernelOptions = field(default_factory=FusedKernelOptions)
    dtype: str = setting(
        "bfloat16",
        "Training dtype of a Megatron role: bfloat16 or float32 (float32 where the device has"
        " no bf16; float16 is refused); FSDP roles use `fsdp_config.mixed_precision`.",
    )
    # LoRA under verl's names (engine.train.lora): the actor trains a low-rank adapter
    # beside frozen base weights; the reference is the same module with it disabled.
    lora_rank: int = setting(
        0,
        "LoRA rank r of the actor's adapter (actor_rollout_ref.model only, FSDP only); 0: every"
        " weight trains, no adapter.",
    )
    lora_alpha: float = setting(16.0, "LoRA's α: the adapter's update B·A is scaled by α / r.")
    target_modules: Any = setting(
        "all-linear",
        "Modules that get an adapter: all-linear (every linear layer but the output head), or"
        " a list of module names (q_proj, v_proj, ...; a name matches a module path's end).",
        kind="all-linear or a list of module names",
    )


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule: linear warmup, then constant or cosine."""

    lr: float = setting(1e-6, "Peak learning rate of AdamW.")
    betas: list[float] = setting(help="AdamW's (β1, β2).", factory=lambda: [0.9, 0.999])
    weight_decay: float = setting(0.01, "AdamW's decoupled weight decay, on every parameter.")
    lr_warmup_steps: int = setting(
        -1, "Steps of linear warmup; -1: `lr_warmup_steps_ratio` of the total steps."
    )
    lr_warmup_steps_ratio: float = setting(
        0.0, "Warmup as a fraction of the total steps, when `lr_warmup_steps` is -1."
    )
    lr_scheduler_type: str = setting(
        "constant", "After warmup: constant, or cosine (decay to `min_lr_ratio` × lr)."
    )
    min_lr_ratio: float = setting(0.0, "Floor of the cosine decay, as a fraction of lr.")
    num_cycles: float = setting(
        0.5, "Cosine periods over the decay; 0.5 falls once from lr to the floor."
    )
    total_training_steps: int = setting(
        -1, "Length of the schedule in steps; set by the engine from the run's step count."
    )


@dataclass
class MixedPrecisionConfig:
    """FSDP's mixed precision, applied where the device supports bfloat16 (else float32)."""

    param_dtype: str = setting(
        "bfloat16", "dtype parameters are gathered and computed in: float32, bfloat16, float16."
    )
    reduce_dtype: str = setting(
        "float32", "dtype gradients are reduced in: float32, bfloat16, float16."
    )


@dataclass
class FSDPConfig:
    """``strategy`` fsdp or fsdp2: how FSDP2 shards the role's model (each decoder layer
    one unit)."""

    param_offload: bool = setting(
        False,
        "Keep parameters, gradients and optimizer state in host memory; each layer visits"
        " the device for its passes (no effect on a CPU device).",
    )
    optimizer_offload: bool = setting(
        False, "Keep the optimizer state in host memory between updates."
    )
    reshard_after_forward: bool = setting(
        True, "Free each layer's gathered parameters after its forward (less memory, more traffic)."
    )
    fsdp_size: int = setting(
        -1, "verl's sharding group size; unused: parameters shard over all data-parallel ranks."
    )
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class MegatronConfig:
    """``strategy=megatron``: Megatron-core's parallel sizes (verl's ``<role>.megatron.*``).
    Data parallel is the rest of the world. The rules are in
    ``engine.train.megatron_parallel`` (what the engine supports and why)."""

    tensor_model_parallel_size: int = setting(
        1, "Ranks that split every layer (tensor parallel); they share their rows."
    )
    pipeline_model_parallel_size: int = setting(
        1, "Pipeline stages the layers are split over (1F1B schedule)."
    )
    context_parallel_size: int = setting(
        1, "Ranks that split every sequence (for long sequences); they share their rows."
    )
    expert_model_parallel_size: int = setting(
        1, "Ranks the experts of a mixture-of-experts model are spread over."
    )
    sequence_parallel: bool = setting(
        False,
        "With tensor parallel > 1, split the activations outside attention and the MLP by"
        " sequence over its ranks; ignored at 1.",
    )
    use_distributed_optimizer: bool = setting(
        True,
        "Megatron's DistributedOptimizer (sharded state) on GPUs; the CPU path uses torch's AdamW.",
    )


def optim_problems(key: str, optim: OptimConfig) -> list[str]:
    return choice(
        optim.lr_scheduler_type, LR_SCHEDULERS, f"{key}.lr_scheduler_type", "LR scheduler"
    )


def dtype_problems(dtypes: list[tuple[str, str]]) -> list[str]:
    return [p for key, dtype in dtypes for p in choice(dtype, DTYPES, key, "dtype")]


def fused_kernel_problems(cfg: EngineConfig) -> list[str]:
    """``actor_rollout_ref.model.use_fused_kernels``: its options, and the roles and
    devices it runs on (the FSDP actor and reference; Liger's kernels on GPUs only)."""
    key = "actor_rollout_ref.model"
    model = cfg.actor_rollout_ref.model
    opts = model.fused_kernel_options
    p = choice(opts.impl_backend, FUSED_BACKENDS, f"{key}.fused_kernel_options.impl_backend",
               "fused kernel backend")  # fmt: skip
    if opts.chunk_size < 1:
        p.append(
            f"{key}.fused_kernel_options.chunk_size must be a positive number of tokens, got"
            f" {opts.chunk_size}; 512 (verl's) keeps the logits of a 152k vocabulary to ~0.7 GiB"
        )
    if not model.use_fused_kernels:
        return p
    megatron = [r for r in cfg.megatron_roles() if r in ("actor", "reference")]
    if megatron:
        p.append(
            f"{key}.use_fused_kernels=true applies to the fsdp/fsdp2 strategies; the"
            f" {' and '.join(megatron)} here use megatron, whose head keeps its full"
            f" (tensor-parallel) logits: set {' and '.join(_strategy_key(r) for r in megatron)}"
            " to fsdp2, or use_fused_kernels=false"
        )
    if opts.impl_backend == "liger" and cfg.trainer.device in ("cpu", "npu"):
        p.append(
            f"{key}.fused_kernel_options.impl_backend=liger runs Triton kernels on NVIDIA/AMD"
            f" GPUs, but trainer.device={cfg.trainer.device}: use impl_backend=torch"
        )
    return p


def ulysses_problems(cfg: EngineConfig, role: str) -> list[str]:
    """``<role>.ulysses_sequence_parallel_size`` (``engine.train.ulysses``) against the
    strategy, the world size and padding removal; against the model's heads:
    ``ulysses_heads_problems``, once the model's config is at hand."""
    from engine.config.engine import ULYSSES_KEYS

    key = ULYSSES_KEYS[role]
    size = _configured_ulysses(cfg, role)
    if size is None:  # the reference's null: the actor's, checked there
        return []
    if size < 1:
        return [f"{key} must be a positive integer, got {size}; 1 turns Ulysses off"]
    if size == 1:
        return []
    p = []
    if role in cfg.megatron_roles():
        return [
            f"{key}={size} is for the fsdp/fsdp2 strategies; {_strategy_key(role)}=megatron"
            f" splits sequences by context parallelism: set {_megatron_key(role)}"
            f".context_parallel_size={size} instead, and {key}=1"
        ]
    lora = cfg.actor_rollout_ref.model.lora_rank > 0
    actor_size = cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size
    if role == "reference" and lora and size != actor_size:
        p.append(
            f"{key}={size}: with LoRA the reference is the actor's own module with its adapter"
            f" off, split as the actor's (actor_rollout_ref.actor.ulysses_sequence_parallel"
            f"_size={actor_size}); leave {key} unset (null)"
        )
    world = cfg.world_size
    if world % size:
        # (a local import: batches imports engine.config.engine, which imports this module)
        from engine.config.batches import divisors_near

        p.append(
            f"{key} {size} must divide the world size {world} (trainer.nnodes ×"
            f" trainer.n_gpus_per_node): every {size} consecutive ranks share their rows; use"
            f" one of {', '.join(map(str, divisors_near(world, size)))}"
        )
    model_key = _model_key(cfg, role)
    if not selected_model(cfg, role).use_remove_padding:
        p.append(
            f"{key}={size} needs {model_key}.use_remove_padding=true (the SP group splits the"
            f" packed row of each micro-batch by sequence): set it, or {key}=1"
        )
    return p


def ulysses_heads_problems(size: int, key: str, hf_config: Any) -> list[str]:
    """A Ulysses size the model's attention cannot take: the all-to-all hands each rank
    whole query heads and whole KV heads (the heads of one query group stay together)."""
    if size <= 1:
        return []
    heads = getattr(hf_config, "num_attention_heads", None)
    if heads is None:  # fields that do not say (the engine checks the loaded model)
        return []
    kv = getattr(hf_config, "num_key_value_heads", None) or heads
    from engine.config.batches import divisors_near

    p = []
    for what, value in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if value % size:
            fits = divisors_near(value, size)
            p.append(
                f"{key} {size} must divide the model's {what} {value} (each rank of the"
                f" sequence-parallel group attends with whole heads); use one of"
                f" {', '.join(map(str, fits))}"
            )
    return p


def ulysses_model_problems(cfg: EngineConfig, hf_config_of: Any) -> list[str]:
    """``ulysses_heads_problems`` for every role that runs with Ulysses;
    ``hf_config_of(model_cfg)``: the Hugging Face config (or its fields) of a role's model."""
    from engine.config.engine import ULYSSES_KEYS

    used = {"actor": True, "reference": cfg.use_reference, "critic": cfg.use_critic}
    p = []
    for role, key in ULYSSES_KEYS.items():
        size = cfg.ulysses_size(role)
        if used[role] and size > 1:
            p += ulysses_heads_problems(size, key, hf_config_of(selected_model(cfg, role)))
    return p


def quantized_model_problems(cfg: EngineConfig, hf_config_of: Any) -> list[str]:
    """A model trained in full whose config declares a ``quantization_config`` (GPTQ, AWQ,
    bitsandbytes, GGUF...): its weights are not full-precision parameters an optimizer can
    step. The actor may train a LoRA adapter over it (the base stays frozen); the critic
    always trains every weight. ``hf_config_of(model_cfg)``: as ``ulysses_model_problems``."""
    roles = [("actor", "actor_rollout_ref.model")]
    if cfg.use_critic:
        roles.append(("critic", _model_key(cfg, "critic")))
    p = []
    for role, key in roles:
        model = selected_model(cfg, role)
        if role == "actor" and model.lora_rank > 0:
            continue  # an adapter over a frozen quantized base (QLoRA-style)
        quant = _get(hf_config_of(model), "quantization_config")
        if not quant:
            continue
        method = _get(quant, "quant_method") or "quantized"
        fix = (
            "set actor_rollout_ref.model.lora_rank (e.g. 32) to train an adapter over it, or"
            if role == "actor"
            else "the critic trains every weight:"
        )
        p.append(
            f"{key}.path={model.path!r} is a {method} checkpoint (its config.json has a"
            f" quantization_config): its weights cannot be trained in full; {fix} point"
            f" {key}.path at the full-precision model"
        )
    return p


def _get(obj: Any, name: str) -> Any:
    """A config field from a transformers config, a namespace or a plain dict."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _configured_ulysses(cfg: EngineConfig, role: str) -> int | None:
    arr = cfg.actor_rollout_ref
    return {
        "actor": arr.actor.ulysses_sequence_parallel_size,
        "reference": arr.ref.ulysses_sequence_parallel_size,
        "critic": cfg.critic.ulysses_sequence_parallel_size,
    }[role]


def selected_model(cfg: EngineConfig, role: str) -> ModelConfig:
    """The model a role loads: the critic's own when its path is set, else the actor's."""
    if role == "critic" and cfg.critic.model.path:
        return cfg.critic.model
    return cfg.actor_rollout_ref.model


def _model_key(cfg: EngineConfig, role: str) -> str:
    if role == "critic" and cfg.critic.model.path:
        return "critic.model"
    return "actor_rollout_ref.model"


def _megatron_key(role: str) -> str:
    return {
        "actor": "actor_rollout_ref.actor.megatron",
        "reference": "actor_rollout_ref.ref.megatron",
        "critic": "critic.megatron",
    }[role]


def megatron_rules(cfg: EngineConfig) -> list[str]:
    """The Megatron engine's parallel sizes, for each role that uses it."""
    roles = cfg.megatron_roles()
    if not roles:
        return []
    # Pure python (no torch): importable wherever this module is.
    from engine.train.megatron_parallel import MegatronParallel

    p = []
    if cfg.trainer.device == "npu":
        p.append(
            "trainer.device=npu: the Megatron engine runs on NVIDIA/AMD GPUs (cuda) only; on"
            f" Ascend set {' and '.join(_strategy_key(role) for role in roles)} to fsdp2"
        )
    for key, section in roles.values():
        p += MegatronParallel.of(section).problems(cfg.world_size, key)
    # Every role runs in the same worker processes, which hold one Megatron parallel state.
    names = (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
    )
    sizes = {
        role: tuple(getattr(section, name) for name in names)
        for role, (_key, section) in roles.items()
    }
    if len(set(sizes.values())) > 1:
        listed = "; ".join(
            f"{roles[role][0]}: "
            + ", ".join(f"{name}={size}" for name, size in zip(names, role_sizes, strict=True))
            for role, role_sizes in sizes.items()
        )
        p.append(
            f"the Megatron roles share their worker processes and so one parallel layout, but"
            f" their sizes differ ({listed}); give them the same sizes"
        )
    return p


def _strategy_key(role: str) -> str:
    return {
        "actor": "actor_rollout_ref.actor.strategy",
        "reference": "actor_rollout_ref.ref.strategy",
        "critic": "critic.strategy",
    }[role]
