"""What every training role (actor, reference, critic) configures the same way: its
model, its optimizer, and its backend's settings (``fsdp_config`` for ``strategy``
fsdp/fsdp2, ``megatron`` for ``strategy=megatron``), read by ``engine.train``; and the
Megatron rules, which span the roles that use it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.config import verl_trees
from engine.config.fields import choice, inert, one_of, setting, tree

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

TRAIN_STRATEGIES = ("fsdp", "fsdp2", "megatron")
FUSED_BACKENDS = ("torch", "liger")  # engine.train.fused_head
DTYPES = ("float32", "bfloat16", "float16")
LR_SCHEDULERS = ("constant", "cosine")
OPTIMIZERS = ("AdamW",)
_MUON = "verl's Muon optimizer setting; changes nothing here (optimizer=Muon is refused)."
# Why verl's Megatron knobs of these kinds change nothing here.
_MEGATRON_OPTIMIZER = (
    "verl's Megatron optimizer setting; changes nothing here: the Megatron roles step a"
    " torch AdamW (fp32 states) on CPU and Megatron's distributed optimizer on GPUs with"
    " its defaults"
)


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
    # verl's other model keys (docs/verl-compat.md).
    hf_config_path: str | None = inert(
        None,
        "verl: a config.json folder other than `path`; this engine reads the model's own"
        " (refused when set).",
    )
    use_shm: bool = inert(
        False, "verl copies the model to /dev/shm before loading; changes nothing here."
    )
    custom_chat_template: str | None = inert(
        None,
        "verl: a Jinja chat template replacing the tokenizer's; not in this engine (refused"
        " when set): save the template into the tokenizer folder instead.",
    )
    external_lib: str | None = inert(
        None,
        "verl: a Python module imported to register a custom model; not in this engine"
        " (refused when set).",
    )
    override_config: dict[str, Any] = setting(
        help="Fields of the model's Hugging Face config replaced when it is built (verl's"
        " key), e.g. {max_position_embeddings: 32768}: for the actor, reference and critic,"
        " and the rollout engine (vLLM's hf_overrides, SGLang's json_model_override_args). A"
        " mapping for a sub-config sets its fields; verl's model_config level holds the"
        " fields; attn_implementation is transformers' loading argument. A field the config"
        " lacks is refused before workers start. The critic on the actor's model (empty"
        " critic.model.path): its own over the actor's (docs/training.md).",
        factory=dict,
        kind="mapping",
    )
    enable_activation_offload: bool = inert(
        False,
        "verl moves checkpointed activations to host memory; changes nothing here"
        " (activations stay on the device; enable_gradient_checkpointing bounds them).",
    )
    exclude_modules: Any = setting(
        None,
        "Modules LoRA leaves without an adapter among target_modules: a regular expression"
        " matched against the whole module path (e.g. .*visual.*), or a list of names; null:"
        " none (verl's key).",
        kind="text, a list of names, or null",
    )
    lora_adapter_path: str | None = setting(
        None,
        "A saved PEFT adapter folder (adapter_config.json and its weights) the actor's LoRA"
        " starts from (verl's key): its rank, alpha and targets are the run's (lora_rank,"
        " lora_alpha, target_modules, exclude_modules at their defaults take them; set, they"
        " must agree), its weights loaded before the first step; the reference stays the"
        " base model. Actor only, FSDP only (docs/training.md).",
    )
    use_liger: bool = inert(
        False,
        "verl patches the model with Liger's fused kernels (speed only); changes nothing"
        " here (fused log-probs: use_fused_kernels with impl_backend=liger).",
    )
    tiled_mlp: dict[str, Any] = tree(
        verl_trees.TILED_MLP,
        "verl computes the MLP in tiles to save memory; changes nothing here.",
    )
    mtp: dict[str, Any] = tree(
        verl_trees.MTP,
        "verl's multi-token prediction: speculative decoding with the model's MTP layers"
        " (enable_rollout: faster generation, the same samples' distribution; changes"
        " nothing here) and training them (enable_train: not in this engine, refused).",
    )
    lora: dict[str, Any] = tree(
        verl_trees.MEGATRON_LORA,
        "verl's Megatron LoRA; not in this engine (rank > 0 is refused): LoRA here is"
        " lora_rank under fsdp2.",
    )

    @property
    def uses_lora(self) -> bool:
        """The actor trains a LoRA adapter: a rank given, or a saved adapter to start from
        (whose rank the run reads from it, engine.train.lora_saved)."""
        return self.lora_rank > 0 or bool(self.lora_adapter_path)


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule: linear warmup, then constant or cosine."""

    lr: float = setting(1e-6, "Peak learning rate of AdamW.")
    betas: list[float] = setting(help="AdamW's (β1, β2).", factory=lambda: [0.9, 0.999])
    weight_decay: float = setting(0.01, "AdamW's decoupled weight decay, on every parameter.")
    eps: float = setting(1e-8, "AdamW's epsilon (verl's optim=automodel key; torch's default).")
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
    init_lr_ratio: float = setting(
        0.0,
        "The warmup's start as a fraction of lr (verl's optim=automodel key): the LR rises"
        " linearly from it, the first step at init + (1 - init)/warmup of lr.",
    )
    num_cycles: float = setting(
        0.5, "Cosine periods over the decay; 0.5 falls once from lr to the floor."
    )
    total_training_steps: int = setting(
        -1, "Length of the schedule in steps; set by the engine from the run's step count."
    )
    optimizer: str = setting("AdamW", "The optimizer: AdamW (verl's other names are refused).")
    optimizer_impl: str = inert(
        "torch.optim", "verl's module of the optimizer class; here it is always torch's AdamW."
    )
    min_lr: float = setting(
        0.0,
        "verl's Megatron floor of the learning rate, absolute; when > 0 it is read as"
        " min_lr_ratio = min_lr / lr.",
    )
    zero_indexed_step: bool = inert(
        True, "verl's scheduler step counting; changes nothing here (steps count from 0)."
    )
    override_optimizer_config: Any = inert(
        None,
        "verl's extra arguments of Megatron's optimizer (CPU offload and such); changes"
        " nothing here: the Megatron roles step with the defaults.",
        kind="mapping or null",
    )
    lr_warmup_init: float = inert(
        0.0, "verl's Megatron warmup start; changes nothing here (warmup starts at 0)."
    )
    lr_decay_steps: int | None = inert(
        None,
        "verl's Megatron decay length; changes nothing here (the schedule spans"
        " total_training_steps).",
    )
    weight_decay_incr_style: str = inert("constant", _MEGATRON_OPTIMIZER + " (constant).")
    lr_wsd_decay_style: str = inert("exponential", _MEGATRON_OPTIMIZER + " (WSD only).")
    lr_wsd_decay_steps: int | None = inert(None, _MEGATRON_OPTIMIZER + " (WSD only).")
    use_checkpoint_opt_param_scheduler: bool = inert(False, _MEGATRON_OPTIMIZER + ".")
    use_precision_aware_optimizer: bool = inert(False, _MEGATRON_OPTIMIZER + ".")
    main_grads_dtype: str = inert("fp32", _MEGATRON_OPTIMIZER + ".")
    exp_avg_dtype: str = inert("fp32", _MEGATRON_OPTIMIZER + ".")
    exp_avg_sq_dtype: str = inert("fp32", _MEGATRON_OPTIMIZER + ".")
    use_layer_wise_distributed_optimizer: bool = inert(False, _MEGATRON_OPTIMIZER + ".")
    muon_momentum: float = inert(0.95, _MUON)
    muon_nesterov: bool = inert(False, _MUON)
    muon_split_qkv: bool = inert(True, _MUON)
    muon_scale_mode: str = inert("spectral", _MUON)
    muon_coefficient_type: str = inert("quintic", _MUON)
    muon_num_ns_steps: int = inert(5, _MUON)
    muon_tp_mode: str = inert("blockwise", _MUON)
    muon_fp32_matmul_prec: str = inert("medium", _MUON)
    muon_extra_scale_factor: float = inert(1.0, _MUON)
    muon_scalar_optimizer: str = inert("adam", _MUON)
    muon_match_adamw_update_rms: bool = inert(False, _MUON)


