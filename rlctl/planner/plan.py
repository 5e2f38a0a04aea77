"""The planner: from a model, an accelerator and batch settings to a layout that fits.

``make_plan(PlanRequest) -> Plan`` picks the node and device count, the rollout's tensor
parallelism and memory fraction, the mini/micro batch sizes, offload and (for Megatron)
training parallelism, and explains each decision with its numbers (``Plan.reasoning``).
It has no side effects and imports neither torch, ray nor the engine (beyond
``engine.schema``); its output becomes engine overrides through
``Plan.engine_overrides()``.

The memory model is documented formula by formula in docs/planner.md; its assumptions
are the constants of ``rlctl/planner/model.py``, its parts the modules of
``rlctl/planner/``. In short, per device and in bytes:

training (FSDP/FSDP2, mixed precision: fp32 parameters sharded over D devices, bf16
compute, fp32 gradient reduction; actor, reference and critic share the devices):
    weights     4·N/D per model kept on the device (actor, reference, critic)
    grads       4·N/D for the model being updated (gradients are freed after each step)
    optimizer   8·N/D per trained model (AdamW m and v, fp32)
    gathered    4·root + 10·layer (bf16 copies FSDP unshards: the root unit with its
                gradient, the current and the prefetched layer, the layer's bf16 and
                fp32 gradient)
    activations with gradient checkpointing, for t tokens in a micro-batch:
                t·h·L·2 (layer inputs kept) + max(t·V·10 logits, 2·t·a_layer)
rollout (vLLM/SGLang colocated): the training state that stays on the device (weights and
optimizer unless offloaded) + a pool of fraction × device memory holding the bf16
weights / rollout TP and the KV cache (2·L·kv_heads·head_dim·2 bytes per token).
Megatron splits the weights over TP × PP and, for long samples, each sample over CP
context-parallel ranks: activations (and the engine's S×S attention mask) scale 1/CP,
weights do not.
"""

from __future__ import annotations

import math
from dataclasses import replace

from rlctl.hardware import Accelerator, get_accelerator
from rlctl.models import ModelShape, model_shape
from rlctl.planner.cpu import cpu_plan
from rlctl.planner.explain import (
    assemble,
    reasoning_lines,
)
from rlctl.planner.fit import (
    CandidateLayout,
    fmt_number,
    tp_heads_message,
    tp_ok,
)
from rlctl.planner.memory import (
    TrainCfg,
    budget_bytes,
    train_activations,
)
from rlctl.planner.model import (
    CP_MIN_TOKENS_PER_RANK,
    GIB,
    MAX_NODES,
    MAX_THROUGHPUT_NODES,
    InfeasiblePlanError,
    MemoryEstimate,
    Plan,
    PlanRequest,
    RewardPool,
    RolloutSplit,
)
from rlctl.planner.reward_pool import training_request, with_own_pool
from rlctl.planner.search import (
    auto_layouts,
    context_parallel_sizes,
    fixed_layout,
    search_layouts,
    step_seconds,
)
from rlctl.planner.settings import (
    Settings,
    check_device_count,
    settings_for,
)
from rlctl.planner.split import separate_plan
from rlctl.planner.teacher_pool import training_request as teacher_request
from rlctl.planner.teacher_pool import with_teacher_pool

# ---------------------------------------------------------------------------
# the entry point


def make_plan(req: PlanRequest) -> Plan:
    """Size a run; raises ``InfeasiblePlanError`` with the reason and what would fit."""
    # the reward model's own devices, if any, come beside the training's, then the
    # distillation teachers' own
    sized = _training_plan(teacher_request(training_request(req)))
    return with_teacher_pool(with_own_pool(sized, req), req)


def _training_plan(req: PlanRequest) -> Plan:
    s = settings_for(req)
    m = model_shape(req.model)
    if req.accelerator is None:
        return cpu_plan(req, s, m)
    acc = get_accelerator(req.accelerator)
    _check_support(s, acc)
    if s.rollout_tp is not None and not tp_ok(m, s.rollout_tp):
        raise InfeasiblePlanError(
            tp_heads_message(m, s.rollout_tp),
            hint=f"use a rollout tensor_model_parallel_size of {_tp_choices(m)}",
        )
    if s.separate:  # the rollout on devices of its own: split them (planner/split.py)
        return separate_plan(req, s, m, acc)

    fixed = fixed_layout(req, s, acc.name)
    if fixed is not None:
        check_device_count(s, fixed.nodes, fixed.per_node)
    per_node = s.per_node or req.max_devices_per_node
    step_1 = step_seconds(m, s, acc, 1)
    floor = 1
    if fixed is not None:
        layouts = [fixed]
    else:
        # Memory sets the least; the step-time floor keeps a step under the target.
        everything = auto_layouts(per_node)
        floor = min(math.ceil(step_1 / s.target_s), MAX_THROUGHPUT_NODES * per_node)
        layouts = [lay for lay in everything if lay.devices >= floor] or everything[-1:]
    fit, tried = search_layouts(m, s, acc, layouts)
    if fit is None:
        raise _infeasible(req, s, m, acc, fixed, tried)
    lines = reasoning_lines(s, m, acc, fit, tried, step_1, floor, auto=fixed is None)
    return assemble(s, m, acc, fit, lines, step_1)


