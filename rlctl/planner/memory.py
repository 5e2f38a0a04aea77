"""The memory model, formula by formula (bytes per device; docs/planner.md), and the
engine's batch-size rules in its words."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from rlctl.hardware import Accelerator
from rlctl.models import ModelShape
from rlctl.planner.model import (
    ADAM_STEP_BYTES,
    FRAGMENTATION,
    FSDP_LOGITS_BYTES,
    GIB,
    LOGITS_BYTES,
    LOGITS_BYTES_FP32,
    LONG_SAMPLE_TOKENS,
    LORA_FROZEN_BYTES,
    RESERVED_GIB,
    UPDATES_PER_STEP,
    InfeasiblePlanError,
)
from rlctl.planner.settings import Settings

# ---------------------------------------------------------------------------
# memory formulas (bytes per device)


def budget_bytes(acc: Accelerator) -> float:
    """Usable device memory: nominal × (1 − fragmentation) − context and NCCL buffers."""
    return acc.memory_gib * GIB * (1.0 - FRAGMENTATION) - RESERVED_GIB * GIB


def _critic_params(m: ModelShape) -> int:
    """The value model: the same body, a one-output head (weight and bias) for lm_head."""
    return m.num_params - m.lm_head_params + m.hidden_size + 1


def layer_activation_bytes_per_token(m: ModelShape, dtype_bytes: int = 2) -> int:
    """What one decoder layer saves for its backward, per token.

    norm input and output, attention output and the post-attention norm in/out (4·h),
    q and the attention output (2·q), k and v (kv), and the gated MLP's gate, up,
    act(gate) and their product (4·I, I = the MLP width one token passes through).
    """
    width = 4 * m.hidden_size + 2 * m.q_dim + m.kv_dim + 4 * m.mlp_width_per_token
    return dtype_bytes * width


def _activation_terms(
    m: ModelShape,
    tokens: int,
    grad_ckpt: bool,
    *,
    tp: int = 1,
    stage_layers: int | None = None,
    act_bytes: int = 2,
    logits_bytes: int = LOGITS_BYTES,
    logits_chunk: int | None = None,
    head_share: float = 1.0,
) -> tuple[float, float]:
    """(activations, of which logits) for ``tokens`` tokens on one device, of which the
    ``head_share`` reach the LM head.

    With checkpointing: the layer inputs (t·h·L·2) stay for the backward; its peak then
    adds the larger of the logits' buffers (freed once the lm_head's backward has run)
    and one recomputed layer with its gradients (2 × the layer's activations).
    Without: every layer's activations stay. Megatron divides by its TP size (sequence
    parallel) and keeps ``stage_layers`` checkpoints. ``logits_chunk``: see
    ``logits_buffer_bytes``.
    """
    layers = m.num_layers if stage_layers is None else stage_layers
    layer = tokens * layer_activation_bytes_per_token(m, act_bytes)
    head_tokens = math.ceil(tokens * head_share)
    logits = logits_buffer_bytes(
        m, head_tokens, logits_bytes, logits_chunk, grads=True, fp32=act_bytes == 4
    )
    if grad_ckpt:
        kept = tokens * m.hidden_size * layers * act_bytes
        total = kept + max(logits, 2 * layer)
    else:
        total = layers * layer + max(logits, layer)
    return total / tp, logits / tp


def logits_buffer_bytes(
    m: ModelShape, tokens: float, per_entry: int, chunk: int | None, *, grads: bool, fp32: bool
) -> float:
    """The logits of ``tokens`` tokens, ``per_entry`` bytes per vocabulary entry; with
    ``use_fused_kernels`` (``chunk``) only one chunk's exist at a time, and a backward sums
    the head's weight gradient over chunks in an fp32 buffer of its own (4 B per head
    parameter; under fp32 training it is the gradient the full logits' backward makes too)."""
    if chunk is None:
        return tokens * m.vocab_size * per_entry
    accumulator = 4 * m.vocab_size * m.hidden_size if grads and not fp32 else 0
    return min(tokens, chunk) * m.vocab_size * per_entry + accumulator


