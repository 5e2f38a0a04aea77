"""The reward model on devices of its own (``reward_model.enable_resource_pool``): the
job asks for them beside the training (and rollout) devices, as verl places its resource
pools (``job_nodes``: on the same nodes when one node holds both, else nodes of their
own), and the reward model's memory is checked on one of its own devices instead of on
the training devices (``settings.py`` leaves it out there)."""

from __future__ import annotations

from dataclasses import replace

from rlctl.hardware import get_accelerator
from rlctl.planner.memory import budget_bytes
from rlctl.planner.model import (
    GIB,
    InfeasiblePlanError,
    Plan,
    PlanRequest,
    RewardPool,
    job_nodes,
)
from rlctl.planner.reward_model import own_pool, reward_model_of


def training_request(req: PlanRequest) -> PlanRequest:
    """What the planner sizes the training on: with the reward model on devices of its
    own and the training's size pinned, those pins, not the whole hardware (which holds
    the reward model's devices too; ``with_own_pool`` checks the sum against it)."""
    pinned = {"trainer.nnodes", "trainer.n_gpus_per_node"} <= req.pinned
    return replace(req, num_devices=None) if own_pool(req.config) and pinned else req


def with_own_pool(plan: Plan, req: PlanRequest) -> Plan:
    """The plan with the reward model's own devices in the job's request, beside the
    training (and rollout) devices as verl places pools (``job_nodes``: on the same
    nodes when a node holds both, else nodes of its own); its memory checked on them."""
    pool = own_pool(req.config)
    if pool is None:
        return plan
    rm_nodes, rm_per_node = pool
    node_size = req.max_devices_per_node
    key = "reward_model.n_gpus_per_node"
    if rm_per_node > node_size:
        raise InfeasiblePlanError(
            f"{key} {rm_per_node} is more than a node's {node_size} devices",
            hint=f"use at most {node_size}, and more reward_model.nnodes",
        )
    nodes, per_node = job_nodes(plan.nodes, plan.devices_per_node, rm_nodes, rm_per_node, node_size)
    shares = plan.devices_per_node + rm_per_node <= node_size
    shared = "share the nodes" if shares else "take nodes of their own"
    hardware_nodes = req.num_devices // node_size if req.num_devices else None
    if hardware_nodes is not None and nodes > max(hardware_nodes, 1):
        raise InfeasiblePlanError(
            f"the reward model's own {rm_nodes} × {rm_per_node} devices"
            f" (reward_model.enable_resource_pool) beside the training's {plan.nodes} ×"
            f" {plan.devices_per_node} need {nodes} node(s) of {node_size}; the recipe's"
            f" hardware has {hardware_nodes}",
            hint=f"set hardware.nodes: {nodes}, or pin trainer.nnodes and"
            " trainer.n_gpus_per_node so that training leaves the reward model's devices"
            f" free (e.g. trainer.n_gpus_per_node: {node_size - rm_per_node})",
        )
    line = (
        f"reward model on devices of its own (reward_model.enable_resource_pool):"
        f" {rm_nodes} node(s) × {rm_per_node}, which {shared} with training: the job asks"
        f" for {nodes} node(s) × {per_node}"
    )
    mem, _ = reward_model_of(req.config)
    if mem is not None:
        devices = rm_nodes * rm_per_node
        samples = plan.train_batch_size * plan.rollout_n
        line += f"; {mem.describe(samples, devices, own=True)}"
        if req.accelerator is not None:
            acc = get_accelerator(req.accelerator)
            need, budget = mem.bytes_per_device(samples, devices), budget_bytes(acc)
            if need > budget:
                raise InfeasiblePlanError(
                    f"the reward model needs {need / GIB:.1f} GiB on each of its own devices,"
                    f" over the {budget / GIB:.1f} GiB usable on one {acc.name}",
                    hint="give it more devices (reward_model.nnodes / n_gpus_per_node: a"
                    " judge's KV cache shrinks with them), or a smaller reward model",
                )
    pool = RewardPool(rm_nodes, rm_per_node, plan.nodes, plan.devices_per_node)
    return replace(
        plan,
        nodes=nodes,
        devices_per_node=per_node,
        reasoning=[*plan.reasoning, line],
        reward_pool=pool,
    )
