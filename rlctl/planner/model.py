"""The planner's vocabulary: the assumptions of its memory model (docs/planner.md
explains each), what it is asked (``PlanRequest``) and what it answers (``Plan``, with its
``MemoryEstimate``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from rlctl.errors import RlctlError
from rlctl.hardware import get_accelerator
from rlctl.models import ModelShape

GIB = 1024**3

# ---- assumptions of the memory model (docs/planner.md explains each) ----------------
FRAGMENTATION = 0.08  # share of device memory the caching allocator loses to fragmentation
RESERVED_GIB = 1.0  # CUDA/ROCm/CANN context and collective buffers
LOGITS_BYTES = 10  # per token per vocabulary entry: bf16 logits 2 + fp32 copy 4 + softmax 4
LOGITS_BYTES_FP32 = 8  # CPU (fp32 everywhere): logits 4 + softmax temporary 4
# Measured corrections (docs/planner.md#measured-on-a-gpu): the GPU proof ran the engine's
# FSDP2 actor on an H100 (benchmarks/results/gpu_proof-2026-11-28-h100.txt) and found the
# update's peak 1.11-1.39x the formulas above. Three terms closed the gap to within 10 %:
# - the head's logits in the FSDP update (bf16 compute): 20 B per vocabulary entry (bf16
#   logits, their fp32 copy, log-softmax, entropy and their gradients; 19.1-21.1 B
#   measured), of the response positions only (the engine asks the head for those alone;
#   the formula counted every token at 10 B);
FSDP_LOGITS_BYTES = 20
# - torch's AdamW step (foreach, with gradient clipping) makes temporaries of 8 B per
#   trained parameter beside the weights, gradients and Adam states (8.1-8.7 B measured);
ADAM_STEP_BYTES = 8
# - a LoRA update holds 2 B per parameter of the frozen base beyond the formula (a bf16
#   copy; 2.4-2.9 B measured at one device, counted sharded like the weights).
LORA_FROZEN_BYTES = 2
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
# The rollout on devices of its own (planner/split.py): decoding is bound by memory
# bandwidth and waits for a batch's longest response, so generation takes more time per
# FLOP than training. verl's published one-step-off runs (DAPO, Qwen2.5-Math-7B, 4 of 16
# devices generating) put it at 1.7-1.8x, their synchronous runs at 1.75-3.3x.
GENERATION_TIME_FACTOR = 2.0
# Multi-turn rollouts (planner/multi_turn.py): the response budget's rule of thumb.
MIN_TURN_TOKENS = 256  # a model turn that reasons a little and writes a call or an answer
CHARS_PER_TOKEN = 4  # a tool result's characters per token (English text and code)
TOOL_MESSAGE_TOKENS = 24  # the chat template around a result and the next turn's opening
CPU_WORKERS = 2  # the engine's CPU quickstart: two FSDP workers (gloo)
CPU_PARAMS_WARNING = 1.0e9
NODE_COUNTS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
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
    # The engine's typed config the recipe makes (engine.schema.EngineConfig), and the keys
    # in it the person set: the plan keeps those values (settings.py lists which it reads).
    config: Any = None
    pinned: frozenset[str] = frozenset()
    target_step_minutes: float = 30.0  # auto sizing: add devices until a step takes ≤ this

    def __post_init__(self) -> None:
        if self.pinned and self.config is None:
            raise ValueError("PlanRequest: pinned keys need the config that holds their values")


@dataclass(frozen=True)
class MemoryEstimate:
    """Per device, GiB. Training and rollout alternate on the same devices (colocated), or
    each peaks on its own group's devices (the rollout on devices of its own: nothing of
    the training stays resident where it generates)."""

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
    # The reward model on each training device (weights; a judge's KV cache and engine):
    # held through training and generation (in rollout_resident_gib too), or, for a vLLM
    # judge that sleeps, only while it judges, beside the resident training state.
    reward_model_gib: float = 0.0
    reward_model_held: bool = True

    @property
    def train_peak_gib(self) -> float:
        held = self.train_weights_gib + self.train_grads_gib + self.train_optimizer_gib
        held += self.reward_model_gib if self.reward_model_held else 0.0
        compute = held + self.train_gathered_gib + self.train_activations_gib
        return round(max(compute, held + self.train_step_extra_gib), 3)

    @property
    def judge_peak_gib(self) -> float:
        """A sleeping judge's phase: the resident training state and the judge."""
        if self.reward_model_held:
            return 0.0
        return round(self.rollout_resident_gib + self.reward_model_gib, 3)

    @property
    def rollout_peak_gib(self) -> float:
        engine = max(self.rollout_pool_gib, self.rollout_weights_gib + self.rollout_kv_cache_gib)
        return round(self.rollout_resident_gib + engine, 3)

    @property
    def peak_gib(self) -> float:
        return max(self.train_peak_gib, self.rollout_peak_gib, self.judge_peak_gib)

    def fits(self) -> bool:
        return self.budget_gib is None or self.peak_gib <= self.budget_gib + 0.01

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["train_peak_gib"] = self.train_peak_gib
        out["rollout_peak_gib"] = self.rollout_peak_gib
        out["judge_peak_gib"] = self.judge_peak_gib
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryEstimate:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def job_nodes(
    train_nodes: int, train_per_node: int, rollout_nodes: int, rollout_per_node: int, node_size: int
) -> tuple[int, int]:
    """(nodes, devices per node) a job with the rollout on devices of its own asks for.
    The two groups share nodes when their per-node counts fit one node of ``node_size``
    (then max of their node counts), else they take nodes of their own (the sum); the
    request per node is what the busiest node holds (verl's rule for its
    one-step-off trainer, whose resource pools are placed the same way)."""
    if train_per_node + rollout_per_node <= node_size:
        return max(train_nodes, rollout_nodes), train_per_node + rollout_per_node
    return train_nodes + rollout_nodes, max(train_per_node, rollout_per_node)


