"""A fitted candidate assembled into a ``Plan``, and the reasoning it shows:
every decision with its numbers."""

from __future__ import annotations

import math
from dataclasses import replace

from rlctl.hardware import Accelerator
from rlctl.models import ModelShape
from rlctl.planner.fit import (
    CandidateLayout,
    Fit,
    TrainFit,
    count_noun,
    fmt_number,
    fmt_params,
    gib,
)
from rlctl.planner.images import default_image
from rlctl.planner.memory import (
    TrainCfg,
    adapter_params,
    budget_bytes,
    fsdp_state,
    megatron_lengths,
    megatron_state,
    train_activations,
)
from rlctl.planner.model import (
    ADAM_STEP_BYTES,
    ASSUMED_MFU,
    DYNAMIC_BSZ_MIN_TOKENS,
    FRAGMENTATION,
    FSDP_LOGITS_BYTES,
    LOGITS_BYTES,
    LOGITS_BYTES_FP32,
    LONG_SAMPLE_TOKENS,
    LORA_FROZEN_BYTES,
    MAX_MICRO,
    RESERVED_GIB,
    UPDATES_PER_STEP,
    MemoryEstimate,
    Plan,
)
from rlctl.planner.multi_turn import multi_turn_lines
from rlctl.planner.search import flops_per_param_token
from rlctl.planner.settings import (
    Settings,
    made_for,
)

# Where a term is one the GPU proof measured (planner/model.py says what and where).
MEASURED = ", measured on an H100"

# ---------------------------------------------------------------------------
# the plan and its explanation


def assemble(
    s: Settings, m: ModelShape, acc: Accelerator, fit: Fit, lines: list[str], step_1: float
) -> Plan:
    c, t, r, lay = fit.train, fit.fitted, fit.rollout, fit.layout
    st = t.state
    memory = MemoryEstimate(
        device_gib=float(acc.memory_gib),
        budget_gib=gib(budget_bytes(acc)),
        train_weights_gib=gib(st.weights),
        train_grads_gib=gib(st.grads),
        train_optimizer_gib=gib(st.optimizer),
        train_gathered_gib=gib(st.gathered),
        train_activations_gib=gib(t.activations),
        train_logits_gib=gib(t.logits),
        train_mask_gib=gib(t.mask),
        train_step_extra_gib=gib(st.step_extra),
        rollout_resident_gib=gib(st.resident),
        rollout_weights_gib=gib(r.weights),
        rollout_kv_cache_gib=gib(r.kv_cache),
        rollout_pool_gib=gib(r.pool),
        host_gib_per_node=gib(st.host * lay.per_node),
        reward_model_gib=gib(st.reward_model),
        reward_model_held=st.reward_model_held,
    )
    return Plan(
        nodes=lay.nodes,
        devices_per_node=lay.per_node,
        accelerator=acc.name,
        rollout_tp=r.tp,
        train_backend=c.backend,
        train_tp=c.tp,
        train_pp=c.pp,
        ppo_mini_batch_size=fit.mini,
        micro_batch_size_per_device=t.micro,
        use_dynamic_bsz=t.dynamic,
        # the key counts one device's share (the engine multiplies by SP or CP)
        max_token_len_per_device=math.ceil(t.token_len / (c.sp * c.cp)),
        param_offload=c.param_offload,
        optimizer_offload=c.optimizer_offload,
        gradient_checkpointing=c.grad_ckpt,
        rollout_memory_fraction=r.fraction,
        image=default_image(acc, s.rollout_backend).ref,
        memory=memory,
        model=m,
        reasoning=lines,
        **made_for(s),
        train_ep=c.ep,
        train_cp=c.cp,
        train_sp=c.sp,
        log_prob_micro_batch_size_per_device=t.log_prob_micro,
        hf_rollout_micro_batch_size=r.hf_micro,
        estimated_step_seconds=round(step_1 / lay.devices, 1),
    )