@dataclass
class MixedPrecisionConfig:
    """FSDP's mixed precision, applied where the device supports bfloat16 (else float32)."""

    param_dtype: str = setting(
        "bfloat16", "dtype parameters are gathered and computed in: float32, bfloat16, float16."
    )
    reduce_dtype: str = setting(
        "float32", "dtype gradients are reduced in: float32, bfloat16, float16."
    )
    buffer_dtype: str = inert(
        "float32", "FSDP1's dtype of buffers; changes nothing here (FSDP2 keeps buffers as loaded)."
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
    offload_policy: bool = setting(
        False,
        "verl's FSDP2 CPU offload policy; here the same as param_offload: either one keeps"
        " the parameters in host memory.",
    )
    fsdp_size: int = inert(
        -1, "verl's sharding group size; changes nothing here: parameters shard over all ranks."
    )
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    wrap_policy: dict[str, Any] = tree(
        verl_trees.WRAP_POLICY,
        "verl's FSDP unit choice; changes nothing here: each decoder layer is one unit.",
    )
    forward_prefetch: bool = inert(
        False, "verl's FSDP prefetch (speed only); changes nothing here."
    )
    model_dtype: str = inert(
        "fp32",
        "verl's dtype of the held parameters; changes nothing here: FSDP holds them in"
        " float32 and computes in mixed_precision.param_dtype.",
    )
    use_orig_params: bool = inert(False, "An FSDP1 option; changes nothing under FSDP2.")
    seed: int = inert(42, "verl's per-engine seed; changes nothing here (trainer.seed seeds all).")
    full_determinism: bool = inert(
        False, "verl's deterministic kernels switch; changes nothing here (not enforced)."
    )
    pad_to_length_bucket: int = inert(
        1024, "verl pads packed rows to a multiple of this (static shapes); changes nothing here."
    )
    forward_only: bool = inert(
        False, "Set by verl for roles that never train; changes nothing here (the role decides)."
    )
    strategy: str = inert(
        "fsdp", "verl's copy of the role's strategy; changes nothing here (<role>.strategy)."
    )
    qat: dict[str, Any] = tree(
        verl_trees.QAT,
        "verl's quantization-aware training; not in this engine (enable=true is refused).",
    )
    turbo_config: dict[str, Any] = tree(
        verl_trees.TURBO_CONFIG,
        "verl's fsdp_turbo engine's layout; changes nothing here: strategy=fsdp_turbo runs on"
        " this engine's FSDP2.",
    )

    @property
    def cpu_offload(self) -> bool:
        """Parameters, gradients and optimizer state in host memory (FSDP2's policy)."""
        return self.param_offload or self.offload_policy


def optim_problems(key: str, optim: OptimConfig) -> list[str]:
    p = choice(optim.lr_scheduler_type, LR_SCHEDULERS, f"{key}.lr_scheduler_type", "LR scheduler")
    if not 0.0 <= optim.init_lr_ratio <= 1.0:
        p.append(
            f"{key}.init_lr_ratio must be in [0, 1] (a fraction of lr), got {optim.init_lr_ratio}"
        )
    if not optim.eps > 0:
        p.append(f"{key}.eps must be > 0 (AdamW's epsilon; 1e-8 is torch's), got {optim.eps}")
    return p


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
    if opts.impl_backend == "liger" and cfg.trainer.device in ("cpu", "npu"):
        p.append(
            f"{key}.fused_kernel_options.impl_backend=liger runs Triton kernels on NVIDIA/AMD"
            f" GPUs, but trainer.device={cfg.trainer.device}: use impl_backend=torch"
        )
    return p


def fused_kernel_notes(cfg: EngineConfig) -> list[str]:
    """``use_fused_kernels`` under Megatron roles runs (verl accepts it), but their head
    keeps its full (tensor-parallel) logits: said at start (``engine.config.notes``)."""
    megatron = [r for r in cfg.megatron_roles() if r in ("actor", "reference")]
    if not cfg.actor_rollout_ref.model.use_fused_kernels or not megatron:
        return []
    return [
        "actor_rollout_ref.model.use_fused_kernels=true applies to the fsdp/fsdp2"
        f" strategies; under megatron ({' and '.join(megatron)}) the head computes its full"
        f" (tensor-parallel) logits (set {' and '.join(map(_strategy_key, megatron))} to"
        " fsdp2 for the chunked head)"
    ]


def logit_option_notes(cfg: EngineConfig) -> list[str]:
    """The actor's entropy chunking, checkpointing and torch.compile apply to FSDP roles;
    a Megatron actor computes its vocabulary-parallel logits its own way."""
    actor = cfg.actor_rollout_ref.actor
    if "actor" not in cfg.megatron_roles():
        return []
    keys = [
        name
        for name in (
            "entropy_from_logits_with_chunking",
            "entropy_checkpointing",
            "use_torch_compile",
        )
        if getattr(actor, name)
    ]
    if not keys:
        return []
    return [
        f"actor_rollout_ref.actor.{', '.join(keys)} apply to the fsdp/fsdp2 strategies; the"
        " megatron actor computes its (vocabulary-parallel) log-probs and entropy whole"
    ]


def ulysses_problems(cfg: EngineConfig, role: str) -> list[str]:
    """``<role>.ulysses_sequence_parallel_size`` (``engine.train.ulysses``) against the
    strategy, the world size and padding removal; against the model's heads:
    ``ulysses_heads_problems``, once the model's config is at hand."""
    from engine.config.role_keys import ULYSSES_KEYS

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
    lora = cfg.actor_rollout_ref.model.uses_lora
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
        from engine.config.fields import divisors_near

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
    # a vision-language config holds its language model's fields in text_config
    hf_config = getattr(hf_config, "text_config", None) or hf_config
    heads = getattr(hf_config, "num_attention_heads", None)
    if heads is None:  # fields that do not say (the engine checks the loaded model)
        return []
    kv = getattr(hf_config, "num_key_value_heads", None) or heads
    from engine.config.fields import divisors_near

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
    from engine.config.role_keys import ULYSSES_KEYS

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
        if role == "actor" and model.uses_lora:
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
    """The model a role loads: the critic's own when its path is set, else the actor's
    (for the critic with ``critic.model.override_config`` over the actor's)."""
    critic = cfg.critic.model
    if role == "critic" and critic.path:
        return critic
    actor = cfg.actor_rollout_ref.model
    if role == "critic" and critic.override_config:
        import dataclasses

        merged = {**actor.override_config, **critic.override_config}
        return dataclasses.replace(actor, override_config=merged)
    return actor


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


def _strategy_key(role: str) -> str:
    return {
        "actor": "actor_rollout_ref.actor.strategy",
        "reference": "actor_rollout_ref.ref.strategy",
        "critic": "critic.strategy",
    }[role]
