"""One candidate layout: does training fit, does the rollout fit, and with what."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from rlctl.hardware import Accelerator
from rlctl.models import ModelShape
from rlctl.planner.memory import (
    TrainCfg,
    TrainMem,
    adapter_params,
    budget_bytes,
    divisors_of,
    fsdp_state,
    largest_ok,
    layer_activation_bytes_per_token,
    logits_buffer_bytes,
    megatron_forward_bytes,
    megatron_state,
    micro_rule,
    pick_mini,
    train_activations,
)
from rlctl.planner.model import (
    DYNAMIC_BSZ_MIN_TOKENS,
    GIB,
    HOST_RAM_GIB,
    HOST_RAM_USABLE,
    LOGITS_BYTES,
    MAX_FRACTION,
    MAX_MICRO,
    MAX_TOKEN_BUDGET,
    MIN_CONCURRENT_SEQS,
    MIN_FRACTION,
    ROLLOUT_MAX_NUM_SEQS,
    ROLLOUT_OVERHEAD_GIB,
)
from rlctl.planner.settings import Settings

# ---------------------------------------------------------------------------
# one candidate layout


@dataclass(frozen=True)
class CandidateLayout:
    nodes: int
    per_node: int

    @property
    def devices(self) -> int:
        return self.nodes * self.per_node

    def describe(self, acc_name: str) -> str:
        if self.nodes == 1:
            return f"{self.per_node} × {acc_name} on 1 node"
        return f"{self.nodes} nodes × {acc_name}:{self.per_node} = {self.devices} devices"


@dataclass(frozen=True)
class TrainFit:
    state: TrainMem
    micro: int  # samples per micro-batch
    dynamic: bool
    token_len: int  # ppo_max_token_len_per_gpu
    activations: float  # bytes, for the micro-batch (or token budget) chosen
    logits: float
    log_prob_micro: int = 1
    mask: float = 0.0  # megatron: the attention mask at its largest


@dataclass(frozen=True)
class RolloutFit:
    tp: int
    fraction: float  # gpu_memory_utilization (0 for hf)
    weights: float  # bytes per device
    kv_cache: float
    pool: float
    hf_micro: int | None
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Fit:
    layout: CandidateLayout
    train: TrainCfg
    mini: int
    fitted: TrainFit
    rollout: RolloutFit


def gib(x: float) -> float:
    return round(x / GIB, 3)


def fmt_number(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def count_noun(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def fmt_params(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def _fit_train(
    m: ModelShape,
    s: Settings,
    c: TrainCfg,
    budget: float | None,
    mini: int,
    per_node: int,
) -> tuple[TrainFit | None, str]:
    """Micro-batch / token budget that fits; (None, why) when one sample does not."""
    if c.backend == "megatron":
        state = megatron_state(m, c, s.critic, s.reference)
    else:
        state = fsdp_state(m, c, s.critic, s.reference, adapter_params(m, s))
    if s.reward_model is not None:
        rm = s.reward_model
        state = state.with_reward_model(rm.bytes_per_device(s.samples, c.devices), not rm.sleeps)
        if budget is not None and state.judging > budget:
            return None, (
                f"the judge needs {fmt_number(state.reward_model)} per device (weights, KV cache for"
                f" {rm.rows(s.samples, c.devices)} prompts of {rm.judge_len} tokens, engine"
                f" overhead) beside {fmt_number(state.resident)} of resident training state,"
                f" over the {fmt_number(budget)} budget (a smaller judge or shorter"
                " reward_model.judge.max_prompt_length / max_new_tokens need less)"
            )
    host = state.host * per_node
    if host > HOST_RAM_USABLE * HOST_RAM_GIB * GIB:
        return None, (
            f"offloading needs {fmt_number(host)} of host RAM per node, more than"
            f" {HOST_RAM_USABLE:.0%} of the {HOST_RAM_GIB} GiB assumed"
        )
    per_device = mini * s.n // c.devices
    seq = s.seq_len
    dynamic = s.dynamic if s.dynamic is not None else seq >= DYNAMIC_BSZ_MIN_TOKENS

    def fits(tokens: int) -> bool:
        act = train_activations(m, c, tokens, seq)
        return budget is None or state.peak(act.total) <= budget

    if not fits(seq):
        act = train_activations(m, c, seq, seq)
        mask = f" and the attention mask {fmt_number(act.mask)}" if act.mask else ""
        where = f" at CP {c.cp}" if c.cp > 1 else (f" at SP {c.sp}" if c.sp > 1 else "")
        return None, (
            f"training one {seq}-token sample{where} needs {fmt_number(state.peak(act.total))} per"
            f" device (weights {fmt_number(state.weights)}, grads {fmt_number(state.grads)}, Adam"
            f" {fmt_number(state.optimizer)}, gathered {fmt_number(state.gathered)}, activations"
            f" {fmt_number(act.total)} of which logits {fmt_number(act.logits)}{mask}{_step(state)})"
            f" > budget {fmt_number(budget or 0)}"
        )
    if s.micro is not None:
        micro = s.micro
        if not fits(micro * seq):
            act = train_activations(m, c, micro * seq, seq)
            best = largest_ok(lambda k: fits(k * seq), 1, micro - 1)
            return None, (
                f"pinned ppo_micro_batch_size_per_gpu {micro} needs"
                f" {fmt_number(state.peak(act.total))}"
                f" per device > budget {fmt_number(budget or 0)}; at most {best} fits"
            )
    else:
        divisors = [k for k in divisors_of(per_device) if k <= MAX_MICRO] or [1]
        micro = max(k for k in divisors if k == 1 or fits(k * seq))
    token_len, problem = _token_len(s, c, dynamic, micro, fits, budget)
    if token_len is None:
        return None, problem
    act = train_activations(m, c, token_len if dynamic else micro * seq, seq)
    return TrainFit(
        state,
        micro,
        dynamic,
        token_len,
        act.total,
        act.logits,
        _log_prob_micro(m, c, state, s, budget),
        act.mask,
    ), ""


def _token_len(
    s: Settings,
    c: TrainCfg,
    dynamic: bool,
    micro: int,
    fits: Callable[[int], bool],
    budget: float | None,
) -> tuple[int | None, str]:
    """ppo_max_token_len_per_gpu, as the engine counts it per device: the recipe's, the
    largest that fits (dynamic batch size, in steps of 1024 tokens), or micro × seq."""
    seq = s.seq_len
    if s.token_len is not None:
        # per device: a Ulysses or CP group's micro-batch is SP × or CP × (the engine's)
        token_len = s.token_len * c.sp * c.cp
        if dynamic and not fits(token_len):
            return None, (
                f"pinned ppo_max_token_len_per_gpu {s.token_len} does not fit in"
                f" {fmt_number(budget or 0)} per device"
            )
    elif dynamic:
        # The cap is per device: a Ulysses or CP group's micro-batch is SP × or CP × it
        # (the key counts a device's share; the engine multiplies by SP or CP).
        cap = max(seq, MAX_TOKEN_BUDGET * c.cp * c.sp)
        token_len = seq
        step = 1024
        candidate = (cap // step) * step
        while candidate > seq:
            if fits(candidate):
                token_len = candidate
                break
            candidate -= step
    else:
        token_len = micro * seq
    return token_len, ""


def _step(state: TrainMem) -> str:
    """The optimizer step's own extra memory, where it is counted (offloaded Adam states
    brought back, or the measured temporaries of the step)."""
    return f"; the optimizer step {fmt_number(state.step_extra)} more" if state.step_extra else ""


def _log_prob_micro(
    m: ModelShape, c: TrainCfg, state: TrainMem, s: Settings, budget: float | None
) -> int:
    """Forward-only micro-batch (old and reference log-probs): no checkpoints are kept,
    so the logits and one layer's activations are what grow with it."""
    seq = s.seq_len
    for k in (32, 16, 8, 4, 2):
        tokens = k * seq
        if c.backend == "megatron":
            act = megatron_forward_bytes(m, c, tokens, seq)
        else:
            local = math.ceil(tokens / c.sp)
            head = math.ceil(local * c.head_share)  # the positions the head is asked for
            logits = logits_buffer_bytes(
                m, head, LOGITS_BYTES, c.logits_chunk, grads=False, fp32=False
            )
            act = logits + local * layer_activation_bytes_per_token(m)
        held = state.weights + state.optimizer + state.gathered
        held += state.reward_model if state.reward_model_held else 0.0
        if budget is None or held + act <= budget:
            return k
    return 1


