"""The sections of ``python -m engine.sft``'s config: verl's SFT trainer's keys
(``verl/trainer/config/sft_trainer_engine.yaml`` with its ``model``, ``engine``,
``optim`` and ``profiler`` groups), typed, each with its help. ``model`` is the RL
trainer's ``ModelConfig`` (verl's ``hf_model`` group is the same file there); the
others are SFT's own. The rules and verl's other spellings are in ``engine.config.sft``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.config import verl_trees
from engine.config.fields import as_list, inert, mapping, one_of, setting, tree
from engine.config.megatron import MegatronConfig
from engine.config.train import FSDPConfig, MixedPrecisionConfig, ModelConfig, OptimConfig
from engine.config.trainer import DEVICES, LOGGERS, RESUME_MODES, TrainerConfig

SFT_STRATEGIES = ("fsdp", "fsdp2", "megatron")
PAD_MODES = ("no_padding", "right")
SFT_TRUNCATION = ("error", "left", "right")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
EACH_EPOCH = "after_each_epoch"  # save_freq / test_freq: once per epoch (verl's value)
_MEGATRON_ONLY = "(engine=megatron)"
_UNUSED_LOGITS = "SFT computes no entropy; changes nothing here."
_CONVERTS = "the engine converts the Hugging Face weights at model.path itself"
_AM_SIZES = "(FSDP2 of the whole model; engine=megatron for model parallelism)"


@dataclass
class SFTDataConfig:
    """The conversations: parquet or jsonl files with a column of chat messages
    (``messages_key``: a list of ``{role, content}``, tool calls and tool replies
    included) and optionally the tools they may call; only the assistant's turns carry
    the loss (docs/sft.md)."""

    train_files: Any = setting(
        help="Training conversations: a parquet or jsonl file, or a list of them (required).",
        factory=list,
        kind="path or list of paths",
    )
    val_files: Any = setting(
        help="Validation conversations; their loss (val/loss) is measured every test_freq"
        " steps and after the last. Empty: none.",
        factory=list,
        kind="path or list of paths",
    )
    train_batch_size: int = setting(
        256, "Conversations per optimizer step, over all data-parallel ranks."
    )
    micro_batch_size_per_gpu: int = setting(
        4,
        "Conversations per forward/backward on one device when use_dynamic_bsz=false;"
        " gradients accumulate over them.",
    )
    use_dynamic_bsz: bool = setting(
        True, "Make micro-batches by tokens (max_token_len_per_gpu) instead of by rows."
    )
    max_token_len_per_gpu: int = setting(
        8192,
        "use_dynamic_bsz: padded tokens per micro-batch on one device (× the Ulysses or"
        " context-parallel size, which share one micro-batch); must hold max_length.",
    )
    max_length: int = setting(1024, "Longest conversation in tokens, after the chat template.")
    truncation: str = setting(
        "error",
        "Conversations over max_length: error, or cut them at the left (keep the end) or"
        " right (keep the start).",
    )
    pad_mode: str = setting(
        "no_padding",
        f"verl's row layout, {one_of(PAD_MODES)}; both run the same here: each micro-batch"
        " drops the padding all its rows share, or packs them (model.use_remove_padding).",
    )
    messages_key: str = setting("messages", "Column holding each row's chat messages.")
    tools_key: str = setting(
        "tools",
        "Column holding each row's tools (OpenAI function schemas) for the chat template; a"
        " file without it has none.",
    )
    enable_thinking_key: str = setting(
        "enable_thinking",
        "Column holding each row's enable_thinking flag for the chat template (Qwen3).",
    )
    enable_thinking_default: Any = setting(
        "none",
        "enable_thinking of rows without that column: true, false, or none (not passed to"
        " the template).",
        kind="true, false or none",
    )
    apply_chat_template_kwargs: dict[str, Any] = mapping(
        "Keyword arguments of the tokenizer's chat template (e.g. enable_thinking: false)."
    )
    ignore_input_ids_mismatch: bool = setting(
        False,
        "A template that renders an earlier turn differently once later turns follow (Qwen3"
        " drops old reasoning) is refused unless true: then each turn is kept as it was"
        " rendered when it was the last.",
    )
    train_max_samples: int = setting(
        -1, "Use at most this many training conversations (the first ones); -1: all."
    )
    val_max_samples: int = setting(
        -1, "Use at most this many validation conversations (the first ones); -1: all."
    )
    custom_cls: dict[str, Any] = tree(
        {"path": None, "name": None},
        "verl's dataset class of your own (items of verl's tensors); not in this engine"
        " (refused when set): write the data as messages.",
    )
    balance_dp_token: bool = inert(
        False, "verl marks it 'to be implemented'; changes nothing here (nor in verl)."
    )
    use_shm: bool = inert(False, "verl copies data files to /dev/shm; changes nothing here.")
    num_workers: int = inert(
        8,
        "verl's loader processes; changes nothing here: conversations are tokenized once,"
        " in memory.",
    )

    @property
    def train_file_list(self) -> list[str]:
        return as_list(self.train_files)

    @property
    def val_file_list(self) -> list[str]:
        return as_list(self.val_files)

    @property
    def enable_thinking(self) -> bool | None:
        """``enable_thinking_default`` read: None (not passed), True or False."""
        value = self.enable_thinking_default
        if isinstance(value, str):
            return {"true": True, "false": False}.get(value.lower())
        return value


@dataclass
class SFTModelConfig(ModelConfig):
    """The model to fine-tune (verl's ``hf_model`` group): where it is, how it is loaded,
    packing (``use_remove_padding``) and LoRA (``lora_rank``, FSDP only)."""

    # ModelConfig's fields, with what they mean in SFT (the RL roles' words otherwise).
    path: str = setting("", "Hugging Face model id or local folder to fine-tune (required).")
    use_remove_padding: bool = setting(
        True,
        "Pack each micro-batch's conversations end to end, no padding (verl's default here;"
        " FSDP2: Megatron pads); false: each micro-batch drops the columns that are padding"
        " in all its rows.",
    )
    use_fused_kernels: bool = setting(
        False,
        "Log-probs from the hidden states chunk by chunk, never the whole tokens ×"
        " vocabulary logits (FSDP2; fused_kernel_options).",
    )
    lora_rank: int = setting(
        0, "LoRA rank r of the adapter that trains (FSDP2); 0: every weight trains."
    )
    lora_adapter_path: str | None = setting(
        None,
        "A saved PEFT adapter folder the LoRA starts from (its rank, alpha and targets are"
        " the run's; set here, they must agree); FSDP2.",
    )
    override_config: dict[str, Any] = setting(
        help="Fields of the model's Hugging Face config replaced when it is built, e.g."
        " {max_position_embeddings: 32768} (verl's key); a field the config lacks is"
        " refused before the workers start.",
        factory=dict,
        kind="mapping",
    )
    dtype: str = inert(
        "bfloat16", "The RL trainer's Megatron dtype key; SFT's is engine.dtype (verl's)."
    )


@dataclass
class SFTEngineConfig:
    """The training backend (verl's ``engine`` group: ``engine=fsdp``, the default, or
    ``engine=megatron``): FSDP2's sharding and offload and Ulysses, or Megatron-core's
    parallel sizes, in one section. A size of the other backend than ``strategy``'s must
    stay at its default."""

    strategy: str = setting(
        "fsdp",
        f"Training backend: {one_of(SFT_STRATEGIES)} (fsdp and fsdp2 are both FSDP2 here;"
        " engine=megatron sets megatron).",
    )
    dtype: str = setting(
        "bfloat16",
        "Compute dtype: FSDP2's parameter dtype (float32 where the device has no bf16) or"
        " the Megatron model's: bfloat16, float16 (FSDP2 only) or float32.",
    )
    param_offload: bool = setting(
        False,
        "FSDP2: parameters, gradients and optimizer state in host memory (no effect on a CPU"
        " device). Megatron: changes nothing (kept on the device).",
    )
    optimizer_offload: bool = setting(
        False,
        "FSDP2: the optimizer state in host memory between steps. Megatron: changes nothing.",
    )
    offload_policy: bool = setting(False, "FSDP2's CPU offload policy: as param_offload.")
    reshard_after_forward: bool = setting(
        True, "FSDP2: free each layer's gathered parameters after its forward."
    )
    ulysses_sequence_parallel_size: int = setting(
        1,
        "FSDP2: ranks that split each packed sequence (Ulysses; needs"
        " model.use_remove_padding=true); they share their rows.",
    )
    tensor_model_parallel_size: int = setting(
        1, f"Ranks that split every layer {_MEGATRON_ONLY}; they share their rows."
    )
    pipeline_model_parallel_size: int = setting(
        1, f"Pipeline stages the layers are split over, 1F1B {_MEGATRON_ONLY}."
    )
    context_parallel_size: int = setting(
        1, f"Ranks that split every sequence {_MEGATRON_ONLY}; they share their rows."
    )
    expert_model_parallel_size: int = setting(
        1, f"Ranks the experts of a mixture-of-experts model are spread over {_MEGATRON_ONLY}."
    )
    expert_tensor_parallel_size: int | None = setting(
        None, f"Ranks that split each routed expert; null: the TP size {_MEGATRON_ONLY}."
    )
    sequence_parallel: bool = setting(
        True, f"With TP > 1, split the activations outside attention by sequence {_MEGATRON_ONLY}."
    )
    use_distributed_optimizer: bool = setting(
        True, f"Megatron's DistributedOptimizer on GPUs (torch's AdamW on CPU) {_MEGATRON_ONLY}."
    )
    # verl's other engine keys (docs/verl-compat.md)
    grad_offload: bool = inert(False, "verl's Megatron gradient offload; changes nothing here.")
    fsdp_size: int = inert(-1, "verl's sharding group size; parameters shard over all ranks here.")
    wrap_policy: dict[str, Any] = tree(
        verl_trees.WRAP_POLICY, "verl's FSDP unit choice; each decoder layer is one unit here."
    )
    forward_prefetch: bool = inert(False, "verl's FSDP1 prefetch; changes nothing here.")
    model_dtype: str = inert(
        "fp32", "verl's held-parameter dtype; FSDP2 holds them in float32 here."
    )
    use_orig_params: bool = inert(False, "An FSDP1 option; changes nothing under FSDP2.")
    seed: int = inert(42, "verl's engine seed; trainer.seed seeds everything here.")
    full_determinism: bool = inert(False, "verl's deterministic-kernels switch; not enforced here.")
    entropy_from_logits_with_chunking: bool = inert(False, _UNUSED_LOGITS)
    entropy_from_logits_chunk_size: int = inert(2048, _UNUSED_LOGITS)
    entropy_checkpointing: bool = inert(False, _UNUSED_LOGITS)
    use_torch_compile: bool = inert(
        True, "verl compiles its log-prob kernels; changes nothing here (eager)."
    )
    pad_to_length: bool = inert(
        False, "verl pads packed rows to a bucket length (static shapes); changes nothing here."
    )
    pad_to_length_bucket: int = inert(1024, "That bucket's size; changes nothing here.")
    forward_only: bool = inert(False, "Set by verl for roles that never train; SFT trains.")
    virtual_pipeline_model_parallel_size: int | None = inert(
        None, "verl's interleaved pipeline schedule (speed only); one stage a rank here."
    )
    use_dist_checkpointing: bool = inert(
        False, f"verl loads initial weights from a Megatron checkpoint; {_CONVERTS}."
    )
    dist_checkpointing_path: str | None = inert(None, f"That checkpoint's folder; {_CONVERTS}.")
    dist_checkpointing_prefix: str = inert("", "Its key prefix; changes nothing here.")
    dist_ckpt_optim_fully_reshardable: bool = inert(
        False, "verl's Megatron checkpoint format option; changes nothing here."
    )
    distrib_optim_fully_reshardable_mem_efficient: bool = inert(
        False, "verl's Megatron checkpoint format option; changes nothing here."
    )
    use_mbridge: bool = inert(True, f"verl's weight converter choice; {_CONVERTS}.")
    vanilla_mbridge: bool = inert(False, f"verl's weight converter choice; {_CONVERTS}.")
    use_megatron_fsdp: bool = inert(
        False, "verl's Megatron-FSDP sharding (memory layout); changes nothing here."
    )
    dynamic_context_parallel: bool = inert(
        False, "verl sizes context parallelism per batch; fixed here."
    )
    max_seqlen_per_dp_cp_rank: int | None = inert(
        None, "verl's bound for dynamic context parallelism; changes nothing here."
    )
    pad_bshd_to_minibatch_max: bool = inert(
        True, "verl's padding of unpacked rows (static shapes); changes nothing here."
    )
    override_transformer_config: dict[str, Any] = inert(
        help="verl's extra TransformerConfig arguments (recompute, fusions); changes nothing"
        " here (recompute from model.enable_gradient_checkpointing).",
        factory=lambda: {
            "recompute_granularity": None,
            "recompute_modules": ["core_attn"],
            "recompute_method": None,
            "recompute_num_layers": None,
            "attention_backend": "flash",
        },
        kind="mapping",
    )
    override_ddp_config: dict[str, Any] = inert(
        help="verl's extra Megatron DDP arguments; changes nothing here.",
        factory=dict,
        kind="mapping",
    )
    override_mcore_model_config: dict[str, Any] = inert(
        help="verl's extra Megatron model arguments; changes nothing here.",
        factory=dict,
        kind="mapping",
    )
    router_replay: dict[str, Any] = tree(
        verl_trees.ROUTER_REPLAY,
        "verl's MoE routing replay; not in this engine (a mode other than disabled is refused).",
    )
    qat: dict[str, Any] = tree(
        verl_trees.QAT,
        "verl's quantization-aware training; not in this engine (enable=true is refused).",
    )
    turbo_config: dict[str, Any] = tree(
        verl_trees.TURBO_CONFIG,
        "verl's fsdp_turbo layout; changes nothing here (fsdp_turbo runs on FSDP2).",
    )

    # verl's AutoModel engine (engine=automodel): FSDP2 of the Hugging Face model, as
    # here, when all its parallel sizes are 1 (engine.config.sft refuses other sizes)
    distributed_strategy: str = setting(
        "fsdp2",
        "engine=automodel's sharding: fsdp2 only here (FSDP2; megatron_fsdp and ddp are"
        " AutoModel's own).",
    )
    tp_size: int = setting(1, f"engine=automodel's tensor parallel size: 1 only here {_AM_SIZES}.")
    pp_size: int = setting(1, f"engine=automodel's pipeline stages: 1 only here {_AM_SIZES}.")
    cp_size: int = setting(1, f"engine=automodel's context parallel size: 1 only here {_AM_SIZES}.")
    ep_size: int = setting(1, f"engine=automodel's expert parallel size: 1 only here {_AM_SIZES}.")
    dp_replicate_size: int = setting(
        1, "engine=automodel's replicated (HSDP) groups: 1 only here (FSDP2 shards over all)."
    )
    enable_fp8: bool = setting(
        False, "engine=automodel's FP8 training: not in this engine (true is refused)."
    )
    defer_fsdp_grad_sync: bool = inert(
        True, "AutoModel's gradient-sync timing under accumulation (speed); changes nothing here."
    )
    enable_compile: bool = inert(False, "AutoModel's torch.compile switch; eager here.")
    attn_implementation: str = inert(
        "flash_attention_2",
        "AutoModel's attention kernel; the model's own here (model.override_config to change).",
    )
    backend_config: dict[str, Any] = tree(
        verl_trees.AUTOMODEL_BACKEND,
        "AutoModel's kernel choices (Transformer Engine, DeepEP); torch's kernels here.",
    )
    moe_config: dict[str, Any] = tree(
        verl_trees.AUTOMODEL_MOE, "AutoModel's MoE wrapping options; changes nothing here."
    )
    mp_reduce_dtype: str = inert("fp32", "AutoModel's gradient-reduction dtype; float32 here.")
    mp_output_dtype: str = inert("bf16", "AutoModel's output dtype; the compute dtype here.")

    def fsdp(self) -> FSDPConfig:
        """The FSDP2 engine's own section."""
        return FSDPConfig(
            param_offload=self.param_offload,
            optimizer_offload=self.optimizer_offload,
            offload_policy=self.offload_policy,
            reshard_after_forward=self.reshard_after_forward,
            mixed_precision=MixedPrecisionConfig(param_dtype=self.dtype),
        )

    def megatron(self) -> MegatronConfig:
        """The Megatron engine's own section."""
        return MegatronConfig(
            tensor_model_parallel_size=self.tensor_model_parallel_size,
            pipeline_model_parallel_size=self.pipeline_model_parallel_size,
            context_parallel_size=self.context_parallel_size,
            expert_model_parallel_size=self.expert_model_parallel_size,
            expert_tensor_parallel_size=self.expert_tensor_parallel_size,
            sequence_parallel=self.sequence_parallel,
            use_distributed_optimizer=self.use_distributed_optimizer,
        )


@dataclass
class SFTOptimConfig(OptimConfig):
    """AdamW and its schedule (verl's ``optim`` group, fsdp's or megatron's keys; their
    defaults, which are not the RL actor's: lr 1e-3, clip_grad 1.0)."""

    lr: float = setting(1e-3, "Peak learning rate of AdamW (verl's SFT default; set your own).")
    clip_grad: float = setting(1.0, "Clip the global gradient norm to this before each step.")
    optimizer: str = setting(
        "AdamW", "The optimizer: AdamW (Megatron's name for it, adam, is read as AdamW)."
    )
    master_weights: bool = inert(
        False, "AutoModel's separate fp32 master weights; FSDP2 holds float32 weights here."
    )
    store_param_remainders: bool = inert(
        False, "AutoModel's bf16 parameter remainders (memory); changes nothing here."
    )
    master_weight_dtype: str | None = inert(None, "AutoModel's master weight dtype; float32 here.")


@dataclass
class CheckpointConfig:
    """What a checkpoint holds (verl's ``checkpoint`` section)."""

    save_contents: list[str] = setting(
        help="Parts of each checkpoint: model, optimizer and extra are always all saved"
        " here (a resume needs the three); hf_model also writes the weights as a Hugging"
        " Face model into global_step_<k>/huggingface.",
        factory=lambda: ["model", "optimizer", "extra"],
    )
    load_contents: list[str] = inert(
        help="verl's parts to load on resume; changes nothing here: a resume loads all three"
        " (exact resumption needs them).",
        factory=lambda: ["model", "optimizer", "extra"],
    )


@dataclass
class SFTTrainerConfig:
    """The run: devices, length, validation, checkpoints, loggers."""

    project_name: str = setting("gsm8k-sft", "Project the run is logged under (wandb, mlflow).")
    experiment_name: str = setting("test", "Name of the run in the loggers.")
    nnodes: int = setting(1, "Nodes the run spans.")
    n_gpus_per_node: int = setting(
        1,
        "Devices per node, one worker each (verl takes the world from torchrun's"
        " --nproc_per_node; here it is this key).",
    )
    device: str = setting("auto", f"{one_of(DEVICES)}: auto is what the cluster has.")
    cpus_per_worker: int = setting(1, "CPU cores reserved for each device's worker process.")
    total_epochs: int = setting(4, "Passes over the training conversations.")
    total_training_steps: int | None = setting(
        None, "Optimizer steps to run instead of total_epochs × steps per epoch; null: those."
    )
    save_freq: Any = setting(
        -1,
        f"Save a checkpoint every N steps and after the last; -1: at the last step only;"
        f" {EACH_EPOCH}: every epoch.",
        kind=f"a step count, -1 or {EACH_EPOCH}",
    )
    test_freq: Any = setting(
        -1,
        f"With val_files, the validation loss every N steps and after the last; -1: after"
        f" the last only; {EACH_EPOCH}: every epoch.",
        kind=f"a step count, -1 or {EACH_EPOCH}",
    )
    resume_mode: str = setting(
        "auto",
        f"{one_of(RESUME_MODES)}: auto resumes from the last complete checkpoint in"
        " default_local_dir, if any; resume_path from resume_from_path.",
    )
    resume_from_path: str | None = setting(
        None, "resume_mode=resume_path: the global_step_<k> checkpoint (a path or bucket URL)."
    )
    logger: Any = setting(
        help=f"Where metrics go: a list of {one_of(LOGGERS)}, or one of them (verl's file is"
        " jsonl; metrics.jsonl in the run folder is always written).",
        factory=lambda: ["console"],
        kind="list of names, or one name",
    )
    default_local_dir: str = setting(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "The run's folder (checkpoints, metrics): a local path or a bucket URL (s3://, gs://).",
    )
    run_dir: str | None = setting(
        None,
        "The run's own folder (metrics.jsonl, the workers' table), a local path; null:"
        " default_local_dir when that is local, else runs/<project_name>/<experiment_name>.",
    )
    max_ckpt_to_keep: int | None = setting(None, "Keep the last K complete checkpoints; null: all.")
    seed: int = setting(1, "Seed of the model's build and the conversations' shuffle.")
    preemption_save_steps: int = setting(
        1,
        "On SIGTERM, save first if this many steps ran since the last checkpoint (0: never);"
        " the exit code 75 asks to be requeued.",
    )
    max_consecutive_skipped_updates: int = setting(
        5, "Stop after this many steps in a row with a NaN/inf gradient norm."
    )
    hang_timeout_factor: float = setting(
        5.0, "The hang watchdog's factor over a phase's longest recent time (0: off)."
    )
    hang_timeout_floor_s: float = setting(
        3600.0, "Seconds any phase may run before the hang watchdog ends the run."
    )
    export_hf_dir: str | None = setting(
        None, "Export the final checkpoint to this folder as a Hugging Face model."
    )
    balance_batch: bool = inert(
        True, "verl's SFT trainer reads it nowhere; changes nothing here either."
    )
    default_hdfs_dir: str | None = inert(
        None,
        "verl copies checkpoints to HDFS; not in this engine (refused when set):"
        " default_local_dir may be a bucket URL.",
    )
    profile_interval: list[int] = inert(
        help="verl's profiled steps [start, end]; changes nothing here.",
        factory=lambda: [-1, -1],
    )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node

    @property
    def loggers(self) -> list[str]:
        """``logger`` as a list of names, verl's file read as jsonl (as the RL trainer's)."""
        return TrainerConfig(logger=self.logger).loggers


@dataclass
class SFTConfig:
    """Supervised fine-tuning (verl's SFT trainer's layout of keys)."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    engine: SFTEngineConfig = field(default_factory=SFTEngineConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    profiler: dict[str, Any] = tree(
        verl_trees.SFT_PROFILER,
        "verl's profiler (nsys, torch, npu); changes nothing here (the engine's timings"
        " are in its metrics).",
    )

    @property
    def megatron(self) -> bool:
        return self.engine.strategy == "megatron"

    @property
    def sequence_split(self) -> int:
        """Ranks that split each sequence and so share one micro-batch: Ulysses's group
        under FSDP2, Megatron's context-parallel group."""
        e = self.engine
        return e.context_parallel_size if self.megatron else e.ulysses_sequence_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """Groups of ranks that take rows of their own."""
        e = self.engine
        shared = (
            e.tensor_model_parallel_size * e.pipeline_model_parallel_size * e.context_parallel_size
            if self.megatron
            else e.ulysses_sequence_parallel_size
        )
        return max(1, self.trainer.world_size // max(1, shared))
