"""``actor_rollout_ref``: the policy being trained (``actor``, with its ``policy_loss``),
the model it starts from (``model``), the frozen reference policy (``ref``) and the
rollout (``rollout``, in ``engine.config.rollout``); with the actor's and the
reference's rules. The batch-size rules that tie the actor to ``data`` and the device
count are in ``engine.config.batches``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.algo import names
from engine.config import verl_trees
from engine.config.algorithm import KL_ESTIMATOR_HELP, kl_estimator_problems
from engine.config.fields import choice, inert, one_of, positive, setting, tree
from engine.config.megatron import MegatronConfig, RefMegatronConfig
from engine.config.rollout import RolloutConfig
from engine.config.routing_replay import RouterReplayConfig
from engine.config.train import (
    TRAIN_STRATEGIES,
    FSDPConfig,
    ModelConfig,
    OptimConfig,
    dtype_problems,
    fused_kernel_problems,
    optim_problems,
    ulysses_problems,
)

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig


@dataclass
class PolicyLossConfig:
    """The policy loss (``engine.algo.policy_loss``) and its own coefficients."""

    loss_mode: str = setting(
        "vanilla", f"Policy loss: {one_of(names.POLICY_LOSSES)} (vanilla: PPO's clip)."
    )
    clip_cov_ratio: float = setting(
        0.0002, "clip_cov: fraction of the tokens whose gradient is detached."
    )
    clip_cov_lb: float = setting(
        1.0, "clip_cov: lower bound of the covariance window those tokens are drawn from."
    )
    clip_cov_ub: float = setting(5.0, "clip_cov: upper bound of that window.")
    kl_cov_ratio: float = setting(
        0.0002, "kl_cov: fraction of the tokens (largest covariance first) given a KL penalty."
    )
    ppo_kl_coef: float = setting(1.0, "kl_cov: coefficient of that penalty.")
    dro_beta: float | None = inert(
        None, "verl's DRO loss coefficient; changes nothing here (no such loss mode here)."
    )


_PROFILER = (
    "verl's profiler of this role (nsys, torch, npu); changes nothing here (the engine's"
    " timings are in its metrics; benchmarks/ measures more)."
)
_VEOMNI = (
    "verl's VeOmni engine settings (model_engine=veomni); this engine runs veomni on its"
    " FSDP2: param_offload, optimizer_offload, ulysses_parallel_size and the entropy and"
    " compile switches are read as fsdp_config's and the role's keys, the rest change"
    " nothing here."
)


@dataclass
class ActorConfig:
    """The policy's update: batch sizes, PPO's clip, the loss and its terms, the
    optimizer and the training backend."""

    strategy: str = setting(
        "fsdp2", "Training backend: fsdp or fsdp2 (both FSDP2 here), or megatron."
    )
    ppo_mini_batch_size: int = setting(
        256, "Prompts per optimizer step (× rollout.n samples); must divide data.train_batch_size."
    )
    ppo_micro_batch_size_per_gpu: int = setting(
        4, "Samples per forward/backward on one device; gradients accumulate over them."
    )
    use_dynamic_bsz: bool = setting(
        False,
        "Pack micro-batches by token count (`ppo_max_token_len_per_gpu`) instead; also the"
        " default of the log-prob passes and the critic.",
    )
    ppo_max_token_len_per_gpu: int = setting(
        16384,
        "use_dynamic_bsz: padded tokens per micro-batch on one device; a micro-batch split"
        " over a Ulysses or CP group holds this × the group's size (docs/training.md).",
    )
    ppo_epochs: int = setting(1, "Passes of the update over each step's batch.")
    # π_old comes from a separate forward pass after generation, unless the update is
    # on-policy (one epoch, one mini-batch, no KL in the reward): then the update's own
    # first forward sees the same weights, and its log-probs, detached, are π_old.
    recompute_old_log_prob: bool = setting(
        False, "Run the separate π_old pass even when the update is on-policy."
    )
    shuffle: bool = inert(
        False,
        "verl's mini-batch shuffle; changes nothing here: mini-batches keep the batch's order.",
    )
    data_loader_seed: int = inert(
        42, "verl's seed of that shuffle; changes nothing here (no shuffle)."
    )
    grad_clip: float = setting(1.0, "Clip the global gradient norm to this before each step.")
    clip_ratio: float = setting(
        0.2,
        "ε of PPO's clip, both sides unless `clip_ratio_low`/`clip_ratio_high` are set"
        " (dppo_tv/dppo_kl: the divergence threshold δ).",
    )
    clip_ratio_low: float | None = setting(
        None, "Lower ε: the ratio is clipped at 1 - ε; null: `clip_ratio`."
    )
    clip_ratio_high: float | None = setting(
        None,
        "Upper ε: the ratio is clipped at 1 + ε; null: `clip_ratio` (DAPO's clip-higher: 0.28).",
    )
    clip_ratio_c: float = setting(
        3.0,
        "Dual clip: the loss of a negative advantage is at most clip_ratio_c × |A| (> 1);"
        " dppo_tv/dppo_kl: the cap on the importance ratio.",
    )
    tau_pos: float = setting(
        1.0,
        "sapo: temperature τ of the soft gate for tokens with a positive advantage (> 0;"
        " larger narrows the trust region).",
    )
    tau_neg: float = setting(
        1.05, "sapo: τ for tokens with a negative or zero advantage (> 0; the paper: > tau_pos)."
    )
    loss_agg_mode: str = setting(
        "token-mean",
        f"How per-token losses become one (engine.algo.aggregate): {one_of(names.LOSS_AGG_MODES)}.",
    )
    loss_scale_factor: float | None = setting(
        None, "seq-mean-token-sum-norm's constant divisor; null: data.max_response_length."
    )
    entropy_coeff: float = setting(0.0, "Weight of the entropy bonus (subtracted from the loss).")
    use_kl_loss: bool = setting(
        False, "Add a KL-to-the-reference term to the loss (GRPO); loads the reference policy."
    )
    kl_loss_coef: float = setting(0.001, "Weight of that KL term.")
    kl_loss_type: str = setting("low_var_kl", f"Estimator of that KL: {KL_ESTIMATOR_HELP}")
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ulysses_sequence_parallel_size: int = setting(
        1,
        "Ulysses sequence parallelism (FSDP roles): consecutive ranks that split every packed"
        " micro-batch by sequence and exchange attention heads all-to-all; needs"
        " model.use_remove_padding=true and must divide the world size and the model's"
        " attention and KV heads (docs/training.md). Megatron roles use"
        " megatron.context_parallel_size. verl's newer spelling"
        " `actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size` sets it too.",
    )
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    # verl's other actor keys (docs/verl-compat.md).
    use_torch_compile: bool = setting(
        False,
        "Compile the log-prob and entropy functions with torch.compile (FSDP roles; verl's"
        " key, whose default is true: here false, since each worker compiles at start and a"
        " CPU run needs a C compiler). The results are the same.",
    )
    entropy_from_logits_with_chunking: bool = setting(
        False,
        "Compute the entropy over slices of entropy_from_logits_chunk_size positions, so that"
        " its temporaries (positions × vocabulary) exist for one slice at a time (FSDP"
        " roles; the same result).",
    )
    entropy_from_logits_chunk_size: int = setting(
        2048, "Positions per entropy slice, with entropy_from_logits_with_chunking."
    )
    entropy_checkpointing: bool = setting(
        False,
        "Recompute the entropy's graph in the backward pass instead of keeping it (with"
        " chunking, one slice at a time); matters when entropy_coeff != 0 (FSDP roles).",
    )
    calculate_entropy: bool = inert(
        False, "verl's switch for the entropy metric; here it is computed whenever it is logged."
    )
    calculate_sum_pi_squared: bool = inert(
        False,
        "verl's switch for Σπ² in the π_old pass; here the estimators that read it ask for it.",
    )
    use_prefix_grouper: bool = inert(
        False,
        "verl runs each group's shared prompt once (speed only); changes nothing here.",
    )
    freeze_vision_tower: bool = inert(
        False, "verl freezes a vision-language model's vision tower; text-only models here."
    )
    pad_to_length: bool = inert(
        False, "verl pads packed rows to a bucket length (static shapes); changes nothing here."
    )
    ppo_micro_batch_size: int | None = inert(
        None,
        "verl's deprecated micro-batch over all devices; refused when set: give"
        " ppo_micro_batch_size_per_gpu (that number divided by the device count).",
    )
    model_engine: str | None = inert(
        None,
        "Set by some verl examples beside strategy (verl's own key is the top-level"
        " model_engine): when set, it must name strategy's family (dp: fsdp/fsdp2,"
        " megatron, veomni).",
    )
    checkpoint: dict[str, Any] = tree(
        verl_trees.CHECKPOINT,
        "verl's choice of what a checkpoint holds; changes nothing here: a checkpoint always"
        " holds the model, the optimizer and the trainer's state (a resume needs all three).",
    )
    profiler: dict[str, Any] = tree(verl_trees.PROFILER, _PROFILER)
    qat: dict[str, Any] = tree(
        verl_trees.QAT,
        "verl's quantization-aware training; not in this engine (enable=true is refused).",
    )
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    veomni: dict[str, Any] = tree(verl_trees.VEOMNI, _VEOMNI)

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


@dataclass
class RefConfig:
    """The frozen reference policy: the actor's model, loaded only when a KL term uses it."""

    strategy: str | None = setting(
        None, "Backend of the reference: fsdp, fsdp2 or megatron; null: the actor's."
    )
    log_prob_micro_batch_size_per_gpu: int = setting(
        8, "Samples per forward on one device in the reference's log-prob pass."
    )
    log_prob_use_dynamic_bsz: bool | None = setting(
        None, "Pack those micro-batches by tokens; null: the actor's `use_dynamic_bsz`."
    )
    log_prob_max_token_len_per_gpu: int | None = setting(
        None, "Tokens per packed micro-batch; null: the actor's `ppo_max_token_len_per_gpu`."
    )
    ulysses_sequence_parallel_size: int | None = setting(
        None,
        "The reference's Ulysses sequence-parallel size; null: the actor's. verl's newer"
        " spelling `actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size` sets"
        " it too.",
    )
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: RefMegatronConfig = field(default_factory=RefMegatronConfig)
    # verl's other reference keys (docs/verl-compat.md).
    use_torch_compile: bool = setting(
        False,
        "Compile the reference's log-prob function with torch.compile (FSDP; see the actor's).",
    )
    entropy_from_logits_with_chunking: bool = inert(
        False, "verl's entropy chunking for the reference, which computes no entropy here."
    )
    entropy_from_logits_chunk_size: int = inert(2048, "Positions per entropy chunk (unused).")
    entropy_checkpointing: bool = inert(
        False, "verl's entropy recomputation for the reference, which computes no entropy here."
    )
    pad_to_length: bool = inert(
        False, "verl pads packed rows to a bucket length (static shapes); changes nothing here."
    )
    log_prob_micro_batch_size: int | None = inert(
        None,
        "verl's deprecated micro-batch over all devices; refused when set: give"
        " log_prob_micro_batch_size_per_gpu.",
    )
    profiler: dict[str, Any] = tree(verl_trees.PROFILER, _PROFILER)
    router_replay: dict[str, Any] = tree(
        verl_trees.ROUTER_REPLAY,
        "verl's MoE routing replay of the reference, which routes freely here as in verl"
        " (a mode other than disabled is refused: replay is the actor's router_replay.mode).",
    )
    veomni: dict[str, Any] = tree(verl_trees.VEOMNI, _VEOMNI)


