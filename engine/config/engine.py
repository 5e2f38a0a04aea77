"""``EngineConfig``: the whole configuration, one field a section, and the facts the
trainer and workers derive from it (the device count, which roles run, each role's
token budget)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.algo import names
from engine.config import verl_trees
from engine.config.actor import ActorRolloutRefConfig
from engine.config.algorithm import AlgorithmConfig
from engine.config.async_training import AsyncTrainingConfig
from engine.config.critic import CriticConfig
from engine.config.data import DataConfig
from engine.config.distillation import DistillationConfig
from engine.config.fields import selected, setting, tree
from engine.config.megatron import MegatronConfig
from engine.config.reward import CustomRewardFunctionConfig, RewardModelConfig
from engine.config.role_keys import BUDGET_ROLES, TOKEN_BUDGET_KEYS, ULYSSES_KEYS
from engine.config.routing_replay import RECORD, ReplayPlan
from engine.config.trainer import TrainerConfig
from engine.config.verl_sections import (
    GLOBAL_PROFILER_HELP,
    MODEL_ENGINE_HELP,
    SKIP_HELP,
    TRANSFER_QUEUE_HELP,
    RayKwargsConfig,
    RewardSection,
)


@dataclass
class EngineConfig:
    """The engine's configuration (verl's layout of keys)."""

    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(
        default_factory=CustomRewardFunctionConfig
    )
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    # verl's sections beyond the engine's own (verl_sections.py, docs/verl-compat.md)
    reward: RewardSection = field(default_factory=RewardSection)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    model_engine: str | None = setting(None, MODEL_ENGINE_HELP)
    # left out of a dumped config while it is off and at its defaults (dump.py)
    distillation: DistillationConfig = field(
        default_factory=DistillationConfig, metadata={"omit_when_default": True}
    )
    transfer_queue: dict[str, Any] = tree(verl_trees.TRANSFER_QUEUE, TRANSFER_QUEUE_HELP)
    global_profiler: dict[str, Any] = tree(verl_trees.GLOBAL_PROFILER, GLOBAL_PROFILER_HELP)
    skip: dict[str, Any] = tree(verl_trees.SKIP, SKIP_HELP)

    # Derived facts the trainer and workers ask for; computed, never stored.

    @property
    def world_size(self) -> int:
        """Devices the actor trains on (colocated with rollout and reference)."""
        return self.trainer.nnodes * self.trainer.n_gpus_per_node

    @property
    def rm_world_size(self) -> int:
        """Devices the reward model runs on: its own pool's, or the training devices."""
        rm = self.reward_model
        return rm.nnodes * rm.n_gpus_per_node if rm.enable_resource_pool else self.world_size

    @property
    def rm_devices_per_node(self) -> int:
        rm = self.reward_model
        return rm.n_gpus_per_node if rm.enable_resource_pool else self.trainer.n_gpus_per_node

    @property
    def use_critic(self) -> bool:
        if self.critic.enable is None:
            return self.algorithm.adv_estimator in names.CRITIC_ADVANTAGE_ESTIMATORS
        return self.critic.enable

    @property
    def use_reference(self) -> bool:
        """A frozen reference policy is loaded only when some KL term needs it."""
        return self.algorithm.use_kl_in_reward or self.actor_rollout_ref.actor.use_kl_loss

    @property
    def routing_replay(self) -> ReplayPlan:
        """What the actor's passes and the rollout do with MoE routing
        (``engine.config.routing_replay``)."""
        return ReplayPlan(self.actor_rollout_ref.actor.router_replay.mode)

    @property
    def ref_strategy(self) -> str:
        """The reference's training backend: its own, or the actor's."""
        arr = self.actor_rollout_ref
        return arr.ref.strategy or arr.actor.strategy

    def megatron_roles(self) -> dict[str, tuple[str, MegatronConfig]]:
        """The roles this run builds with ``strategy=megatron``: role -> (config key of
        its megatron section, the section)."""
        arr = self.actor_rollout_ref
        roles: dict[str, tuple[str, MegatronConfig]] = {}
        if arr.actor.strategy == "megatron":
            roles["actor"] = ("actor_rollout_ref.actor.megatron", arr.actor.megatron)
        if self.use_reference and self.ref_strategy == "megatron":
            # the reference's null sizes are the actor's (verl's default)
            ref = arr.ref.megatron.resolved(arr.actor.megatron)
            roles["reference"] = ("actor_rollout_ref.ref.megatron", ref)
        if self.use_critic and self.critic.strategy == "megatron":
            roles["critic"] = ("critic.megatron", self.critic.megatron)
        return roles

    @property
    def update_is_on_policy(self) -> bool:
        """The actor update's first forward sees the weights that generated the batch:
        one PPO epoch of one mini-batch. Then π_old needs no pass of its own, unless the
        KL in the reward needs it before the update, the rollout's own log-probs are to
        be compared with it (``calculate_log_probs``: mismatch metrics, TIS), the
        advantage estimator reads it (Σπ²: the optimal token baseline), routing replay
        records the routing in it (R2), or the user asks for it."""
        actor = self.actor_rollout_ref.actor
        return (
            actor.ppo_epochs == 1
            and actor.ppo_mini_batch_size == self.data.train_batch_size
            and not self.algorithm.use_kl_in_reward
            and not actor.recompute_old_log_prob
            and not self.actor_rollout_ref.rollout.calculate_log_probs
            and not names.estimator_needs(self.algorithm.adv_estimator).sum_pi_squared
            and self.routing_replay.old_pass != RECORD
        )

    def token_budget(self, role: str) -> int | None:
        """Padded tokens per micro-batch for ``role`` (a key of ``TOKEN_BUDGET_KEYS``)
        when it packs micro-batches by tokens, else None. A role's unset (null) keys
        take the actor's. The key counts tokens per device (``*_per_gpu``), and the ranks
        that split each sequence (a Ulysses group, or Megatron's CP group) share one
        micro-batch: the budget is the key × that group's size, as verl's FSDP and
        Megatron engines both take it (docs/training.md#token-budgets)."""
        if role not in TOKEN_BUDGET_KEYS:
            raise ValueError(f"unknown role {role!r}; valid: {', '.join(TOKEN_BUDGET_KEYS)}")
        own = [selected(self, key) for key in TOKEN_BUDGET_KEYS[role]]
        actor = [selected(self, key) for key in TOKEN_BUDGET_KEYS["actor"]]
        dynamic, budget = (a if o is None else o for o, a in zip(own, actor, strict=True))
        return budget * self.sequence_split(BUDGET_ROLES[role]) if dynamic else None

    def data_parallel_size(self, role: str) -> int:
        """Groups of ranks that each take their own rows of ``role`` (actor, reference or
        critic): the device count over the ranks that share rows (Megatron's TP × PP ×
        CP, or under FSDP the Ulysses group), as verl splits its batches."""
        megatron = self.megatron_roles().get(role)
        if megatron is not None:
            section = megatron[1]
            shared = (
                section.tensor_model_parallel_size
                * section.pipeline_model_parallel_size
                * section.context_parallel_size
            )
        else:
            shared = max(1, self.ulysses_size(role))
        return max(1, self.world_size // max(1, shared))

    def sequence_split(self, role: str) -> int:
        """Ranks that split each sequence of ``role`` (actor, reference or critic) and so
        hold one micro-batch together: its Megatron ``context_parallel_size``, or under
        FSDP its Ulysses size."""
        megatron = self.megatron_roles().get(role)
        if megatron is not None:
            return megatron[1].context_parallel_size
        return max(1, self.ulysses_size(role))

    def ulysses_size(self, role: str) -> int:
        """Ranks that split each sequence of ``role`` (actor, reference or critic) with
        Ulysses: its ``ulysses_sequence_parallel_size`` (the reference's null, or any with
        LoRA, where the reference runs on the actor's module: the actor's); 1 under
        Megatron, whose roles split sequences by context parallelism."""
        if role not in ULYSSES_KEYS:
            raise ValueError(f"unknown role {role!r}; valid: {', '.join(ULYSSES_KEYS)}")
        strategy = {
            "actor": self.actor_rollout_ref.actor.strategy,
            "reference": self.ref_strategy,
            "critic": self.critic.strategy,
        }[role]
        if strategy == "megatron":
            return 1
        size = selected(self, ULYSSES_KEYS[role])
        if role == "reference" and (size is None or self.actor_rollout_ref.model.uses_lora):
            size = self.actor_rollout_ref.actor.ulysses_sequence_parallel_size
        return size
