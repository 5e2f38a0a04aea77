"""The planner's settings: a ``PlanRequest`` with the recipe's pinned engine keys
applied, checked before any search."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlctl.planner.model import (
    MAX_COUNT,
    MAX_TOKENS,
    InfeasiblePlanError,
    PlanRequest,
)
from rlctl.planner.multi_turn import MultiTurn, check_multi_turn, multi_turn_of
from rlctl.planner.reward_model import RewardModelMem, own_pool, reward_model_of

# ---------------------------------------------------------------------------
# settings: the request with the recipe's pinned engine keys applied

ARR_PREFIX = "actor_rollout_ref"
_MEGATRON_ROLES = (
    f"{ARR_PREFIX}.actor",
    f"{ARR_PREFIX}.ref",
    "critic",
)  # one parallel layout for all
# The engine keys the planner takes as given when a recipe pins them (it sizes the rest);
# their values come typed from the engine's config (PlanRequest.config).
_HONOURED = frozenset(
    {
        "data.train_batch_size",
        "data.max_prompt_length",
        "data.max_response_length",
        f"{ARR_PREFIX}.rollout.n",
        f"{ARR_PREFIX}.rollout.name",
        f"{ARR_PREFIX}.actor.strategy",
        "trainer.nnodes",
        "trainer.n_gpus_per_node",
        f"{ARR_PREFIX}.actor.ppo_mini_batch_size",
        f"{ARR_PREFIX}.actor.ppo_micro_batch_size_per_gpu",
        f"{ARR_PREFIX}.actor.use_dynamic_bsz",
        f"{ARR_PREFIX}.actor.ppo_max_token_len_per_gpu",
        f"{ARR_PREFIX}.actor.fsdp_config.param_offload",
        f"{ARR_PREFIX}.actor.fsdp_config.optimizer_offload",
        f"{ARR_PREFIX}.model.enable_gradient_checkpointing",
        f"{ARR_PREFIX}.model.use_fused_kernels",
        f"{ARR_PREFIX}.model.fused_kernel_options.chunk_size",
        f"{ARR_PREFIX}.rollout.tensor_model_parallel_size",
        f"{ARR_PREFIX}.rollout.gpu_memory_utilization",
        "critic.enable",
        *(f"{role}.megatron.context_parallel_size" for role in _MEGATRON_ROLES),
        *(f"{role}.megatron.expert_tensor_parallel_size" for role in _MEGATRON_ROLES),
        f"{ARR_PREFIX}.actor.ulysses_sequence_parallel_size",
        f"{ARR_PREFIX}.model.use_remove_padding",
        f"{ARR_PREFIX}.actor.use_kl_loss",
        "algorithm.use_kl_in_reward",
        # the rollout on devices of its own (planner/split.py): with it, trainer.nnodes and
        # trainer.n_gpus_per_node size the training group only
        "async_training.mode",
        f"{ARR_PREFIX}.rollout.placement",
        f"{ARR_PREFIX}.rollout.separate_nnodes",
        f"{ARR_PREFIX}.rollout.separate_n_gpus_per_node",
    }
)
_MODES = ("sync", "one_step_off", "fully_async")  # engine/config/async_training.py's ASYNC_MODES


def pinned_values(req: PlanRequest) -> dict[str, Any]:
    """The honoured keys the recipe pinned, with their typed values from its config."""
    values: dict[str, Any] = {}
    for key in sorted(req.pinned & _HONOURED):
        node: Any = req.config
        for part in key.split("."):
            node = getattr(node, part)
        values[key] = node
    return values


@dataclass(frozen=True)
class Settings:
    train_batch: int
    n: int
    prompt_len: int
    response_len: int
    rollout_backend: str
    train_backend: str
    critic: bool
    reference: bool
    nodes: int | None
    per_node: int | None
    mini: int | None
    micro: int | None
    dynamic: bool | None
    token_len: int | None
    param_offload: bool | None
    optimizer_offload: bool | None
    grad_ckpt: bool
    rollout_tp: int | None
    fraction: float | None
    target_s: float
    cp: int | None = None  # megatron context_parallel_size pinned by the recipe
    # megatron expert_tensor_parallel_size pinned (None: Megatron's default, the TP size):
    # the ranks each routed expert is split over, in place of TP (memory.py)
    etp: int | None = None
    sp: int | None = None  # fsdp ulysses_sequence_parallel_size pinned by the recipe
    remove_padding: bool | None = None  # use_remove_padding pinned (Ulysses needs it on)
    # use_fused_kernels: the tokens whose logits exist at once (None: every token's)
    logits_chunk: int | None = None
    notes: tuple[str, ...] = ()
    # on when the config turns multi_turn on (read whether pinned or default): the
    # response budget spans every turn and tool result (planner/multi_turn.py)
    multi_turn: MultiTurn | None = None
    # The rollout on devices of its own (rollout.placement=separate, which an async mode
    # needs): the planner splits the devices (planner/split.py). nodes/per_node then
    # size the training group, rollout_nodes/rollout_per_node the rollout's (pinned or
    # None).
    separate: bool = False
    async_mode: str = "sync"
    rollout_nodes: int | None = None
    rollout_per_node: int | None = None
    # LoRA (actor_rollout_ref.model.lora_rank > 0, read whether pinned or default): the
    # actor trains an adapter of this rank on these modules (memory.lora_params)
    lora_rank: int = 0
    lora_targets: str | tuple[str, ...] = "all-linear"
    lora_rank_assumed: bool = False  # a saved adapter not readable here (ASSUMED_ADAPTER_RANK)
    # reward_model.enable: its copy on every training device (planner/reward_model.py);
    # None with a pool of its own
    reward_model: RewardModelMem | None = None

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def samples(self) -> int:
        return self.train_batch * self.n


def settings_for(req: PlanRequest) -> Settings:
    pinned = pinned_values(req)
    notes: list[str] = []

    def take(key: str, requested: Any) -> Any:
        if key not in pinned:
            return requested
        value = pinned[key]
        if requested is not None and value != requested:
            notes.append(f"{key}={value!r} pinned by the recipe wins over {requested!r}")
        return value

    mini = take(f"{ARR_PREFIX}.actor.ppo_mini_batch_size", req.ppo_mini_batch_size)
    micro = take(
        f"{ARR_PREFIX}.actor.ppo_micro_batch_size_per_gpu", req.micro_batch_size_per_device
    )
    critic = req.algorithm_needs_critic
    if pinned.get("critic.enable") is not None:
        critic = bool(pinned["critic.enable"])
    reference = (
        req.algorithm_needs_reference
        or bool(pinned.get(f"{ARR_PREFIX}.actor.use_kl_loss"))
        or bool(pinned.get("algorithm.use_kl_in_reward"))
    )
    placement = _placement(req, pinned, notes)
    reward_model, not_counted = reward_model_of(req.config)
    if not_counted:
        notes.append(not_counted)
    if own_pool(req.config) is not None:  # on devices of its own (reward_model.with_own_pool)
        reward_model = None
    s = Settings(
        train_batch=take("data.train_batch_size", req.train_batch_size),
        n=take(f"{ARR_PREFIX}.rollout.n", req.rollout_n),
        prompt_len=take("data.max_prompt_length", req.max_prompt_length),
        response_len=take("data.max_response_length", req.max_response_length),
        rollout_backend=take(f"{ARR_PREFIX}.rollout.name", req.rollout_backend),
        train_backend=take(f"{ARR_PREFIX}.actor.strategy", req.train_backend),
        critic=critic,
        reference=reference,
        nodes=pinned.get("trainer.nnodes"),
        per_node=pinned.get("trainer.n_gpus_per_node"),
        mini=mini,
        micro=micro,
        dynamic=pinned.get(f"{ARR_PREFIX}.actor.use_dynamic_bsz"),
        token_len=pinned.get(f"{ARR_PREFIX}.actor.ppo_max_token_len_per_gpu"),
        param_offload=pinned.get(f"{ARR_PREFIX}.actor.fsdp_config.param_offload"),
        optimizer_offload=pinned.get(f"{ARR_PREFIX}.actor.fsdp_config.optimizer_offload"),
        grad_ckpt=pinned.get(f"{ARR_PREFIX}.model.enable_gradient_checkpointing", True),
        rollout_tp=pinned.get(f"{ARR_PREFIX}.rollout.tensor_model_parallel_size"),
        fraction=pinned.get(f"{ARR_PREFIX}.rollout.gpu_memory_utilization"),
        target_s=req.target_step_minutes * 60.0,
        cp=_pinned_megatron(pinned, "context_parallel_size"),
        etp=_pinned_megatron(pinned, "expert_tensor_parallel_size"),
        sp=pinned.get(f"{ARR_PREFIX}.actor.ulysses_sequence_parallel_size"),
        remove_padding=pinned.get(f"{ARR_PREFIX}.model.use_remove_padding"),
        logits_chunk=_logits_chunk(req, pinned),
        notes=tuple(notes),
        multi_turn=multi_turn_of(req.config),
        **placement,
        **_lora(req),
        reward_model=reward_model,
    )
    _check_settings(s, req)
    if s.multi_turn is not None:
        check_multi_turn(s.multi_turn, s.rollout_tp, s.rollout_backend)
    if s.cp is not None and s.train_backend != "megatron":
        s = replace(
            s,
            notes=(
                *s.notes,
                f"context_parallel_size {s.cp} pinned by the recipe applies to the megatron"
                f" strategy only; {s.train_backend} ignores it",
            ),
        )
    return s


def _placement(req: PlanRequest, pinned: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """Where the rollout runs: ``async_training.mode`` and ``rollout.placement`` as the
    config has them (pinned or the engine's defaults, sync and colocate). An async mode
    needs the rollout on devices of its own, so asking for one is asking for the split;
    a recipe that pins colocate beside it is refused (the engine would refuse it too)."""
    if req.config is None:
        return {}
    mode = req.config.async_training.mode
    placement = req.config.actor_rollout_ref.rollout.placement
    placement_key = f"{ARR_PREFIX}.rollout.placement"
    if mode not in _MODES:
        raise InfeasiblePlanError(
            f"async_training.mode: unknown mode {mode!r}", hint=f"use {' or '.join(_MODES)}"
        )
    if mode != "sync" and placement == "colocate" and placement_key in pinned:
        raise InfeasiblePlanError(
            f"async_training.mode={mode} generates the next batch while this one trains, which"
            f" needs the rollout on devices of its own, but the recipe pins {placement_key}="
            "colocate",
            hint=f"drop {placement_key} (the planner then splits the devices between the"
            f" groups), or set async_training.mode=sync",
        )
    separate = mode != "sync" or placement == "separate"
    sizes = [k for k in (f"{ARR_PREFIX}.rollout.separate_nnodes",
                         f"{ARR_PREFIX}.rollout.separate_n_gpus_per_node") if k in pinned]  # fmt: skip
    if sizes and not separate:
        notes.append(
            f"{' and '.join(sizes)} pinned by the recipe size the rollout's own devices; with"
            f" {placement_key}=colocate and async_training.mode=sync the engine ignores them"
        )
    if not separate:
        return {}
    return {
        "separate": True,
        "async_mode": mode,
        "rollout_nodes": pinned.get(f"{ARR_PREFIX}.rollout.separate_nnodes"),
        "rollout_per_node": pinned.get(f"{ARR_PREFIX}.rollout.separate_n_gpus_per_node"),
    }


def _logits_chunk(req: PlanRequest, pinned: Mapping[str, Any]) -> int | None:
    """``fused_kernel_options.chunk_size`` when the recipe turns ``use_fused_kernels`` on
    (the engine's FSDP head then holds that many tokens' logits at a time)."""
    if not pinned.get(f"{ARR_PREFIX}.model.use_fused_kernels"):
        return None
    key = f"{ARR_PREFIX}.model.fused_kernel_options.chunk_size"
    if key in pinned:
        return pinned[key]
    return req.config.actor_rollout_ref.model.fused_kernel_options.chunk_size


# A saved adapter (lora_adapter_path) the planner cannot read (a path on the cluster
# only): planned at this rank. The adapter's share of memory is small (rank 128 on every
# linear layer of a 7B model: about 0.3 B parameters), so a higher real rank moves the
# plan little; what matters is that only the adapter trains.
ASSUMED_ADAPTER_RANK = 128


def _lora(req: PlanRequest) -> dict[str, Any]:
    if req.config is None:
        return {}
    model = req.config.actor_rollout_ref.model
    assumed = False
    if model.lora_adapter_path:
        model, assumed = _saved_adapter(model)
    if model.lora_rank <= 0:
        return {}
    targets = model.target_modules
    return {
        "lora_rank": model.lora_rank,
        "lora_targets": targets if isinstance(targets, str) else tuple(targets),
        "lora_rank_assumed": assumed,
    }


def _saved_adapter(model: Any) -> tuple[Any, bool]:
    """The model's LoRA settings from its saved adapter where this machine can read it
    (the engine does the same before its workers start); else the assumed rank."""
    from engine.schema import ADAPTER_CONFIG_FILE, ConfigError, adapter_settings

    if not (Path(model.lora_adapter_path).expanduser() / ADAPTER_CONFIG_FILE).is_file():
        if model.lora_rank > 0:  # the config's rank, which the adapter's must equal
            return model, False
        return replace(model, lora_rank=ASSUMED_ADAPTER_RANK), True
    try:
        return adapter_settings(model), False
    except ConfigError as exc:
        raise InfeasiblePlanError(
            "; ".join(exc.problems), hint="fix the adapter or the keys as the message says"
        ) from None


def _pinned_megatron(pinned: Mapping[str, Any], name: str) -> int | None:
    """The recipe's ``<role>.megatron.<name>`` (context_parallel_size,
    expert_tensor_parallel_size): the roles share one parallel layout in the engine, so
    the keys given must agree."""
    given = {
        key: pinned[key]
        for role in _MEGATRON_ROLES
        if (key := f"{role}.megatron.{name}") in pinned and pinned[key] is not None
    }
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{k}={v}" for k, v in given.items())
        raise InfeasiblePlanError(
            f"the Megatron roles share one parallel layout, but the recipe pins different"
            f" {name} values ({listed})",
            hint=f"give every role the same {name}, or pin the actor's only",
        )
    return next(iter(given.values()), None)


def _check_settings(s: Settings, req: PlanRequest) -> None:
    for key, value in (
        ("data.train_batch_size", s.train_batch),
        ("actor_rollout_ref.rollout.n", s.n),
        ("data.max_prompt_length", s.prompt_len),
        ("data.max_response_length", s.response_len),
        ("max_devices_per_node", req.max_devices_per_node),
    ):
        if value < 1:
            raise InfeasiblePlanError(f"{key} must be a positive integer, got {value}")
    for key, value in (
        ("actor_rollout_ref.actor.ppo_mini_batch_size", s.mini),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", s.micro),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", s.rollout_tp),
        ("trainer.nnodes", s.nodes),
        ("trainer.n_gpus_per_node", s.per_node),
        ("num_devices", req.num_devices),
        ("actor_rollout_ref.actor.megatron.context_parallel_size", s.cp),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", s.sp),
        ("actor_rollout_ref.rollout.separate_nnodes", s.rollout_nodes),
        ("actor_rollout_ref.rollout.separate_n_gpus_per_node", s.rollout_per_node),
    ):
        if value is not None and value < 1:
            raise InfeasiblePlanError(f"{key} must be a positive integer, got {value}")
    for key, value, most in (
        ("data.train_batch_size", s.train_batch, MAX_COUNT),
        ("actor_rollout_ref.rollout.n", s.n, MAX_COUNT),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", s.mini, MAX_COUNT),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", s.micro, MAX_COUNT),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", s.rollout_tp, MAX_COUNT),
        ("trainer.nnodes", s.nodes, MAX_COUNT),
        ("trainer.n_gpus_per_node", s.per_node, MAX_COUNT),
        ("hardware.accelerators (devices per node)", req.max_devices_per_node, MAX_COUNT),
        ("actor_rollout_ref.actor.megatron.context_parallel_size", s.cp, MAX_COUNT),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", s.sp, MAX_COUNT),
        ("actor_rollout_ref.rollout.separate_nnodes", s.rollout_nodes, MAX_COUNT),
        ("actor_rollout_ref.rollout.separate_n_gpus_per_node", s.rollout_per_node, MAX_COUNT),
        ("data.max_prompt_length", s.prompt_len, MAX_TOKENS),
        ("data.max_response_length", s.response_len, MAX_TOKENS),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", s.token_len, MAX_TOKENS),
    ):
        if value is not None and value > most:
            raise InfeasiblePlanError(
                f"{key} {value} is more than {most:,}: not a size a run can have",
                hint=f"check {key} (a typo?)",
            )
    if s.fraction is not None and not 0.0 < s.fraction <= 1.0:
        raise InfeasiblePlanError(
            f"actor_rollout_ref.rollout.gpu_memory_utilization must be in (0, 1], got {s.fraction}"
        )
    if s.rollout_backend not in ("vllm", "sglang", "hf"):
        raise InfeasiblePlanError(
            f"actor_rollout_ref.rollout.name: unknown rollout backend {s.rollout_backend!r}",
            hint="use vllm, sglang or hf (the recipe's rollout:)",
        )
    if s.train_backend not in ("fsdp", "fsdp2", "megatron"):
        raise InfeasiblePlanError(
            f"actor_rollout_ref.actor.strategy: unknown training backend {s.train_backend!r}",
            hint="use fsdp2, fsdp or megatron (the recipe's trainer:)",
        )
    if not 0 < s.target_s < math.inf:
        raise InfeasiblePlanError(
            f"target_step_minutes must be a positive number, got {req.target_step_minutes}"
        )


def made_for(s: Settings) -> dict[str, Any]:
    """The request a plan answers, kept on it so that ``engine_overrides`` is self-contained."""
    return {
        "rollout_backend": s.rollout_backend,
        "train_batch_size": s.train_batch,
        "rollout_n": s.n,
        "max_prompt_length": s.prompt_len,
        "max_response_length": s.response_len,
        "use_critic": s.critic,
        "use_reference": s.reference,
    }


def check_device_count(s: Settings, nodes: int, per_node: int) -> None:
    """More devices than a step has samples leaves some without work (every device trains
    a share of each mini-batch): that is the node or device count's fault, not the batch
    sizes'."""
    samples = s.train_batch * s.n
    if nodes * per_node <= samples:
        return
    nodes_key = "trainer.nnodes" if s.nodes is not None else "hardware.nodes"
    devices_key = "trainer.n_gpus_per_node" if s.per_node is not None else "hardware.accelerators"
    most = samples // per_node
    if nodes > 1 and most >= 1:
        field, fewer = nodes_key, f"at most {most} nodes ({nodes_key})"
    else:
        field, fewer = devices_key, f"at most {samples} devices per node ({devices_key})"
    raise InfeasiblePlanError(
        f"{field}: {nodes} nodes × {per_node} devices = {nodes * per_node} devices, more than"
        f" the {samples} samples of a step (data.train_batch_size {s.train_batch} ×"
        f" actor_rollout_ref.rollout.n {s.n}); each device trains at least one",
        hint=f"use {fewer}, or raise data.train_batch_size or rollout.n",
    )