@dataclass(frozen=True)
class TrainCfg:
    backend: str
    devices: int
    param_offload: bool
    optimizer_offload: bool
    grad_ckpt: bool
    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int | None = None  # Megatron: ranks each routed expert is split over (None: TP)
    cp: int = 1
    sp: int = 1  # FSDP: Ulysses size (each micro-batch's tokens split over SP ranks)
    fp32: bool = False  # CPU: no mixed precision
    logits_chunk: int | None = None  # FSDP with use_fused_kernels: tokens of logits at once
    # FSDP on accelerators: the share of a sample's tokens the LM head sees (the response
    # positions: the engine asks the head for those alone), counted at the measured
    # FSDP_LOGITS_BYTES; 1.0 counts every token at LOGITS_BYTES (Megatron, CPU plans)
    head_share: float = 1.0

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def model_parallel(self) -> int:
        """Devices one model replica spans (Megatron: TP × PP × CP; the rest is data parallel)."""
        return self.tp * self.pp * self.cp


@dataclass(frozen=True)
class TrainMem:
    weights: float
    grads: float
    optimizer: float
    gathered: float
    step_extra: float
    resident: float  # left on the device during rollout (a held reward model included)
    host: float  # per device, in host RAM
    # The reward model's copy on this device (planner/reward_model.py): held through the
    # run, or (a vLLM judge that sleeps) only while it judges, beside ``resident``.
    reward_model: float = 0.0
    reward_model_held: bool = True

    def peak(self, activations: float) -> float:
        held = self.weights + self.grads + self.optimizer
        held += self.reward_model if self.reward_model_held else 0.0
        return max(held + self.gathered + activations, held + self.step_extra)

    def with_reward_model(self, size: float, held: bool) -> TrainMem:
        """This state with a reward model of ``size`` bytes on the device."""
        return replace(
            self,
            reward_model=size,
            reward_model_held=held,
            resident=self.resident + (size if held else 0.0),
        )

    @property
    def judging(self) -> float:
        """The device while a sleeping judge judges (0 for a held reward model: it is in
        the other phases already)."""
        return 0.0 if self.reward_model_held else self.resident + self.reward_model


# Which (in, out) widths each linear layer LoRA may target has, per decoder layer.
def _linear_widths(m: ModelShape) -> dict[str, tuple[int, int]]:
    h, q, kv, inner = m.hidden_size, m.q_dim, m.kv_dim // 2, m.mlp_width_per_token
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, inner),
        "up_proj": (h, inner),
        "down_proj": (inner, h),
    }


def lora_params(m: ModelShape, rank: int, targets: str | tuple[str, ...]) -> int:
    """Adapter parameters: r × (in + out) for each targeted linear layer of every decoder
    layer (all-linear: attention and the MLP a token passes through; names the table does
    not know count as nothing, the engine checks them against the model)."""
    if rank <= 0:
        return 0
    widths = _linear_widths(m)
    names = widths if targets == "all-linear" else [t for t in targets if t in widths]
    return rank * m.num_layers * sum(sum(widths[name]) for name in names)


def adapter_params(m: ModelShape, s: Settings) -> int:
    """The recipe's LoRA adapter's parameters (0 without LoRA). A rank above the hidden
    size adds parameters and no capacity (B·A already spans the layer): refused."""
    if s.lora_rank and s.lora_rank > m.hidden_size:
        raise InfeasiblePlanError(
            f"actor_rollout_ref.model.lora_rank={s.lora_rank} is larger than the model's"
            f" hidden size {m.hidden_size}: the adapter would outgrow what it adapts",
            hint="use a rank of 8 to 64 (at most the hidden size), or lora_rank=0 to train"
            " every weight",
        )
    return lora_params(m, s.lora_rank, s.lora_targets)