@dataclass(frozen=True)
class RolloutSplit:
    """The rollout on devices of its own (``rollout.placement=separate``): how many
    devices train and how many generate, and the estimates the split was chosen by."""

    mode: str  # async_training.mode: sync | one_step_off | fully_async
    train_nodes: int
    train_devices_per_node: int
    rollout_nodes: int
    rollout_devices_per_node: int
    node_size: int  # devices a node has: the groups share nodes when both fit one
    generate_seconds: float | None = None  # estimated, every response at full length
    train_seconds: float | None = None

    @property
    def train_devices(self) -> int:
        return self.train_nodes * self.train_devices_per_node

    @property
    def rollout_devices(self) -> int:
        return self.rollout_nodes * self.rollout_devices_per_node

    @property
    def shares_nodes(self) -> bool:
        return self.train_devices_per_node + self.rollout_devices_per_node <= self.node_size

    def job(self) -> tuple[int, int]:
        """(nodes, devices per node) the job asks for."""
        return job_nodes(
            self.train_nodes,
            self.train_devices_per_node,
            self.rollout_nodes,
            self.rollout_devices_per_node,
            self.node_size,
        )

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutSplit:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class RewardPool:
    """The reward model on devices of its own (``reward_model.enable_resource_pool``):
    its devices, and the training (and rollout) layout the job holds beside them."""

    nodes: int
    devices_per_node: int
    train_nodes: int  # the plan's layout before the reward model's devices were added
    train_devices_per_node: int

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class TeacherPool:
    """On-policy distillation's teachers on devices of their own (``distillation.nnodes``):
    their devices, and the layout the job held before them (planner/teacher_pool.py)."""

    nodes: int
    devices_per_node: int
    train_nodes: int
    train_devices_per_node: int

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Plan:
    # The job's layout: every node it asks for and the devices on each (with the rollout
    # on devices of its own, both groups: ``split`` has each group's share).
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
    train_sp: int = 1  # fsdp: Ulysses size (each micro-batch split over SP ranks)
    log_prob_micro_batch_size_per_device: int = 1
    hf_rollout_micro_batch_size: int | None = None  # hf rollout: sequences per generate call
    estimated_step_seconds: float | None = None
    split: RolloutSplit | None = None  # None: the rollout shares the actor's devices
    reward_pool: RewardPool | None = None  # None: the reward model (if any) shares them too
    teacher_pool: TeacherPool | None = None  # None: no distillation, or teachers beside the actor

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    def engine_overrides(self) -> dict[str, Any]:
        """The dotted engine keys this plan sets (``engine.config`` names them all)."""
        arr = "actor_rollout_ref"
        fsdp = self.train_backend in ("fsdp", "fsdp2")
        cpu = self.accelerator is None
        # the training's own layout: from before the first pool was added beside it
        split, pool = self.split, self.reward_pool or self.teacher_pool
        nodes, per_node = (
            (pool.train_nodes, pool.train_devices_per_node)
            if pool
            else (self.nodes, self.devices_per_node)
        )
        out: dict[str, Any] = {
            "trainer.nnodes": split.train_nodes if split else nodes,
            "trainer.n_gpus_per_node": split.train_devices_per_node if split else per_node,
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
        if split is not None:
            out[f"{arr}.rollout.placement"] = "separate"
            out[f"{arr}.rollout.separate_nnodes"] = split.rollout_nodes
            out[f"{arr}.rollout.separate_n_gpus_per_node"] = split.rollout_devices_per_node
            out["async_training.mode"] = split.mode
        if fsdp:
            out[f"{arr}.actor.fsdp_config.param_offload"] = self.param_offload
            out[f"{arr}.actor.fsdp_config.optimizer_offload"] = self.optimizer_offload
            if self.train_sp > 1:  # the reference's null follows the actor's
                out[f"{arr}.actor.ulysses_sequence_parallel_size"] = self.train_sp
                out[f"{arr}.model.use_remove_padding"] = True  # Ulysses splits packed rows
                if self.use_critic:
                    out["critic.ulysses_sequence_parallel_size"] = self.train_sp
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
            if f.name in ("split", "reward_pool", "teacher_pool") and value is None:
                continue  # colocated plans read as they did before the split existed
            if f.name in ("memory", "model", "split", "reward_pool", "teacher_pool"):
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
        # a plan saved before a field existed (vision_params) reads its default
        values["model"] = ModelShape(
            **{k: model[k] for k in ModelShape.__dataclass_fields__ if k in model}
        )
        values["reasoning"] = list(data["reasoning"])
        if data.get("split") is not None:
            values["split"] = RolloutSplit.from_json(data["split"])
        if data.get("reward_pool") is not None:
            values["reward_pool"] = RewardPool(**data["reward_pool"])
        if data.get("teacher_pool") is not None:
            values["teacher_pool"] = TeacherPool(**data["teacher_pool"])
        return cls(**values)