def duration_words(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def reasoning_lines(
    s: Settings,
    m: ModelShape,
    acc: Accelerator,
    fit: Fit,
    tried: list[str],
    step_1: float,
    floor: int,
    auto: bool,
    layout_lines: list[str] | None = None,
) -> list[str]:
    """The plan's reasoning. ``layout_lines``, when given, say how the devices were chosen
    in place of the colocated step-compute, floor and devices lines (the rollout on
    devices of its own: planner/split.py); ``fit.layout`` is then the training group."""
    c, t, lay = fit.train, fit.fitted, fit.layout
    lines = [model_line(m), *(f"note: {n}" for n in s.notes)]
    lines.append(
        f"budget: {acc.name} has {acc.memory_gib:g} GiB; the plan uses at most"
        f" {fmt_number(budget_bytes(acc))} per device ({FRAGMENTATION:.0%} lost to allocator"
        f" fragmentation, {RESERVED_GIB:g} GiB for the runtime context and collective buffers)"
    )
    if layout_lines is not None:
        lines += layout_lines
    else:
        lines += _layout_lines(s, m, acc, lay, tried, step_1, floor, auto)
    lines += _train_lines(m, s, c, t)
    if c.backend == "megatron":
        lines += _context_parallel_lines(m, s, c, budget_bytes(acc), lay.per_node)
    else:
        lines += _ulysses_lines(m, s, c, budget_bytes(acc))
    lines += _batch_lines(s, fit)
    lines += list(fit.rollout.lines)
    if s.multi_turn is not None:
        lines += multi_turn_lines(s.multi_turn, s.prompt_len, s.response_len)
    if t.state.host:
        lines.append(
            f"host RAM: the offloaded state takes {fmt_number(t.state.host)} per device,"
            f" {fmt_number(t.state.host * lay.per_node)} per node (besides loading the checkpoint)"
        )
    if c.backend == "megatron" and m.is_moe:  # engine imported for Megatron plans only
        from engine.schema import MODEL_TYPES

        if m.model_type not in MODEL_TYPES:
            lines.append(
                f"megatron: sized here, but the engine has no conversion for"
                f" {m.model_type!r} (it converts {', '.join(MODEL_TYPES)}): rlctl validate and"
                " launch refuse it; use trainer: fsdp2 in the recipe"
            )
    image = default_image(acc, s.rollout_backend)
    lines.append(
        f"image: {image.ref}: {image.contents}"
        if image.public
        else f"image: {image.ref}, on no public registry: {image.build}"
    )
    return lines


def _batch_lines(s: Settings, fit: Fit) -> list[str]:
    """The mini- and micro-batches, and the token budget of dynamic batch size."""
    c, t, lay = fit.train, fit.fitted, fit.layout
    lines: list[str] = []
    per_device = fit.mini * s.n // lay.devices
    mini_why = (
        "pinned"
        if s.mini is not None
        else f"train batch {s.train_batch} / {UPDATES_PER_STEP} updates per step, rounded to"
        " a divisor whose samples split evenly over the devices"
    )
    micro_why = "pinned" if s.micro is not None else f"the largest divisor ≤ {MAX_MICRO} that fits"
    lines.append(
        f"batch: mini-batch {fit.mini} prompts ({mini_why}) × {s.n} = {fit.mini * s.n}"
        f" samples → {per_device} per device; micro-batch {t.micro} ({micro_why});"
        f" log-prob micro-batch {t.log_prob_micro} (forward only)"
    )
    if c.backend == "megatron" and c.model_parallel > 1:
        dp = lay.devices // c.model_parallel
        lines[-1] += (
            f"; the {count_noun(dp, 'data-parallel replica')} (TP × PP × CP = {c.model_parallel}"
            f" devices each) take {fit.mini * s.n // dp} samples each per mini-batch"
        )
    elif c.sp > 1:
        dp = lay.devices // c.sp
        lines[-1] += (
            f"; the {count_noun(dp, 'Ulysses group')} ({c.sp} devices each, sharing their rows)"
            f" take {fit.mini * s.n // dp} samples each per mini-batch"
        )
    if t.dynamic:
        why = "pinned" if s.dynamic is not None else f"≥ {DYNAMIC_BSZ_MIN_TOKENS}"
        split = (
            f" per micro-batch, {math.ceil(t.token_len / c.cp)} on each of the CP {c.cp} ranks"
            " (ppo_max_token_len_per_gpu counts those; the engine multiplies by CP)"
            if c.cp > 1
            else " per device"
        )
        if c.sp > 1:
            split = (
                f" per micro-batch of a Ulysses group, {math.ceil(t.token_len / c.sp)} on each"
                f" of its {c.sp} ranks (ppo_max_token_len_per_gpu counts those; the engine"
                " multiplies by SP)"
            )
        lines.append(
            f"dynamic batch size: on ({s.seq_len} tokens per sample, {why}): micro-batches"
            f" are packed up to {t.token_len} tokens{split}"
        )
    return lines


def _layout_lines(
    s: Settings,
    m: ModelShape,
    acc: Accelerator,
    lay: CandidateLayout,
    tried: list[str],
    step_1: float,
    floor: int,
    auto: bool,
) -> list[str]:
    """The step's compute, the step-time floor and the layout chosen (colocated)."""
    parts = f"generate 2, old log-probs 2, update {8 if s.grad_ckpt else 6}"
    parts += ", reference 2" if s.reference else ""
    parts += f", critic {2 + (8 if s.grad_ckpt else 6)}" if s.critic else ""
    lines = [
        f"step compute: {s.train_batch} prompts × {s.n} samples × {s.seq_len} tokens ="
        f" {s.samples * s.seq_len / 1e6:.2f}M tokens × {fmt_params(m.compute_params)}"
        f"{' active' if m.is_moe else ''} params × {flops_per_param_token(s)} FLOPs ({parts})"
        f" = {duration_words(step_1)} on one {acc.name} at {ASSUMED_MFU:.0%} of"
        f" {acc.bf16_tflops:g} TFLOPS → ~{duration_words(step_1 / lay.devices)} per step on"
        f" {lay.devices} (an upper bound: every response at its maximum length)"
    ]
    if floor > 1:
        lines.append(
            f"step-time floor: a step under {s.target_s / 60:g} min needs ≥ {floor} devices"
        )
    how = "the smallest layout" if auto else "the requested layout"
    lines.append(
        f"devices: {lay.describe(acc.name)} — {how} where training and rollout fit"
        + (f" (tried: {'; '.join(tried[:4])})" if tried else "")
    )
    return lines


def model_line(m: ModelShape) -> str:
    moe = (
        f"; MoE: {m.num_experts} experts of width {m.moe_intermediate_size},"
        f" {m.experts_per_token} per token, {fmt_params(m.compute_params)} active"
        if m.is_moe
        else ""
    )
    attn = (
        f"MLA latent {m.kv_latent_dim}"
        if m.kv_latent_dim
        else f"{m.num_kv_heads} KV heads × {m.head_dim}"
    )
    vision = (
        f"; a vision tower of {fmt_params(m.vision_params)} (counted in memory, not in the"
        " per-token compute)"
        if m.vision_params
        else ""
    )
    return (
        f"model: {m.name} — {fmt_params(m.num_params)} parameters ({m.source}); {m.num_layers}"
        f" layers, hidden {m.hidden_size}, {m.num_attention_heads} heads / {attn}, vocab"
        f" {m.vocab_size}{moe}{vision}"
    )


def _targets(s: Settings) -> str:
    return s.lora_targets if isinstance(s.lora_targets, str) else ", ".join(s.lora_targets)


def _train_lines(m: ModelShape, s: Settings, c: TrainCfg, t: TrainFit) -> list[str]:
    st, d = t.state, c.devices
    roles = "actor" + (" + critic" if s.critic else "") + (" + reference" if s.reference else "")
    if c.backend == "megatron":
        head = (
            f"training (megatron; {roles}): TP {c.tp} within a node × PP {c.pp} × CP {c.cp}"
            + (f" × EP {c.ep}" if m.is_moe else "")
            + (f" (experts split over ETP {c.etp})" if m.is_moe and c.etp is not None else "")
            + f", data parallel {d // c.model_parallel} (= {d} / (TP × PP × CP)); bf16 weights"
            f" {fmt_number(st.weights)} (not split by CP), fp32"
            f" gradient buffer {fmt_number(st.grads)}, distributed optimizer (fp32 master + Adam,"
            f" 12 B/param over {count_noun(d, 'device')}) {fmt_number(st.optimizer)}"
        )
    elif s.lora_rank:
        adapter = adapter_params(m, s)
        head = (
            f"training ({c.backend}, LoRA rank {s.lora_rank}"
            + (" (assumed: the saved adapter is not readable here)" if s.lora_rank_assumed else "")
            + f" on {_targets(s)};"
            f" {roles.replace(' + reference', '')} sharded"
            f" over {count_noun(d, 'device')}): weights 4 B/param of the base model"
            + ("" if c.fp32 else f" (+ {LORA_FROZEN_BYTES} B/param held in the update{MEASURED})")
            + " + adapter"
            f" {fmt_params(adapter)} ({adapter / m.num_params:.2%} of"
            f" {fmt_params(m.num_params)}) → {fmt_number(st.weights)}, the reference being the"
            f" actor with its adapter off (no second copy); gradients 4 B and Adam 8 B per"
            f" adapter param → {fmt_number(st.grads)} and {fmt_number(st.optimizer)}; gathered"
            f" {fmt_number(st.gathered)}"
        )
    else:
        head = (
            f"training ({c.backend}; {roles} sharded over {count_noun(d, 'device')}, fp32 parameters, bf16"
            f" compute): weights 4 B/param → {fmt_number(st.weights)}; gradients 4 B/param of the"
            f" model being updated → {fmt_number(st.grads)}; Adam 8 B/param → {fmt_number(st.optimizer)};"
            f" gathered 4 B × root {fmt_params(m.root_params)} + 10 B × largest layer"
            f" {fmt_params(m.largest_layer_params)} → {fmt_number(st.gathered)}"
        )
    tokens = t.token_len if t.dynamic else t.micro * s.seq_len
    parts = [f"TP {c.tp}"] * (c.tp > 1) + [f"CP {c.cp}"] * (c.cp > 1)
    split = ""
    if c.backend == "megatron" and parts:
        split = " / " + (parts[0] if len(parts) == 1 else f"({' × '.join(parts)})")
    logits_all = t.logits if c.backend != "megatron" else tokens * m.vocab_size * LOGITS_BYTES
    if c.sp > 1 and c.logits_chunk is None:  # Ulysses: each rank's share of the tokens
        split = f" / SP {c.sp}"
        logits_all = _head_tokens(c, tokens) * m.vocab_size * _logits_entry_bytes(c)
    biggest = " — the largest term" if t.logits >= 0.5 * t.activations else ""
    mask = (
        f"; the attention mask (S × S booleans per sequence, each rank building only its"
        f" S/CP rows) {fmt_number(t.mask)} at its largest"
        if t.mask
        else ""
    )
    act = (
        f"activations for {tokens} tokens per micro-batch"
        f" ({'gradient checkpointing' if c.grad_ckpt else 'no checkpointing'}):"
        f" {fmt_number(t.activations)}; of which logits {_logits_formula(m, c, tokens)}"
        f" = {fmt_number(logits_all)}{split}{biggest}{mask}; training peak"
        f" {fmt_number(st.peak(t.activations))}"
    )
    if st.step_extra and not c.optimizer_offload:
        act += (
            f" (the optimizer step's temporaries, {ADAM_STEP_BYTES} B per trained parameter,"
            f" {fmt_number(st.step_extra)}{MEASURED})"
        )
    if c.param_offload and c.backend == "megatron":
        off = "offload: weights, gradients and optimizer go to host RAM between phases"
    elif c.param_offload:
        off = (
            "offload: parameters, gradients and Adam live in host RAM; FSDP streams each"
            " layer in and the optimizer steps on the CPU (slow)"
        )
    elif c.optimizer_offload:
        off = "offload: optimizer states live in host RAM between updates" + (
            "" if c.backend == "megatron" else " (back on the device for the step)"
        )
    else:
        off = "offload: none (everything fits on the devices)"
    rm = [] if s.reward_model is None else [s.reward_model.describe(s.samples, d)]
    return [head, *rm, act, off]


def _context_parallel_lines(
    m: ModelShape, s: Settings, c: TrainCfg, budget: float, per_node: int
) -> list[str]:
    """Why this CP: the split it makes and, when CP > 1, what one sample needs at half."""
    seq = s.seq_len
    if c.cp == 1 and seq < LONG_SAMPLE_TOKENS and s.cp is None:
        return []  # short samples: CP is not considered
    padded, _ = megatron_lengths(c, seq, seq)
    line = f"context parallel: CP {c.cp}"
    if s.cp is not None:
        line += " (pinned by the recipe)"
    if c.cp == 1:
        return [line + f": one {seq}-token sample fits at TP {c.tp} × PP {c.pp} without it"]
    multiple = f"a multiple of{' TP ×' if c.tp > 1 else ''} 2·CP"
    line += (
        f": each {seq}-token sample"
        + (f" ({multiple})" if padded == seq else f" is padded to {padded} ({multiple}) and")
        + f" is cut into {2 * c.cp} chunks, each rank holding two ({padded // c.cp} tokens:"
        " chunks r and 2·CP − 1 − r); activations and the attention mask scale 1/CP, weights"
        " do not; the keys and values of the whole sequence are gathered over the CP group"
        " for attention"
    )
    if s.cp is None:
        half = replace(c, cp=c.cp // 2)
        state = megatron_state(m, half, s.critic, s.reference)
        need = state.peak(train_activations(m, half, seq, seq).total)
        if need > budget:
            line += f"; at CP {half.cp} one sample needs {fmt_number(need)} > budget {fmt_number(budget)}"
    if c.tp * c.cp > per_node:
        line += (
            f" (TP × CP = {c.tp * c.cp} ranks span {c.tp * c.cp // per_node} nodes: the"
            " all-gather crosses the inter-node network)"
        )
    return [line]


def _ulysses_lines(m: ModelShape, s: Settings, c: TrainCfg, budget: float) -> list[str]:
    """FSDP's Ulysses size: the split it makes and, when SP > 1, what one sample needs at
    half of it (the planner takes the smallest size that fits, as CP under Megatron)."""
    seq = s.seq_len
    if c.sp == 1 and seq < LONG_SAMPLE_TOKENS and s.sp is None:
        return []  # short samples: Ulysses is not considered
    line = f"sequence parallel (Ulysses): SP {c.sp}"
    if s.sp is not None:
        line += " (pinned by the recipe)"
    if c.sp == 1:
        if s.remove_padding is False and s.sp is None:
            return [line + ": use_remove_padding=false is pinned (Ulysses splits packed rows)"]
        return [line + f": one {seq}-token sample fits on a device without it"]
    line += (
        f": every micro-batch's packed tokens are split over {c.sp} consecutive ranks"
        f" (~{math.ceil(seq / c.sp)} tokens of a {seq}-token sample each, the {c.sp} ranks"
        " sharing their rows); attention exchanges queries, keys, values and its output"
        f" all-to-all, each rank attending over the whole sequence with {m.num_attention_heads}"
        f"/{c.sp} query heads and {m.num_kv_heads}/{c.sp} KV heads; activations and logits"
        " scale 1/SP, the sharded weights and optimizer do not; sets"
        " ulysses_sequence_parallel_size and use_remove_padding=true"
    )
    if s.sp is None:
        half = replace(c, sp=c.sp // 2)
        state = fsdp_state(m, half, s.critic, s.reference, adapter_params(m, s))
        need = state.peak(train_activations(m, half, seq, seq).total)
        if need > budget:
            line += f"; at SP {half.sp} one sample needs {fmt_number(need)} > budget {fmt_number(budget)}"
    return [line]


def _head_tokens(c: TrainCfg, tokens: int) -> int:
    return math.ceil(tokens * c.head_share)


def _logits_entry_bytes(c: TrainCfg) -> int:
    if c.fp32:
        return LOGITS_BYTES_FP32
    return FSDP_LOGITS_BYTES if c.head_share < 1.0 else LOGITS_BYTES


def _logits_formula(m: ModelShape, c: TrainCfg, tokens: int) -> str:
    """How the logits term was counted: every token's, or the response positions' alone
    at the measured bytes per entry (FSDP on accelerators), or (use_fused_kernels) one
    chunk's and the fp32 buffer the head's weight gradient is summed in."""
    if c.backend == "megatron":
        return f"{tokens} × {m.vocab_size} × {LOGITS_BYTES} B"
    head_tokens = _head_tokens(c, tokens)
    per_entry = _logits_entry_bytes(c)
    positions = (
        f"{head_tokens} response positions of the {tokens} tokens"
        if head_tokens < tokens
        else f"{tokens}"
    )
    measured = MEASURED if per_entry == FSDP_LOGITS_BYTES else ""
    if c.logits_chunk is None:
        return f"{positions} × {m.vocab_size} × {per_entry} B{measured}"
    chunk = min(head_tokens, c.logits_chunk)
    head_params = fmt_params(m.vocab_size * m.hidden_size)
    head = "" if c.fp32 else f" + head gradient 4 B × {head_params}"
    return (
        f"(use_fused_kernels: {chunk} of the {positions} at a time)"
        f" {chunk} × {m.vocab_size} × {per_entry} B{head}{measured}"
    )