def tp_ok(m: ModelShape, tp: int) -> bool:
    """vLLM/SGLang shard attention heads over TP: TP must divide the query heads, and
    either divide the KV heads or be a multiple of them (KV heads are then replicated).
    MLA caches one latent per token, copied on every TP rank: only the query heads count."""
    if m.num_attention_heads % tp:
        return False
    if m.kv_latent_dim:
        return True
    return m.num_kv_heads % tp == 0 or tp % m.num_kv_heads == 0


def _kv_bytes_per_token_per_device(m: ModelShape, tp: int) -> float:
    if m.kv_latent_dim:
        return m.kv_cache_bytes_per_token()
    return m.kv_cache_bytes_per_token() / min(tp, m.num_kv_heads)


def _tp_candidates(layout: CandidateLayout) -> list[int]:
    out, tp = [], 1
    while tp <= layout.devices:
        if layout.devices % tp == 0 and (tp <= layout.per_node or tp % layout.per_node == 0):
            out.append(tp)
        tp *= 2
    return out


def fit_rollout(
    m: ModelShape,
    s: Settings,
    acc: Accelerator,
    layout: CandidateLayout,
    state: TrainMem,
    budget: float,
) -> tuple[RolloutFit | None, str]:
    """The rollout engine on ``layout`` beside training's ``state``: its memory pool, its
    TP and its KV cache (the arithmetic), then the lines that explain them; or None and
    why it does not fit."""
    if s.rollout_backend == "hf":
        return _fit_hf_rollout(m, s, layout.devices, state, budget)
    fraction, problem = _pool_fraction(s, acc, state, budget)
    if fraction is None:
        return None, problem
    kv = _KvPool(m, s, layout, fraction * acc.memory_gib * GIB)
    tp, why = _rollout_tp(m, s, acc, layout, kv, fraction)
    if tp is None:
        return None, why
    lines = _rollout_lines(m, s, acc, layout, state, budget, kv, fraction, tp, why)
    return RolloutFit(tp, fraction, kv.weights(tp), kv.cache(tp), kv.pool, None, lines), ""


