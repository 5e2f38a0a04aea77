"""On-policy distillation's teachers (``distillation``, docs/distillation.md) in the plan.

On a pool of their own (``distillation.nnodes`` ≥ 1) the job asks for the pool's devices
beside the training's, placed as the reward model's own pool is (``job_nodes``), and each
teacher's memory is checked on one of its devices: its bf16 weights split over its
tensor-parallel size, within the fraction of the device its vLLM engine may take
(``inference.gpu_memory_utilization``, where the KV cache gets the rest) or, for an hf
teacher, with the logits of a micro-batch beside them. Beside the actor (``nnodes`` 0)
the teachers' memory is not in the training devices' estimate yet: the plan says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlctl.hardware import get_accelerator
from rlctl.models import UnknownModelError, model_shape
from rlctl.planner.memory import budget_bytes
from rlctl.planner.model import GIB, InfeasiblePlanError, Plan, PlanRequest, TeacherPool
from rlctl.planner.own_pool import OwnPool, placed, sized_on_pins

BF16 = 2
FLOAT32 = 4


def own_teacher_pool(config: Any) -> tuple[int, int] | None:
    """(nodes, devices per node) of the teachers' own pool; None when distillation is off
    or the teachers run beside the actor."""
    if config is None or not config.distillation.enabled:
        return None
    d = config.distillation
    return (d.nnodes, d.n_gpus_per_node) if d.nnodes > 0 else None


def training_request(req: PlanRequest) -> PlanRequest:
    """What the planner sizes the training on (``own_pool.sized_on_pins``)."""
    return sized_on_pins(req, own_teacher_pool(req.config) is not None)


def with_teacher_pool(plan: Plan, req: PlanRequest) -> Plan:
    """The plan with the teachers' devices in the job's request and their memory checked,
    or a note that the teachers beside the actor are not counted."""
    config = req.config
    if config is None or not config.distillation.enabled:
        return plan
    pool = own_teacher_pool(config)
    if pool is None:
        note = (
            "distillation: the teachers run beside the actor (distillation.nnodes=0); their"
            " memory is not in this estimate: give them a pool of their own"
            " (distillation.nnodes, n_gpus_per_node) for a plan that counts them"
        )
        return replace(plan, reasoning=[*plan.reasoning, note])
    t_nodes, t_per_node = pool
    nodes, per_node, line = placed(
        plan,
        req,
        OwnPool(
            t_nodes,
            t_per_node,
            "distillation",
            "distillation.nnodes",
            "the teachers'",
            "teachers on devices of their own",
        ),
    )
    line += "; " + "; ".join(_teacher_lines(config, t_nodes * t_per_node, req))
    return replace(
        plan,
        nodes=nodes,
        devices_per_node=per_node,
        reasoning=[*plan.reasoning, line],
        teacher_pool=TeacherPool(t_nodes, t_per_node, plan.nodes, plan.devices_per_node),
    )


def _teacher_lines(config: Any, pool_size: int, req: PlanRequest) -> list[str]:
    d = config.distillation
    acc = get_accelerator(req.accelerator) if req.accelerator is not None else None
    budget = budget_bytes(acc) if acc is not None else None
    lines = []
    for t in d.teachers(config.actor_rollout_ref.rollout.name, pool_size):
        try:
            shape = model_shape(t.model_path)
        except UnknownModelError as error:
            lines.append(f"{t.name}'s memory is not counted: {error}")
            continue
        weights = BF16 * shape.num_params / t.tp
        what = (
            f"{t.name} ({t.model_path}, {shape.num_params / 1e9:.1f}B) on {t.engine},"
            f" {t.num_replicas} × TP {t.tp}: bf16 weights {weights / GIB:.1f} GiB a device"
        )
        if budget is None:
            lines.append(what)
            continue
        if t.engine == "vllm":
            fraction = float(t.inference.get("gpu_memory_utilization") or 0.5)
            room = fraction * acc.memory_gib * GIB
            what += f" of the {room / GIB:.1f} GiB its engine takes (gpu_memory_utilization {fraction:g})"
            fix = "raise its inference.gpu_memory_utilization or tensor_model_parallel_size"
        else:
            rows = config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu or 1
            length = config.data.max_prompt_length + config.data.max_response_length
            logits = FLOAT32 * 2 * rows * length * shape.vocab_size  # logits and log-softmax
            weights += logits
            room = budget
            what += f" + logits {logits / GIB:.1f} GiB, of {room / GIB:.1f} GiB usable"
            fix = "use inference.name=vllm with a larger tensor_model_parallel_size"
        if weights > room:
            raise InfeasiblePlanError(
                f"distillation teacher {t.name} ({t.model_path}) needs {weights / GIB:.1f} GiB"
                f" on each of its devices, over the {room / GIB:.1f} GiB it may use on one"
                f" {acc.name}",
                hint=f"{fix} (distillation.teacher_models.{t.name}.inference.*), with"
                " devices to match (distillation.n_gpus_per_node)",
            )
        lines.append(what)
    return lines