@dataclass
class ActorRolloutRefConfig:
    """The policy's roles, which share one model: the actor trains it, the rollout
    samples from it, the reference keeps its starting weights."""

    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    hybrid_engine: bool = inert(
        True,
        "verl's colocated actor and rollout (the only mode of verl's main_ppo); false is"
        " refused: a rollout on devices of its own is rollout.placement=separate.",
    )
    nccl_timeout: int = inert(
        600,
        "verl's collective timeout in seconds; changes nothing here (torch's default, 10 minutes).",
    )


def rules(cfg: EngineConfig) -> list[str]:
    arr = cfg.actor_rollout_ref
    actor = arr.actor
    key = "actor_rollout_ref.actor"
    p = choice(
        actor.policy_loss.loss_mode,
        names.POLICY_LOSSES,
        f"{key}.policy_loss.loss_mode",
        "policy loss",
    )
    p += choice(
        actor.loss_agg_mode, names.LOSS_AGG_MODES, f"{key}.loss_agg_mode", "loss aggregation mode"
    )
    p += kl_estimator_problems(f"{key}.kl_loss_type", actor.kl_loss_type)
    p += choice(actor.strategy, TRAIN_STRATEGIES, f"{key}.strategy", "strategy")
    if arr.ref.strategy is not None:
        p += choice(
            arr.ref.strategy, TRAIN_STRATEGIES, "actor_rollout_ref.ref.strategy", "strategy"
        )
    p += optim_problems(f"{key}.optim", actor.optim)
    p += fused_kernel_problems(cfg)
    p += ulysses_problems(cfg, "actor")
    if cfg.use_reference:
        p += ulysses_problems(cfg, "reference")
    mixed = actor.fsdp_config.mixed_precision
    p += dtype_problems(
        [
            ("actor_rollout_ref.model.dtype", arr.model.dtype),
            (f"{key}.fsdp_config.mixed_precision.param_dtype", mixed.param_dtype),
            (f"{key}.fsdp_config.mixed_precision.reduce_dtype", mixed.reduce_dtype),
        ]
    )
    p += positive(
        [
            (f"{key}.ppo_mini_batch_size", actor.ppo_mini_batch_size),
            (f"{key}.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu),
            (f"{key}.ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu),
            (f"{key}.ppo_epochs", actor.ppo_epochs),
        ]
    )
    if actor.policy_loss.loss_mode == "cispo":
        # CISPO truncates the (detached) weight at 1 - ε_low: ε_low >= 1 leaves the lower
        # side open, which is how its paper uses it (verl's example: clip_ratio_low=10).
        if actor.clip_low < 0:
            p.append(
                f"{key}.clip_ratio_low {actor.clip_low} must be >= 0 for cispo (the weight is"
                " truncated at 1 - clip_ratio_low; 1 or more: no lower bound)"
            )
    elif not 0.0 < actor.clip_low < 1.0:
        p.append(
            f"{key}.clip_ratio_low {actor.clip_low} must be in (0, 1):"
            " the ratio is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]"
        )
    if actor.clip_high <= 0.0:
        p.append(f"{key}.clip_ratio_high must be > 0, got {actor.clip_high}")
    if actor.clip_ratio_c <= 1.0:
        p.append(
            f"{key}.clip_ratio_c {actor.clip_ratio_c} must be > 1: dual-clip"
            " bounds the loss of negative advantages at clip_ratio_c × |A| (3.0 is usual)"
        )
    for name in ("tau_pos", "tau_neg"):
        tau = getattr(actor, name)
        if not tau > 0 or tau == float("inf"):
            p.append(
                f"{key}.{name} must be a positive number (SAPO's gate is σ(τ(r − 1))·4/τ),"
                f" got {tau}; the paper uses tau_pos=1.0, tau_neg=1.05"
            )
    if actor.entropy_from_logits_chunk_size < 1:
        p.append(
            f"{key}.entropy_from_logits_chunk_size must be a positive number of positions,"
            f" got {actor.entropy_from_logits_chunk_size}; 2048 is verl's"
        )
    if actor.loss_scale_factor is not None and actor.loss_scale_factor <= 0:
        p.append(f"{key}.loss_scale_factor must be > 0, got {actor.loss_scale_factor}")
    if not arr.model.path:
        p.append(
            "actor_rollout_ref.model.path is required: a Hugging Face model id or a local folder"
        )
    return p + lora_problems(cfg)


def lora_problems(cfg: EngineConfig) -> list[str]:
    """LoRA's settings (``actor_rollout_ref.model.lora_*``); whether ``target_modules``
    match the model's modules is checked against the model before any worker starts
    (``engine.train.lora.check_targets``)."""
    arr = cfg.actor_rollout_ref
    model = arr.model
    key = "actor_rollout_ref.model"
    p = []
    critic = cfg.critic.model  # the reward model's own model config has no LoRA keys
    if critic.lora_rank != 0:
        p.append(
            f"critic.model.lora_rank={critic.lora_rank}: LoRA is for the actor only"
            " (actor_rollout_ref.model.lora_rank); set it to 0"
        )
    if critic.lora_adapter_path:
        p.append(
            f"critic.model.lora_adapter_path={critic.lora_adapter_path!r}: LoRA is for the"
            " actor only (actor_rollout_ref.model.lora_adapter_path); leave it null"
        )
    if model.lora_rank < 0:
        p.append(
            f"{key}.lora_rank must be >= 0, got {model.lora_rank}: 0 trains every weight,"
            " a positive rank (8, 16, 32, 64) trains a LoRA adapter"
        )
    if not model.uses_lora:
        if arr.rollout.lora_as_adapter:
            p.append(
                "actor_rollout_ref.rollout.lora_as_adapter=true needs a LoRA actor: set"
                f" {key}.lora_rank > 0 (or lora_adapter_path), or lora_as_adapter=false"
            )
        return p
    if not model.lora_alpha > 0:
        p.append(f"{key}.lora_alpha must be > 0, got {model.lora_alpha} (commonly 2 × lora_rank)")
    targets = model.target_modules
    if not (
        targets == "all-linear"
        or (
            isinstance(targets, list | tuple)
            and targets
            and all(isinstance(t, str) and t.strip() for t in targets)
        )
    ):
        p.append(
            f"{key}.target_modules must be all-linear or a non-empty list of module names"
            f" (e.g. [q_proj,k_proj,v_proj,o_proj]), got {targets!r}"
        )
    rollout = arr.rollout
    if rollout.lora_as_adapter and rollout.name not in ("vllm", "sglang"):
        p.append(
            "actor_rollout_ref.rollout.lora_as_adapter=true needs the vLLM or SGLang rollout"
            f" (got actor_rollout_ref.rollout.name={rollout.name}); set it to false: the"
            " rollout then gets merged weights"
        )
    if rollout.lora_as_adapter and rollout.name == "vllm" and model.lora_rank > 512:
        p.append(
            f"{key}.lora_rank={model.lora_rank}: vLLM serves adapters of rank <= 512; set"
            " actor_rollout_ref.rollout.lora_as_adapter=false (merged weights)"
        )
    # The reference is the actor's own module with the adapter off: it has no backend
    # of its own to choose (a ref.strategy left null follows the actor's).
    for role_key, strategy in (
        ("actor_rollout_ref.actor.strategy", arr.actor.strategy),
        ("actor_rollout_ref.ref.strategy", arr.ref.strategy),
    ):
        if strategy == "megatron":
            given = (
                f"lora_adapter_path={model.lora_adapter_path!r}"
                if model.lora_adapter_path
                else f"lora_rank={model.lora_rank}"
            )
            off = "no lora_adapter_path" if model.lora_adapter_path else "lora_rank=0"
            p.append(
                f"{role_key}=megatron with {key}.{given}: LoRA runs under FSDP2 only; set it"
                f" to fsdp2, or {off} to train every weight"
            )
    return p
