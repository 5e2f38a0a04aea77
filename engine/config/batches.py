"""The batch-size rules, which tie ``data``, the actor, the critic, ``rollout.n`` and the
device count together (verl's conventions: ``data.train_batch_size`` and
``ppo_mini_batch_size`` count prompts, micro-batches count samples on one device), each
problem with the numbers that would work."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.config.fields import divisors_near, selected
from engine.config.role_keys import BUDGET_ROLES, TOKEN_BUDGET_KEYS

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig


def rules(cfg: EngineConfig) -> list[str]:
    actor = cfg.actor_rollout_ref.actor
    sizes = (
        cfg.data.train_batch_size,
        cfg.actor_rollout_ref.rollout.n,
        cfg.world_size,
        actor.ppo_mini_batch_size,
        actor.ppo_micro_batch_size_per_gpu,
    )
    if min(sizes) < 1:
        return []  # the sections' own rules report these
    return mini_batch_rules(cfg) + token_budget_rules(cfg)


def mini_batch_rules(cfg: EngineConfig) -> list[str]:
    """verl's batch-size rules, in prompts and samples, with the numbers that would work:
    a mini-batch's samples split over the role's data-parallel groups (the devices over
    the ranks that share rows: Megatron's TP × PP × CP, an FSDP role's Ulysses group)."""
    actor = cfg.actor_rollout_ref.actor
    n = cfg.actor_rollout_ref.rollout.n
    train_bsz = cfg.data.train_batch_size
    p = []
    # (role, config key, mini-batch, micro-batch, whether the mini-batch is the role's own
    #  setting, whether micro-batches are packed by tokens)
    roles = [
        (
            "actor",
            "actor_rollout_ref.actor",
            actor.ppo_mini_batch_size,
            actor.ppo_micro_batch_size_per_gpu,
            True,
            actor.use_dynamic_bsz,
        )
    ]
    if cfg.use_critic:
        own = cfg.critic.ppo_mini_batch_size is not None
        critic_mini = cfg.critic.ppo_mini_batch_size if own else actor.ppo_mini_batch_size
        roles.append(
            (
                "critic",
                "critic",
                critic_mini,
                cfg.critic.ppo_micro_batch_size_per_gpu,
                own,
                cfg.token_budget("critic") is not None,
            )
        )
    for role, key, mini, micro, own, dynamic in roles:
        if mini < 1 or micro < 1:
            continue
        dp = cfg.data_parallel_size(role)
        if not own:
            # Inherited from the actor: its mini-batch problems are reported once, there.
            if train_bsz % mini or (mini * n) % dp:
                continue
        elif mini > train_bsz or train_bsz % mini:
            fits = ", ".join(map(str, divisors_near(train_bsz, mini)))
            p.append(
                f"{key}.ppo_mini_batch_size {mini} must divide data.train_batch_size {train_bsz}"
                f" (both count prompts); use a divisor such as {fits}"
            )
            continue
        samples = mini * n
        groups = _groups(cfg, dp)
        if own and samples % dp:
            p.append(
                f"{key}.ppo_mini_batch_size × rollout.n = {mini} × {n} = {samples} samples must be"
                f" divisible by the {groups}; change the mini-batch size, rollout.n or the"
                " device count"
            )
            continue
        per_group = samples // dp
        # Micro-batches may be uneven (the loss normalises over the whole mini-batch, as
        # in verl), except through a Megatron pipeline, whose 1F1B schedule here takes
        # equal ones.
        if not dynamic and per_group % micro and _pipelined(cfg, role):
            fits = ", ".join(map(str, divisors_near(per_group, micro)))
            p.append(
                f"{key}.ppo_micro_batch_size_per_gpu {micro} must divide the {per_group} samples"
                f" each data-parallel group gets per mini-batch ({mini} prompts × {n} samples"
                f" / {dp}): a pipeline's micro-batches are equal here; use {fits}, or set"
                f" {key}.use_dynamic_bsz=true"
            )
    return p


def _pipelined(cfg: EngineConfig, role: str) -> bool:
    megatron = cfg.megatron_roles().get(role)
    return megatron is not None and megatron[1].pipeline_model_parallel_size > 1


def _groups(cfg: EngineConfig, dp: int) -> str:
    """The data-parallel groups in words, for messages."""
    if dp == cfg.world_size:
        return f"{dp} devices (trainer.nnodes × trainer.n_gpus_per_node)"
    return (
        f"{dp} data-parallel groups ({cfg.world_size} devices over the ranks that share rows:"
        " Megatron's tensor × pipeline × context parallel sizes, or the Ulysses group)"
    )


def token_budget_rules(cfg: EngineConfig) -> list[str]:
    """With use_dynamic_bsz, one whole sequence must fit a micro-batch's budget (the key
    × the ranks that split each sequence: ``EngineConfig.token_budget``)."""
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    skipped = {"critic": not cfg.use_critic, "ref_log_prob": not cfg.use_reference}
    p = []
    for role, (_, key) in TOKEN_BUDGET_KEYS.items():
        if skipped.get(role):
            continue
        budget = cfg.token_budget(role)
        if budget is not None and budget < longest:
            inherited = role != "actor" and selected(cfg, key) is None
            if inherited and cfg.actor_rollout_ref.actor.use_dynamic_bsz:
                continue  # the actor's own budget is reported, once
            source = " (the actor's)" if inherited else ""
            split = cfg.sequence_split(BUDGET_ROLES[role])
            per_device = budget // split
            group = f" × {split} ranks splitting each sequence = {budget}" if split > 1 else ""
            p.append(
                f"{key} is {per_device}{source}{group}: less than one sequence of"
                f" data.max_prompt_length + data.max_response_length = {longest} tokens;"
                f" raise it to at least {-(-longest // split)}"
            )
    return p