def fsdp_state(
    m: ModelShape, c: TrainCfg, critic: bool, reference: bool, adapter: int = 0
) -> TrainMem:
    """FSDP/FSDP2 with fp32 sharded parameters, bf16 compute (docs/planner.md). With a
    LoRA ``adapter`` (its parameter count) the actor's gradients and Adam states are the
    adapter's alone, and the reference is the actor with it disabled: no second copy.
    On accelerators the measured terms of ``planner.model`` are counted: the optimizer
    step's temporaries (ADAM_STEP_BYTES per trained parameter) and LoRA's frozen base
    (LORA_FROZEN_BYTES per parameter)."""
    n, nc, d = m.num_params, _critic_params(m), c.devices
    actor_trained = adapter or n
    trained = actor_trained + (nc if critic else 0)
    kept = n + adapter + (nc if critic else 0) + (n if reference and not adapter else 0)
    on_device = not c.param_offload
    measured = not c.fp32  # the GPU proof's corrections: measured with bf16 compute
    weights = 4 * kept / d if on_device else 0.0
    if adapter and on_device and measured:
        weights += LORA_FROZEN_BYTES * n / d
    largest_trained = max(actor_trained, nc if critic else 0)
    grads = 4 * largest_trained / d if on_device else 0.0
    adam = 8 * trained / d
    optimizer = adam if on_device and not c.optimizer_offload else 0.0
    # optimizer_offload: each model's states come back for its own step only
    step_extra = 8 * largest_trained / d if on_device and c.optimizer_offload else 0.0
    if on_device and not c.optimizer_offload and measured:
        step_extra = ADAM_STEP_BYTES * largest_trained / d  # the step's temporaries
    gather_bytes = 8 if c.fp32 else 4  # root unit + its gradient
    layer_bytes = 20 if c.fp32 else 10
    gathered = gather_bytes * m.root_params + layer_bytes * m.largest_layer_params
    host = (4 * kept + 4 * largest_trained + adam) / d if c.param_offload else 0.0
    if c.optimizer_offload and on_device:
        host = adam
    return TrainMem(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        gathered=gathered,
        step_extra=step_extra,
        resident=weights + optimizer,
        host=host,
    )


def _expert_params(m: ModelShape) -> int:
    """Routed-expert parameters of the whole model (0 for a dense model)."""
    if not m.is_moe or m.active_params is None or m.num_experts == m.experts_per_token:
        return 0
    inactive = m.num_params - m.active_params
    return inactive * m.num_experts // (m.num_experts - m.experts_per_token)


def megatron_state(m: ModelShape, c: TrainCfg, critic: bool, reference: bool) -> TrainMem:
    """Megatron-core: bf16 weights and fp32 gradient buffer split by TP×PP (experts by
    ETP×EP×PP, ETP being TP unless pinned), fp32 master weights and Adam in the distributed optimizer (sharded over data
    parallel: 12·N/D). Offload (verl's) moves state to the host between phases, so it
    frees the device for the rollout but not for the update."""
    stage = math.ceil(m.num_layers / c.pp) * c.pp / m.num_layers  # uneven last stage
    experts = _expert_params(m)

    def split(total: int) -> float:
        dense = total - experts
        return stage * (dense / (c.tp * c.pp) + experts / (c.expert_tp * c.pp * c.ep))

    models = [m.num_params] + ([_critic_params(m)] if critic else [])
    weights = sum(2 * split(x) for x in models) + (2 * split(m.num_params) if reference else 0)
    grads = sum(4 * split(x) for x in models)
    optimizer = sum(12 * x / c.devices for x in models)
    resident = 0.0 if c.param_offload else weights + grads
    resident += 0.0 if c.optimizer_offload else optimizer
    host = (weights + grads if c.param_offload else 0.0) + (
        optimizer if c.optimizer_offload else 0.0
    )
    return TrainMem(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        gathered=0.0,
        step_extra=0.0,
        resident=resident,
        host=host,
    )


@dataclass(frozen=True)
class _Act:
    """One micro-batch's activations on a device, in bytes: the total at its peak, the
    logits' part, and (Megatron) the engine's S×S attention mask at its largest."""

    total: float
    logits: float
    mask: float = 0.0


def train_activations(m: ModelShape, c: TrainCfg, tokens: int, seq: int) -> _Act:
    """Activations for a micro-batch of ``tokens`` tokens of samples up to ``seq`` long."""
    if c.backend == "megatron":
        return _megatron_activations(m, c, tokens, seq)
    if c.fp32:
        act_bytes, logits_bytes = 4, LOGITS_BYTES_FP32
    elif c.head_share < 1.0:
        act_bytes, logits_bytes = 2, FSDP_LOGITS_BYTES
    else:
        act_bytes, logits_bytes = 2, LOGITS_BYTES
    local = math.ceil(tokens / c.sp)  # Ulysses: this rank's share of the micro-batch
    total, logits = _activation_terms(
        m,
        local,
        c.grad_ckpt,
        act_bytes=act_bytes,
        logits_bytes=logits_bytes,
        logits_chunk=c.logits_chunk,
        head_share=c.head_share,
    )
    if c.sp > 1:
        total += _ulysses_exchange_bytes(m, local, act_bytes)
    return _Act(total, logits)


