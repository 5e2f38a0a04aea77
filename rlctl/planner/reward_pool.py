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
)
from rlctl.planner.own_pool import OwnPool, placed, sized_on_pins
from rlctl.planner.reward_model import own_pool, reward_model_of


def training_request(req: PlanRequest) -> PlanRequest:
    """What the planner sizes the training on (``own_pool.sized_on_pins``)."""
    return sized_on_pins(req, own_pool(req.config) is not None)


def with_own_pool(plan: Plan, req: PlanRequest) -> Plan:
    """The plan with the reward model's own devices in the job's request, beside the
    training (and rollout) devices (``own_pool.placed``); its memory checked on them."""
    pool = own_pool(req.config)
    if pool is None:
        return plan
    rm_nodes, rm_per_node = pool
    nodes, per_node, line = placed(
        plan,
        req,
        OwnPool(
            rm_nodes,
            rm_per_node,
            "reward_model",
            "reward_model.enable_resource_pool",
            "the reward model's",
            "reward model on devices of its own",
        ),
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
    return replace(
        plan,
        nodes=nodes,
        devices_per_node=per_node,
        reasoning=[*plan.reasoning, line],
        reward_pool=RewardPool(rm_nodes, rm_per_node, plan.nodes, plan.devices_per_node),
    )
