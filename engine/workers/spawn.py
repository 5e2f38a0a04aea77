"""The run's worker processes: how many groups, on how many devices each, and the roles
each hosts (one group for every role, or beside the training group the rollout's, the
reward model's and the teachers' own); what Ray must be started with to hold them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig

if TYPE_CHECKING:
    from engine.controller.dispatch import ModelParallelLayout
    from engine.controller.workers import Workers


def own_pools(cfg: EngineConfig) -> dict[str, tuple[int, int]]:
    """Role -> (nodes, devices per node) of each role's group of its own: the rollout
    (``rollout.placement=separate``), the reward model (``enable_resource_pool``), the
    teachers (``distillation.nnodes``)."""
    rollout = cfg.actor_rollout_ref.rollout
    rm = cfg.reward_model
    distill = cfg.distillation
    own: dict[str, tuple[int, int]] = {}
    if rollout.placement == "separate":
        own["rollout"] = (rollout.separate_nnodes, rollout.separate_n_gpus_per_node)
    if rm.enable and rm.enable_resource_pool:
        own["rm"] = (rm.nnodes, rm.n_gpus_per_node)
    if distill.enabled and distill.nnodes > 0:
        own["teacher"] = (distill.nnodes, distill.n_gpus_per_node)
    return own


def cpus_needed(cfg: EngineConfig) -> int:
    """The CPUs every worker of every group asks Ray for."""
    devices = cfg.world_size + sum(n * d for n, d in own_pools(cfg).values())
    return devices * cfg.trainer.cpus_per_worker


def role_layouts(cfg: EngineConfig) -> dict[str, ModelParallelLayout]:
    """How each role's ranks share rows, for the roles whose ranks do (the worker names
    the reference "ref"): Megatron roles split their model over ranks; an FSDP role's
    Ulysses group splits each sequence, as Megatron's context parallelism does."""
    from engine.controller.dispatch import ModelParallelLayout

    names = {"reference": "ref"}
    layouts = {
        names.get(role, role): ModelParallelLayout(
            tp=section.tensor_model_parallel_size,
            pp=section.pipeline_model_parallel_size,
            cp=section.context_parallel_size,
        )
        for role, (_key, section) in cfg.megatron_roles().items()
    }
    for role in ("actor", "reference", "critic"):
        if cfg.ulysses_size(role) > 1:
            layouts[names.get(role, role)] = ModelParallelLayout(cp=cfg.ulysses_size(role))
    return layouts


def start_workers(cfg: EngineConfig) -> Workers:
    """The workers ``spawn_workers`` makes, in their process groups with their roles."""
    workers = spawn_workers(cfg)
    try:
        workers.start()
    except BaseException:
        workers.shutdown()
        raise
    return workers


def spawn_workers(cfg: EngineConfig) -> Workers:
    """One worker group for every role (colocated), or beside the training group the
    rollout's own (``rollout.placement=separate``) and the reward model's own
    (``reward_model.enable_resource_pool``), engine.controller.groups: their processes
    started, to be started as groups (``start``)."""
    from engine.controller.worker_group import PoolSpec, ResourcePool, WorkerGroup
    from engine.device import DEVICES
    from engine.workers.host import WorkerHost

    device_name = cfg.trainer.device
    spec = DEVICES["cuda" if device_name == "cuda" else device_name]
    rm = cfg.reward_model
    distill = cfg.distillation
    own = own_pools(cfg)
    # the learned reward model or the judge: beside the actor unless on its own
    roles = [r for r in ("actor", "rollout") if r not in own]
    if cfg.use_reference:
        roles.append("ref")
    if distill.enabled and "teacher" not in own:
        roles.append("teacher")
    if cfg.use_critic:
        roles.append("critic")
    if rm.enable and "rm" not in own:
        roles.append("rm")

    def pool(nnodes: int, per_node: int, name: str) -> ResourcePool:
        return ResourcePool(
            PoolSpec(
                nnodes=nnodes,
                devices_per_node=per_node,
                ray_resource=spec.ray_resource,
                cpus_per_worker=cfg.trainer.cpus_per_worker,
            ),
            name=name,
        )

    def host(roles: list[str], group: str = "") -> dict[str, Any]:
        return {
            "cfg": cfg,
            "roles": roles,
            "cpus_per_worker": cfg.trainer.cpus_per_worker,
            "group": group,
        }

    train = WorkerGroup(
        pool(cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, "actor_rollout_ref"),
        WorkerHost,
        host(roles),
        layouts=role_layouts(cfg),
    )
    if not own:
        return train
    from engine.controller.groups import SeparateGroups

    groups: dict[str, WorkerGroup] = {}
    try:
        for role, (nnodes, per_node) in own.items():
            groups[role] = WorkerGroup(
                pool(nnodes, per_node, role),
                WorkerHost,
                host([role], group=role),
                label=role,
            )
    except BaseException:
        for group in [train, *groups.values()]:
            group.shutdown()
        raise
    return SeparateGroups(train, groups)
