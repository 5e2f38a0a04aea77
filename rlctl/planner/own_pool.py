"""Devices of their own beside the training's: the reward model's
(``reward_model.enable_resource_pool``, ``reward_pool.py``) and the distillation
teachers' (``distillation.nnodes``, ``teacher_pool.py``). Both are placed the way verl
places its resource pools (``job_nodes``: on the training's nodes when a node holds
both, else on nodes of their own), checked the same way against the node and the
recipe's hardware, and, with the training's size pinned, leave the training sized on
those pins rather than on the whole hardware (which holds the pool's devices too)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rlctl.planner.model import InfeasiblePlanError, Plan, PlanRequest, job_nodes


@dataclass(frozen=True)
class OwnPool:
    nodes: int
    per_node: int
    section: str  # the config section of its sizes: reward_model, distillation
    switch: str  # the key that gives it devices of its own, for messages
    owner: str  # whose devices, for messages: "the reward model's", "the teachers'"
    heading: str  # the plan's line: "reward model on devices of its own"


def sized_on_pins(req: PlanRequest, pooled: bool) -> PlanRequest:
    """What the planner sizes the training on: with a pool of its own (``pooled``) and
    the training's size pinned, those pins, not the whole hardware (``placed`` then
    checks the sum against it)."""
    pinned = {"trainer.nnodes", "trainer.n_gpus_per_node"} <= req.pinned
    return replace(req, num_devices=None) if pooled and pinned else req


def placed(plan: Plan, req: PlanRequest, pool: OwnPool) -> tuple[int, int, str]:
    """(the job's nodes, devices per node, the plan's line) with ``pool`` beside the
    training; refused when a node cannot hold the pool's share or the recipe's
    hardware has too few nodes for both."""
    node_size = req.max_devices_per_node
    if pool.per_node > node_size:
        raise InfeasiblePlanError(
            f"{pool.section}.n_gpus_per_node {pool.per_node} is more than a node's"
            f" {node_size} devices",
            hint=f"use at most {node_size}, and more {pool.section}.nnodes",
        )
    nodes, per_node = job_nodes(
        plan.nodes, plan.devices_per_node, pool.nodes, pool.per_node, node_size
    )
    hardware_nodes = req.num_devices // node_size if req.num_devices else None
    if hardware_nodes is not None and nodes > max(hardware_nodes, 1):
        raise InfeasiblePlanError(
            f"{pool.owner} own {pool.nodes} × {pool.per_node} devices ({pool.switch}) beside"
            f" the training's {plan.nodes} × {plan.devices_per_node} need {nodes} node(s) of"
            f" {node_size}; the recipe's hardware has {hardware_nodes}",
            hint=f"set hardware.nodes: {nodes}, or pin trainer.nnodes and"
            f" trainer.n_gpus_per_node so that training leaves {pool.owner} devices free"
            f" (e.g. trainer.n_gpus_per_node: {max(node_size - pool.per_node, 1)})",
        )
    shares = plan.devices_per_node + pool.per_node <= node_size
    line = (
        f"{pool.heading} ({pool.switch}): {pool.nodes} node(s) × {pool.per_node}, which"
        f" {'share the nodes' if shares else 'take nodes of their own'} with training:"
        f" the job asks for {nodes} node(s) × {per_node}"
    )
    return nodes, per_node, line
