"""Sizing a supervised fine-tuning run (a recipe's ``algorithm: sft``, ``python -m
engine.sft``): training alone, no rollout, no reference, no critic. The memory of a
device is the RL planner's training terms (``planner.memory``: FSDP2's sharded fp32
state and gathered layers, or Megatron's split one, and one micro-batch's activations
and logits), for micro-batches of ``data.max_token_len_per_gpu`` tokens (dynamic batch
sizes, verl's SFT default) or ``micro_batch_size_per_gpu × max_length``.

The layout is the recipe's nodes when it gives them, else the fewest nodes of the
accelerator on which the run fits; offload (FSDP2's parameters, then its optimizer
state) is added only when nothing fits without it, unless the recipe pins it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlctl.hardware import get_accelerator
from rlctl.models import ModelShape, model_shape
from rlctl.planner.explain import model_line
from rlctl.planner.memory import (
    TrainCfg,
    budget_bytes,
    fsdp_state,
    lora_params,
    megatron_state,
    train_activations,
)
from rlctl.planner.model import GIB, MAX_NODES, InfeasiblePlanError, MemoryEstimate, Plan

OFFLOADS = ((False, False), (False, True), (True, True))  # (params, optimizer), least first


@dataclass(frozen=True)
class SFTRequest:
    """What sizing an SFT recipe needs: the model, the hardware (nodes None: the planner
    picks), the typed SFT config the recipe's keys make and which of them it pinned."""

    model: str
    accelerator: str | None  # None: CPU workers
    devices_per_node: int
    nodes: int | None
    config: Any  # engine.schema.SFTConfig
    pinned: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SFTPlan(Plan):
    """A ``Plan`` of an SFT run: its keys are engine.sft's."""

    def engine_overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "trainer.nnodes": self.nodes,
            "trainer.n_gpus_per_node": self.devices_per_node,
            "trainer.device": (
                "cpu"
                if self.accelerator is None
                else get_accelerator(self.accelerator).torch_device
            ),
            "model.enable_gradient_checkpointing": self.gradient_checkpointing,
        }
        if self.train_backend != "megatron":
            out["engine.param_offload"] = self.param_offload
            out["engine.optimizer_offload"] = self.optimizer_offload
        return out


def plan_sft(req: SFTRequest) -> SFTPlan:
    """Size the run; ``InfeasiblePlanError`` with the reason and what would fit."""
    cfg = req.config
    m = model_shape(req.model)
    backend = "megatron" if cfg.megatron else "fsdp2"
    if req.accelerator is None:
        if backend == "megatron":
            raise InfeasiblePlanError(
                "engine=megatron needs GPUs; the CPU path trains with FSDP2 over gloo",
                hint="set trainer: fsdp2, or give an accelerator",
            )
        nodes = req.nodes or 1
        lines = [model_line(m), f"CPU: {nodes} node(s) × {req.devices_per_node} worker(s)"]
        return _plan(req, m, backend, nodes, (False, False), MemoryEstimate(None, None), lines)
    acc = get_accelerator(req.accelerator)
    budget = budget_bytes(acc)
    tokens, seq = _micro_batch_tokens(cfg)
    offloads = _offloads(req, backend)
    tried: list[str] = []
    for nodes in [req.nodes] if req.nodes else range(1, MAX_NODES + 1):
        devices = nodes * req.devices_per_node
        for offload in offloads:
            memory = _memory(m, cfg, backend, devices, offload, tokens, seq)
            peak = memory.train_peak_gib * GIB
            where = f"{nodes} node(s) × {req.devices_per_node} {acc.name}"
            if peak <= budget:
                lines = [
                    model_line(m),
                    f"{where}: {memory.train_peak_gib:.1f} GiB a device at the peak of a"
                    f" step (of {budget / GIB:.1f} usable), micro-batches of {tokens} tokens"
                    + _offload_words(offload),
                    *(f"tried first: {t}" for t in tried[-2:]),
                ]
                return _plan(req, m, backend, nodes, offload, memory, lines)
            tried.append(f"{where}{_offload_words(offload)}: {memory.train_peak_gib:.1f} GiB")
    raise InfeasiblePlanError(
        f"{m.name} does not fit for SFT on {tried[-1] if tried else req.accelerator}"
        f" (usable {budget / GIB:.1f} GiB a device)",
        hint="train a LoRA adapter (lora: {rank: 32}), shorten data.max_token_len_per_gpu,"
        " use engine=megatron with tensor parallelism, or more nodes",
    )


def _micro_batch_tokens(cfg: Any) -> tuple[int, int]:
    """(tokens in one micro-batch of the ranks that share it, the longest sequence)."""
    d = cfg.data
    seq = d.max_length
    if d.use_dynamic_bsz:
        return max(d.max_token_len_per_gpu * cfg.sequence_split, seq), seq
    return d.micro_batch_size_per_gpu * seq, seq