def _fit_hf_rollout(
    m: ModelShape, s: Settings, devices: int, state: TrainMem, budget: float
) -> tuple[RolloutFit | None, str]:
    """HF generate on the actor's own gathered (bf16) weights, per-device samples."""
    weights_total = 2 * m.num_params  # bf16
    kv_seq = m.kv_cache_bytes_per_token() * s.seq_len
    room = budget - state.resident - weights_total - ROLLOUT_OVERHEAD_GIB * GIB
    per_device = max(1, s.samples // devices)
    if room < kv_seq:
        return None, (
            f"hf rollout gathers the whole model ({fmt_number(weights_total)} bf16) next to"
            f" {fmt_number(state.resident)} of training state: no room for one sequence's KV"
            f" ({fmt_number(kv_seq)})"
        )
    micro = min(per_device, int(room // kv_seq))
    on = (
        f"its own bf16 copy of the weights ({fmt_number(weights_total)}) on each of the rollout's"
        f" {count_noun(devices, 'device')}, where no training state stays"
        if s.separate
        else f"the actor's gathered bf16 weights ({fmt_number(weights_total)})"
    )
    line = (
        f"rollout (hf): generate() runs on {on}; {micro} sequences per call"
        f" ({fmt_number(micro * kv_seq)} of KV cache at"
        f" {m.kv_cache_bytes_per_token() // 1024} KiB/token)"
        + (
            ""
            if s.separate
            else f" next to {fmt_number(state.resident)} of resident training state"
        )
    )
    return RolloutFit(1, 0.0, weights_total, micro * kv_seq, 0.0, micro, (line,)), ""


def _pool_fraction(
    s: Settings, acc: Accelerator, state: TrainMem, budget: float
) -> tuple[float | None, str]:
    """gpu_memory_utilization: the recipe's, or what the budget leaves beside the
    training state, rounded down to 0.05 and at most MAX_FRACTION; None and why when it
    does not fit or is too small for an engine."""
    mem = acc.memory_gib * GIB
    room = (budget - state.resident) / mem
    f_max = min(MAX_FRACTION, math.floor(room * 20 + 1e-9) / 20)
    if s.fraction is not None and s.fraction > room + 1e-9:
        asks = f"pinned gpu_memory_utilization {s.fraction} asks for {fmt_number(s.fraction * mem)}"
        if s.separate:
            return None, (
                f"{asks} of a device whose budget is {fmt_number(budget)}: at most"
                f" {max(f_max, 0):.2f} fits"
            )
        return None, (
            f"{asks} while {fmt_number(state.resident)} of training state"
            f" stays on each device: at most {max(f_max, 0):.2f} fits (or offload)"
        )
    fraction = s.fraction if s.fraction is not None else f_max
    if fraction < MIN_FRACTION and s.separate:
        return None, (
            f"gpu_memory_utilization {fraction} is below {MIN_FRACTION}: too little for a"
            " rollout engine"
        )
    if fraction < MIN_FRACTION:
        return None, (
            f"training state left on the device while generating ({fmt_number(state.resident)})"
            f" leaves {fmt_number(max(0.0, budget - state.resident))} of {fmt_number(budget)}: too little"
            " for a rollout engine"
        )
    return fraction, ""


@dataclass(frozen=True)
class _KvPool:
    """The engine's memory pool on each device and what a TP puts in it: the weights'
    share, the engine's overhead, and KV for the sequences in flight."""

    m: ModelShape
    s: Settings
    layout: CandidateLayout
    pool: float  # bytes per device

    @property
    def weights_total(self) -> float:
        return 2 * self.m.num_params  # bf16

    @functools.cached_property
    def replicas_of(self) -> dict[int, int]:
        return {tp: self.layout.devices // tp for tp in _tp_candidates(self.layout)}

    def need(self, tp: int) -> tuple[int, int, float]:
        """Sequences wanted in flight per replica, the fewest that must fit, and each
        sequence's KV bytes per device."""
        per_replica = math.ceil(self.s.samples / self.replicas_of[tp])
        want = min(per_replica, ROLLOUT_MAX_NUM_SEQS)
        minimum = min(per_replica, MIN_CONCURRENT_SEQS)
        return want, minimum, self.s.seq_len * _kv_bytes_per_token_per_device(self.m, tp)

    def weights(self, tp: int) -> float:
        return self.weights_total / tp

    def cache(self, tp: int) -> float:
        return self.pool - self.weights(tp) - ROLLOUT_OVERHEAD_GIB * GIB

    def fits(self, tp: int) -> bool:
        _, minimum, per_seq = self.need(tp)
        return self.weights(tp) + ROLLOUT_OVERHEAD_GIB * GIB + minimum * per_seq <= self.pool


def _rollout_tp(
    m: ModelShape,
    s: Settings,
    acc: Accelerator,
    layout: CandidateLayout,
    kv: _KvPool,
    fraction: float,
) -> tuple[int | None, str]:
    """The rollout's TP and why (pinned; SGLang's multi-turn; else the smallest that
    leaves room), or None and why none fits."""
    total, pool = kv.weights_total, kv.pool
    if s.rollout_tp is not None:
        tp = s.rollout_tp
        if tp not in kv.replicas_of:
            where = (
                f"the rollout's own {layout.describe(acc.name)}"
                if s.separate
                else f"the {layout.devices} devices the rollout shares with the actor"
            )
            return None, f"pinned rollout tensor_model_parallel_size {tp} must divide {where}"
        if not kv.fits(tp):
            return None, (
                f"pinned rollout TP {tp}: weights {fmt_number(total / tp)} + KV for"
                f" {kv.need(tp)[1]} sequences do not fit in the {fmt_number(pool)} pool"
            )
        return tp, "pinned by the recipe"
    if s.multi_turn is not None and s.rollout_backend == "sglang":
        if not kv.fits(1):
            return None, (
                f"rollout: multi-turn rollouts on SGLang run at TP 1, where bf16 weights"
                f" ({fmt_number(total)}) and KV for {kv.need(1)[1]} sequences of {s.seq_len} tokens"
                f" do not fit in a {fmt_number(pool)} pool (gpu_memory_utilization {fraction:.2f})"
            )
        return 1, "multi-turn rollouts on SGLang run at TP 1 (its members do not step together)"
    valid = [tp for tp in kv.replicas_of if tp_ok(m, tp)]
    in_node = [
        tp for tp in valid if tp <= layout.per_node and total / tp <= 0.5 * pool and kv.fits(tp)
    ]
    anywhere = [tp for tp in valid if kv.fits(tp)]
    if in_node:
        tp = in_node[0]
        return tp, (
            "the smallest power of two whose weights take at most half the pool"
            f" ({fmt_number(total / tp)} ≤ {fmt_number(0.5 * pool)})"
        )
    if anywhere:
        tp = anywhere[0]
        why = (
            "no TP within a node keeps the weights under half the pool; the smallest"
            f" that fits the weights and KV for {kv.need(tp)[1]} full-length sequences"
        )
        if tp > layout.per_node:
            why += f" (spans {tp // layout.per_node} nodes: inter-node TP is slow)"
        return tp, why
    return None, _no_rollout_tp(m, s, kv, valid, fraction)


def _no_rollout_tp(
    m: ModelShape, s: Settings, kv: _KvPool, valid: list[int], fraction: float
) -> str:
    if not valid:
        return "rollout: " + tp_heads_message(m, max(kv.replicas_of))
    blocked = [tp for tp in kv.replicas_of if not tp_ok(m, tp) and kv.fits(tp) and tp > max(valid)]
    if blocked:
        return f"rollout: the weights need TP ≥ {blocked[0]}, but " + tp_heads_message(
            m, blocked[0]
        )
    return (
        f"rollout: bf16 weights ({fmt_number(kv.weights_total)}) and KV for"
        f" {MIN_CONCURRENT_SEQS} sequences of {s.seq_len} tokens fit no TP up to"
        f" {max(valid)} within a {fmt_number(kv.pool)} pool (gpu_memory_utilization"
        f" {fraction:.2f})"
    )


def _rollout_lines(
    m: ModelShape,
    s: Settings,
    acc: Accelerator,
    layout: CandidateLayout,
    state: TrainMem,
    budget: float,
    kv: _KvPool,
    fraction: float,
    tp: int,
    why: str,
) -> tuple[str, ...]:
    """What ``rlctl plan`` says of the rollout: the pool, the TP, the KV cache."""
    devices, seq = layout.devices, s.seq_len
    want, _, per_seq = kv.need(tp)
    cache = kv.cache(tp)
    holds = int(cache // per_seq)
    if s.separate:
        first = (
            f"rollout ({s.rollout_backend}, on its own {count_noun(devices, 'device')}): no training"
            f" state there → gpu_memory_utilization {fraction:.2f}"
            + (
                " (pinned)"
                if s.fraction is not None
                else f" = ⌊budget {fmt_number(budget)} / {acc.memory_gib:g} GiB⌋ to 0.05, at most"
                f" {MAX_FRACTION:g}"
            )
        )
    else:
        first = (
            f"rollout ({s.rollout_backend}): {fmt_number(state.resident)} of training state stays on"
            f" each device while generating ({_RESIDENT[s.train_backend == 'megatron']})"
            f" → gpu_memory_utilization {fraction:.2f}"
            + (
                " (pinned)"
                if s.fraction is not None
                else f" = ⌊(budget {fmt_number(budget)} − {fmt_number(state.resident)}) /"
                f" {acc.memory_gib:g} GiB⌋ to 0.05"
            )
        )
    lines = [
        first + f", a {fmt_number(kv.pool)} pool",
        f"rollout TP {tp}: {why}; divides {m.num_attention_heads} heads"
        + ("" if m.kv_latent_dim else f" and suits {m.num_kv_heads} KV heads")
        + f"; {count_noun(devices // tp, 'replica')}",
        f"KV cache: pool − weights − {ROLLOUT_OVERHEAD_GIB:g} GiB engine overhead ="
        f" {fmt_number(cache)} per device at {per_seq / seq / 1024:.0f} KiB/token; holds {holds}"
        f" sequences of {seq} tokens per replica ({want} wanted in flight:"
        f" min(samples per replica, {ROLLOUT_MAX_NUM_SEQS}))"
        + ("" if holds >= want else "; the engine queues the rest"),
    ]
    if tp > 1 and not acc.nvlink_like:
        lines.append(f"{acc.name} has no NVLink-class links: rollout TP {tp} runs over PCIe")
    return tuple(lines)


_RESIDENT = {
    False: "weights and Adam unless offloaded; FSDP frees gradients after each step",
    True: "weights, gradient buffer and optimizer unless offloaded",
}


def tp_heads_message(m: ModelShape, tp: int) -> str:
    if m.num_attention_heads % tp:
        return (
            f"actor_rollout_ref.rollout.tensor_model_parallel_size {tp} must divide the model's"
            f" {m.num_attention_heads} attention heads"
        )
    return (
        f"actor_rollout_ref.rollout.tensor_model_parallel_size {tp} must divide the model's"
        f" {m.num_kv_heads} KV heads or be a multiple of them"
    )


def evaluate_train(
    m: ModelShape,
    s: Settings,
    layout: CandidateLayout,
    c: TrainCfg,
    budget: float,
) -> tuple[tuple[int, TrainFit] | None, str]:
    """(mini-batch, training fit) on ``layout`` with ``c``; (None, why) when none fits."""
    mini, why = pick_mini(s, layout.devices)
    if mini is None or why:
        return None, why or "no mini-batch"
    if s.micro is not None and not (s.dynamic or False):
        why = micro_rule(s, mini, s.micro, layout.devices)
        if why:
            return None, why
    train, why = _fit_train(m, s, c, budget, mini, layout.per_node)
    if train is None:
        return None, why
    return (mini, train), ""


def evaluate(
    m: ModelShape,
    s: Settings,
    acc: Accelerator,
    layout: CandidateLayout,
    c: TrainCfg,
) -> tuple[Fit | None, str]:
    budget = budget_bytes(acc)
    trained, why = evaluate_train(m, s, layout, c, budget)
    if trained is None:
        return None, why
    mini, train = trained
    rollout, why = fit_rollout(m, s, acc, layout, train.state, budget)
    if rollout is None:
        return None, why
    return Fit(layout, c, mini, train, rollout), ""