def _ulysses_exchange_bytes(m: ModelShape, local: float, act_bytes: int) -> float:
    """One layer's all-to-all copies under Ulysses: its queries, keys, values and attention
    output as sent and as received (L/SP tokens × all heads = L tokens × heads/SP)."""
    return 2 * local * (2 * m.q_dim + m.kv_dim) * act_bytes


def megatron_lengths(c: TrainCfg, seq: int, tokens: float) -> tuple[int, float]:
    """(S, T): under context parallelism the engine pads every sequence to a multiple of
    TP (sequence parallel) × 2·CP (the zigzag chunks; ``MegatronEngine._forward``), so a
    micro-batch of ``tokens`` tokens of ``seq``-token samples runs as T padded tokens, T/CP
    of them on each rank. (At CP 1 the padding to a multiple of TP is under TP tokens and
    left out.)"""
    if c.cp == 1:
        return seq, tokens
    multiple = c.tp * 2 * c.cp
    padded_seq = -(-seq // multiple) * multiple
    return padded_seq, tokens * padded_seq / seq


def _counts_mask(c: TrainCfg, seq: int) -> bool:
    """Whether the estimate counts the engine's S×S attention mask: for long samples (where
    it grows to GiBs and decides what fits) and under CP. Below ``LONG_SAMPLE_TOKENS`` at
    CP 1 it is under 64 MiB per sample and left out, so plans for short samples are the
    ones the planner made before it knew of CP."""
    return c.cp > 1 or seq >= LONG_SAMPLE_TOKENS


def _gathered_kv_bytes(m: ModelShape, c: TrainCfg, padded: float) -> float:
    """Keys and values a rank gathers from the other CP ranks for attention, repeated to
    every query head when there are fewer KV heads (``SDPAttention``); 0 at CP 1."""
    per_token = 2 * m.q_dim if m.num_kv_heads < m.num_attention_heads else m.kv_dim
    if m.kv_latent_dim:
        per_token = m.kv_dim
    return (padded - padded / c.cp) * per_token * 2 / c.tp


def _mask_build_bytes(c: TrainCfg, s_pad: int, padded: float) -> float:
    """``attention_mask_B1SS`` at its peak for this rank's R = S/CP query rows of a
    micro-batch of T = B·S padded tokens: a causal and an identity (R, S) boolean, the
    (B, 1, R, S) allowed mask and its inverse, 2·R·S + 2·B·R·S = (2·S + 2·T)·S/CP bytes
    (at CP 1 the whole mask, 2·S² + 2·T·S)."""
    return (2 * s_pad + 2 * padded) * s_pad / c.cp


def _megatron_activations(m: ModelShape, c: TrainCfg, tokens: int, seq: int) -> _Act:
    """Megatron with sequence parallelism over TP, context parallelism over CP and 1F1B
    over PP, per device, for a micro-batch of T padded tokens (T/CP on this rank) of
    sequences padded to S:

    - checkpoints: each layer's input, (T/CP)·h·2/TP bytes, for every layer on the first
      stage (PP micro-batches in flight × L/PP layers) and ⌈L/PP⌉ layers on the last;
    - the attention mask: the engine builds only this rank's S/CP query rows of the
      (B, 1, S, S) boolean mask (``attention_mask_B1SS(mask, rows)``): (2 + 2·B)·S²/CP
      bytes at its peak (a causal and an identity (S/CP, S), the mask and its inverse),
      T·S/CP bytes kept per micro-batch in flight;
    - one recomputed layer with its gradients (2·(T/CP)·a_layer/TP), the keys and values
      gathered from the other CP ranks with their gradients, and the mask's working set in
      attention: its inverse, SDPA's temporary and the bf16 additive mask SDPA turns it
      into (4 B per query-key pair);
    - on the last stage the logits, (T/CP)·V·10/TP, instead of the recomputed layer.

    Without checkpointing every layer keeps its activations, gathered keys and values and
    the bf16 mask SDPA saves for its backward.
    """
    s_pad, padded = megatron_lengths(c, seq, tokens)
    local = padded / c.cp
    layers, pp = m.num_layers, c.pp
    per_stage = math.ceil(layers / pp)
    keep = local * m.hidden_size * 2 / c.tp  # one layer's checkpointed input
    layer = local * layer_activation_bytes_per_token(m) / c.tp
    logits = local * m.vocab_size * LOGITS_BYTES / c.tp
    counted = _counts_mask(c, seq)
    mask = padded * s_pad / c.cp if counted else 0.0  # this rank's rows of the boolean mask
    build = _mask_build_bytes(c, s_pad, padded) if counted else 0.0
    gathered = _gathered_kv_bytes(m, c, padded)
    if c.grad_ckpt:
        recompute = 2 * layer + 2 * gathered + 4 * mask
        first = keep * layers + pp * mask + recompute
        last = keep * per_stage + mask + max(logits, recompute)
    else:
        saved = layer + gathered + 2 * mask
        first = saved * layers + pp * mask
        last = saved * per_stage + mask + max(logits, layer)
    # The next micro-batch's mask is built while the earlier ones in flight hold theirs.
    building = keep * layers * (pp - 1) / pp + (pp - 1) * mask + build
    return _Act(max(first, last, building), logits, max(build, (pp + 4) * mask))


def megatron_forward_bytes(m: ModelShape, c: TrainCfg, tokens: int, seq: int) -> float:
    """A forward pass without gradients (old and reference log-probs): the logits, one
    layer's activations with its gathered keys and values, the mask (kept and its working
    set in attention), or the mask's construction, whichever is larger."""
    s_pad, padded = megatron_lengths(c, seq, tokens)
    local = padded / c.cp
    per_token = m.vocab_size * LOGITS_BYTES + layer_activation_bytes_per_token(m)
    if not _counts_mask(c, seq):
        return local * per_token / c.tp
    mask = padded * s_pad / c.cp
    running = local * per_token / c.tp + _gathered_kv_bytes(m, c, padded) + 5 * mask
    return max(running, _mask_build_bytes(c, s_pad, padded))


# ---------------------------------------------------------------------------
# batch sizes (the engine's rules, in its words)


def divisors_of(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _divisors_near(n: int, around: int, count: int = 3) -> list[int]:
    near = sorted(divisors_of(n), key=lambda d: (abs(d - around), d))[:count]
    return sorted(near)


def _mini_rule(s: Settings, mini: int, devices: int) -> str | None:
    """engine.config's rules 1 and 2 for a mini-batch, worded as the engine words them."""
    if mini > s.train_batch or s.train_batch % mini:
        fits = ", ".join(map(str, _divisors_near(s.train_batch, mini)))
        return (
            f"actor_rollout_ref.actor.ppo_mini_batch_size {mini} must divide"
            f" data.train_batch_size {s.train_batch} (both count prompts);"
            f" use a divisor such as {fits}"
        )
    if (mini * s.n) % devices:
        return (
            f"actor_rollout_ref.actor.ppo_mini_batch_size × rollout.n = {mini} × {s.n} ="
            f" {mini * s.n} samples must be divisible by the {devices} devices"
            " (trainer.nnodes × trainer.n_gpus_per_node); change the mini-batch size,"
            " rollout.n or the device count"
        )
    return None


def micro_rule(s: Settings, mini: int, micro: int, devices: int) -> str | None:
    per_device = mini * s.n // devices
    if per_device % micro:
        fits = ", ".join(map(str, _divisors_near(per_device, micro)))
        # The engine takes uneven micro-batches; the planner sizes memory for even ones.
        return (
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu {micro} must divide the"
            f" {per_device} samples each device gets per mini-batch ({mini} prompts ×"
            f" {s.n} samples / {devices} devices) for the plan's even micro-batches; use"
            f" {fits}, or set actor_rollout_ref.actor.use_dynamic_bsz=true"
        )
    return None


def largest_ok(ok: Callable[[int], bool], low: int, high: int) -> int:
    """The largest k in [low, high] with ``ok(k)``, for ``ok`` true up to a point and false
    after it (memory that grows with k); ``low`` when none is."""
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if ok(mid) else (low, mid - 1)
    return low


def pick_mini(s: Settings, devices: int) -> tuple[int | None, str | None]:
    """The pinned mini-batch, checked; or the divisor of the train batch nearest below
    train batch / 4 whose samples split evenly over the devices."""
    if s.mini is not None:
        return s.mini, _mini_rule(s, s.mini, devices)
    target = max(1, s.train_batch // UPDATES_PER_STEP)
    ok = [m for m in divisors_of(s.train_batch) if (m * s.n) % devices == 0]
    if not ok:
        return None, _mini_rule(s, s.train_batch, devices)
    below = [m for m in ok if m <= target]
    return (max(below) if below else min(ok)), None