def _offloads(req: SFTRequest, backend: str) -> tuple[tuple[bool, bool], ...]:
    if backend == "megatron":
        return ((False, False),)  # the engine keeps Megatron's state on the device
    e = req.config.engine
    pinned = {"engine.param_offload", "engine.optimizer_offload"} & req.pinned
    if pinned:
        return ((e.param_offload or e.offload_policy, e.optimizer_offload),)
    return OFFLOADS


def _memory(
    m: ModelShape,
    cfg: Any,
    backend: str,
    devices: int,
    offload: tuple[bool, bool],
    tokens: int,
    seq: int,
) -> MemoryEstimate:
    e = cfg.engine
    grad_ckpt = cfg.model.enable_gradient_checkpointing
    c = TrainCfg(
        backend,
        devices,
        offload[0],
        offload[1],
        grad_ckpt,
        tp=e.tensor_model_parallel_size if backend == "megatron" else 1,
        pp=e.pipeline_model_parallel_size if backend == "megatron" else 1,
        ep=e.expert_model_parallel_size if backend == "megatron" else 1,
        etp=e.expert_tensor_parallel_size if backend == "megatron" else None,
        cp=e.context_parallel_size if backend == "megatron" else 1,
        sp=1 if backend == "megatron" else e.ulysses_sequence_parallel_size,
    )
    model = cfg.model
    adapter = lora_params(m, model.lora_rank, _targets(model.target_modules))
    if backend == "megatron":
        state = megatron_state(m, c, critic=False, reference=False)
    else:
        state = fsdp_state(m, c, critic=False, reference=False, adapter=adapter)
    act = train_activations(m, c, tokens, seq)
    return MemoryEstimate(
        device_gib=None,  # the accelerator's, filled in by _plan
        budget_gib=None,
        train_weights_gib=state.weights / GIB,
        train_grads_gib=state.grads / GIB,
        train_optimizer_gib=state.optimizer / GIB,
        train_gathered_gib=state.gathered / GIB,
        train_activations_gib=act.total / GIB,
        train_logits_gib=act.logits / GIB,
        train_mask_gib=act.mask / GIB,
        train_step_extra_gib=state.step_extra / GIB,
        host_gib_per_node=state.host / GIB,
    )


def _targets(value: Any) -> str | tuple[str, ...]:
    return value if isinstance(value, str) else tuple(value)


def _offload_words(offload: tuple[bool, bool]) -> str:
    params, optimizer = offload
    if params:
        return ", parameters and optimizer state offloaded to host memory"
    return ", optimizer state offloaded to host memory" if optimizer else ""


def _plan(
    req: SFTRequest,
    m: ModelShape,
    backend: str,
    nodes: int,
    offload: tuple[bool, bool],
    memory: MemoryEstimate,
    lines: list[str],
) -> SFTPlan:
    from dataclasses import replace

    cfg = req.config
    d, e = cfg.data, cfg.engine
    if req.accelerator is not None:
        acc = get_accelerator(req.accelerator)
        usable = budget_bytes(acc) / GIB
        memory = replace(memory, device_gib=acc.memory_gib, budget_gib=round(usable, 3))
        memory = replace(
            memory,
            **{
                f: round(getattr(memory, f), 3)
                for f in (
                    "train_weights_gib",
                    "train_grads_gib",
                    "train_optimizer_gib",
                    "train_gathered_gib",
                    "train_activations_gib",
                    "train_logits_gib",
                    "train_mask_gib",
                    "train_step_extra_gib",
                    "host_gib_per_node",
                )
            },
        )
    megatron = backend == "megatron"
    return SFTPlan(
        nodes=nodes,
        devices_per_node=req.devices_per_node,
        accelerator=req.accelerator,
        rollout_tp=1,
        train_backend=backend,
        train_tp=e.tensor_model_parallel_size if megatron else 1,
        train_pp=e.pipeline_model_parallel_size if megatron else 1,
        ppo_mini_batch_size=d.train_batch_size,
        micro_batch_size_per_device=d.micro_batch_size_per_gpu,
        use_dynamic_bsz=d.use_dynamic_bsz,
        max_token_len_per_device=d.max_token_len_per_gpu,
        param_offload=offload[0],
        optimizer_offload=offload[1],
        gradient_checkpointing=cfg.model.enable_gradient_checkpointing,
        rollout_memory_fraction=0.0,
        image=None,
        memory=memory,
        model=m,
        reasoning=lines,
        rollout_backend="hf",
        train_batch_size=d.train_batch_size,
        rollout_n=1,
        max_prompt_length=0,
        max_response_length=d.max_length,
        train_cp=e.context_parallel_size if megatron else 1,
        train_sp=1 if megatron else e.ulysses_sequence_parallel_size,
    )