def _check_support(s: Settings, acc: Accelerator) -> None:
    if s.rollout_backend not in acc.rollout_backends:
        raise InfeasiblePlanError(
            f"rollout backend {s.rollout_backend!r} does not run on {acc.name} ({acc.vendor});"
            f" supported there: {', '.join(acc.rollout_backends)}",
            hint=f"set rollout={acc.rollout_backends[0]} (docs/hardware.md gives the basis)",
        )
    if s.train_backend not in acc.train_backends:
        raise InfeasiblePlanError(
            f"training backend {s.train_backend!r} does not run on {acc.name} ({acc.vendor});"
            f" supported there: {', '.join(acc.train_backends)}",
            hint=f"set train_backend={acc.train_backends[0]} (docs/hardware.md gives the basis)",
        )


def _tp_choices(m: ModelShape) -> str:
    return ", ".join(str(tp) for tp in (1, 2, 4, 8, 16, 32, 64) if tp_ok(m, tp))


def _mask_note(m: ModelShape, s: Settings, acc: Accelerator, devices: int) -> str:
    """Why long samples fail under Megatron, when the attention mask is a large part of
    it: one sample's mask on one rank at the largest CP tried on ``devices`` (TP 1, PP 1),
    kept and with attention's working set, as the failure reasons count it."""
    seq = s.seq_len
    cp = s.cp or max(context_parallel_sizes(seq, devices, None))
    c = TrainCfg("megatron", devices, False, False, s.grad_ckpt, cp=cp)
    mask = train_activations(m, c, seq, seq).mask
    if mask < 0.25 * budget_bytes(acc):
        return ""
    if s.cp is not None:
        which, way = f"the pinned CP {cp}", "a larger CP or shorter samples shrink it"
    elif seq // (2 * cp) < CP_MIN_TOKENS_PER_RANK:
        which = f"CP {cp}, the largest tried"
        way = (
            f"CP goes no further (each rank keeps at least {CP_MIN_TOKENS_PER_RANK} tokens of"
            " a sample): only shorter samples shrink it"
        )
    else:
        which = f"CP {cp}, the largest tried"
        way = "more CP ranks (more devices) or shorter samples shrink it"
    return (
        f" (the Megatron engine's attention mask is S × S booleans per sample, of which each"
        f" CP rank builds and keeps its S/CP rows, 5 B per query-key pair with attention's"
        f" working set: {fmt_number(mask)} per device for one {seq}-token sample at {which}; {way})"
    )


def _infeasible(
    req: PlanRequest,
    s: Settings,
    m: ModelShape,
    acc: Accelerator,
    fixed: CandidateLayout | None,
    tried: list[str],
) -> InfeasiblePlanError:
    """The reason (the first layouts tried and why each failed) and what would fit."""
    where = fixed.describe(acc.name) if fixed else f"up to {MAX_NODES} nodes of {acc.name}"
    # one layout: each offload level's reason; several: the smallest and the largest
    shown = tried if fixed is not None or len(tried) < 2 else [tried[0], tried[-1]]
    shown = [t.removeprefix(f"{where}, ") for t in shown]  # said once, in front
    message = f"{m.name} does not fit on {where}: " + ("; ".join(shown) or "nothing to try")
    per_node = s.per_node or req.max_devices_per_node
    if s.train_backend == "megatron":
        message += _mask_note(m, s, acc, (fixed or auto_layouts(per_node)[-1]).devices)
    hints: list[str] = []
    if fixed is not None:
        fit, _ = search_layouts(m, replace(s, nodes=None), acc, auto_layouts(per_node))
        if fit is not None:
            hints.append(f"needs ~{fit.layout.describe(acc.name)}")
    if s.train_backend != "megatron" and "megatron" in acc.train_backends and not s.lora_rank:
        fit, _ = search_layouts(
            m, replace(s, train_backend="megatron"), acc, auto_layouts(per_node)
        )
        if fit is not None:
            cp = f" × CP {fit.train.cp}" if fit.train.cp > 1 else ""
            hints.append(
                f"set train_backend=megatron (fits on {fit.layout.describe(acc.name)},"
                f" TP {fit.train.tp} × PP {fit.train.pp}{cp})"
            )
    pinned = [
        key
        for key, value in (
            ("ppo_mini_batch_size", s.mini),
            ("ppo_micro_batch_size_per_gpu", s.micro),
            ("ppo_max_token_len_per_gpu", s.token_len),
            ("tensor_model_parallel_size", s.rollout_tp),
            ("gpu_memory_utilization", s.fraction),
            ("context_parallel_size", s.cp if s.train_backend == "megatron" else None),
            ("ulysses_sequence_parallel_size", s.sp if s.train_backend != "megatron" else None),
            (
                "fsdp_config offload flags",
                s.param_offload if s.param_offload is not None else s.optimizer_offload,
            ),
        )
        if value is not None
    ]
    if pinned:
        hints.append(f"unpin {', '.join(pinned)} and let the planner choose")
    if s.multi_turn is not None and any("multi-turn rollouts on SGLang run" in t for t in tried):
        hints.append(
            f"multi-turn rollouts on SGLang run at TP 1, so the bf16 weights"
            f" ({fmt_number(2 * m.num_params)}) and their KV must fit one device: take a smaller"
            " model, or actor_rollout_ref.rollout.name=vllm (multi-turn with TP)"
        )
    hints.append(
        f"shorten the sequences (now data.max_prompt_length {s.prompt_len} +"
        f" data.max_response_length {s.response_len} tokens), or use an accelerator with"
        " more memory"
    )
    return InfeasiblePlanError(message, hint="; or ".join(hints))


__all__ = [
    "GIB",
    "InfeasiblePlanError",
    "MemoryEstimate",
    "Plan",
    "PlanRequest",
    "RewardPool",
    "RolloutSplit",
    "make_plan",
]
