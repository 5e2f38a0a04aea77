"""``critic``: the value model that GAE needs (``engine.workers.critic``,
``engine.algo.value``), and the rules on it. Its batch sizes follow the actor's rules,
in ``engine.config.batches``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.algo import names
from engine.config import verl_trees
from engine.config.fields import choice, inert, one_of, positive, setting, tree
from engine.config.megatron import MegatronConfig
from engine.config.train import (
    TRAIN_STRATEGIES,
    FSDPConfig,
    ModelConfig,
    OptimConfig,
    optim_problems,
    ulysses_problems,
)

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig


@dataclass
class CriticConfig:
    """The value model: its own model (or the actor's, with a value head), optimizer and
    batch sizes; unset sizes are the actor's."""

    enable: bool | None = setting(
        None, "Train a value model; null: exactly when the advantage estimator needs one (gae)."
    )
    strategy: str = setting(
        "fsdp2", "Training backend: fsdp or fsdp2 (both FSDP2 here), or megatron."
    )
    model: ModelConfig = field(default_factory=ModelConfig)  # path "" : the actor's model
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: int | None = setting(
        None, "Prompts per optimizer step (× rollout.n samples); null: the actor's."
    )
    ppo_micro_batch_size_per_gpu: int = setting(
        4, "Samples per forward/backward on one device; gradients accumulate over them."
    )
    use_dynamic_bsz: bool | None = setting(
        None, "Pack micro-batches by token count instead; null: the actor's setting."
    )
    ppo_max_token_len_per_gpu: int | None = setting(
        None, "Tokens per packed micro-batch on one device; null: the actor's."
    )
    ppo_epochs: int | None = setting(None, "Passes over each step's batch; null: the actor's.")
    cliprange_value: float = setting(
        0.5, "ε of the value clip: how far a new value may move from the rollout-time one."
    )
    loss_agg_mode: str = setting(
        "token-mean", f"How per-token losses become one: {one_of(names.LOSS_AGG_MODES)}."
    )
    grad_clip: float = setting(1.0, "Clip the global gradient norm to this before each step.")
    ulysses_sequence_parallel_size: int = setting(
        1,
        "The critic's Ulysses sequence-parallel size (FSDP; see"
        " actor_rollout_ref.actor.ulysses_sequence_parallel_size). verl's newer spellings"
        " `critic.fsdp.ulysses_sequence_parallel_size` and"
        " `critic.model.fsdp_config.ulysses_sequence_parallel_size` set it too.",
    )
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    # verl's other critic keys (docs/verl-compat.md).
    forward_micro_batch_size_per_gpu: int | None = inert(
        None,
        "verl's micro-batch of the value pass; changes nothing here: that pass uses"
        " actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu.",
    )
    forward_max_token_len_per_gpu: int | None = inert(
        None,
        "verl's token budget of the value pass; changes nothing here: that pass uses"
        " actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu.",
    )
    forward_micro_batch_size: int | None = inert(
        None, "verl's deprecated global micro-batch of the value pass; refused when set."
    )
    ppo_micro_batch_size: int | None = inert(
        None,
        "verl's deprecated micro-batch over all devices; refused when set: give"
        " ppo_micro_batch_size_per_gpu.",
    )
    loss_scale_factor: float | None = inert(
        None, "verl's copy of the actor's loss_scale_factor; changes nothing for the critic here."
    )
    shuffle: bool = inert(False, "verl's mini-batch shuffle; changes nothing here.")
    data_loader_seed: int = inert(42, "verl's seed of that shuffle; changes nothing here.")
    nccl_timeout: int = inert(
        600, "verl's collective timeout in seconds; changes nothing here (torch's default)."
    )
    # the entropy and compile switches of verl's critic engine: the value head has none
    use_torch_compile: bool = inert(True, "verl's compile switch; the critic has no logits here.")
    entropy_from_logits_with_chunking: bool = inert(False, "No entropy in a value model.")
    entropy_from_logits_chunk_size: int = inert(2048, "No entropy in a value model.")
    entropy_checkpointing: bool = inert(False, "No entropy in a value model.")
    pad_to_length: bool = inert(
        False, "verl pads packed rows to a bucket length (static shapes); changes nothing here."
    )
    checkpoint: dict[str, Any] = tree(
        verl_trees.CHECKPOINT,
        "verl's choice of what a checkpoint holds; changes nothing here: a checkpoint always"
        " holds the model, the optimizer and the trainer's state.",
    )
    profiler: dict[str, Any] = tree(
        verl_trees.PROFILER, "verl's profiler of the critic; changes nothing here."
    )
    veomni: dict[str, Any] = tree(
        verl_trees.VEOMNI,
        "verl's VeOmni engine settings for the critic (model_engine=veomni); run on this"
        " engine's FSDP2 (see actor_rollout_ref.actor.veomni).",
    )


def rules(cfg: EngineConfig) -> list[str]:
    critic = cfg.critic
    p = choice(
        critic.loss_agg_mode, names.LOSS_AGG_MODES, "critic.loss_agg_mode", "loss aggregation mode"
    )
    p += choice(critic.strategy, TRAIN_STRATEGIES, "critic.strategy", "strategy")
    p += optim_problems("critic.optim", critic.optim)
    p += positive([("critic.ppo_micro_batch_size_per_gpu", critic.ppo_micro_batch_size_per_gpu)])
    if critic.model.use_fused_kernels:
        p.append(
            "critic.model.use_fused_kernels=true: the critic's value head has one output, so"
            " there are no vocabulary-wide logits to chunk; set it false (the actor's is"
            " actor_rollout_ref.model.use_fused_kernels)"
        )
    if cfg.use_critic:
        p += ulysses_problems(cfg, "critic")
    if critic.cliprange_value <= 0:
        p.append(f"critic.cliprange_value must be > 0, got {critic.cliprange_value}")
    return p
