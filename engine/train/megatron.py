"""The Megatron-core training backend: a ``GPTModel`` built from a Hugging Face config,
tensor (with sequence), pipeline, context, expert and data parallel, for the actor, the
critic and the reference.

The interface (``engine.train.fsdp.FSDPEngine`` has the same methods; the actor, critic
and reference workers get either from ``engine.train.engines``)::

    engine = MegatronEngine.from_hf(model_path, parallel, optim_cfg, device, role="actor")
    engine.eval()
    with torch.no_grad():
        logp_BR, _ = engine.response_logprobs(tokens, temperature)   # critic: response_values
        logp_BR, sum_pi_sq_BR = engine.response_logprobs_sum_pi_squared(tokens, temperature)
    engine.train()
    scale = engine.global_loss_scale(mask_BR)       # normalisers over the data-parallel group
    def step(micro):                                # one micro-batch's loss: this rank's
        logp_BR, entropy_BR = engine.response_logprobs(micro, temperature, with_entropy=True)
        return loss                                 # part of the global sum
    engine.forward_backward(micro_batches, step)    # gradients accumulate (PP: 1F1B order)
    grad_norm = engine.optimizer_step(grad_clip)    # clip and step; skipped if not finite
    engine.lr_scheduler_step()                      # once per training step, as fsdp's
    with engine.updating(): ...                     # around an update (FSDP: optimizer offload)
    engine.lr, engine.dp_size                       # the learning rate; ranks holding other rows
    engine.hf_named_tensors(dtype)                  # full HF-named tensors: rollout sync, export
    engine.save(path, extra, tokenizer); extra = engine.load(path)
    hf_state_dict_from_checkpoint(path)             # offline: merge TP slices and stages

``MegatronEngine`` joins its parts, a module each: ``megatron_state`` (what they share:
the model, the configs, the parallel groups, this rank's ``RankLayout``),
``megatron_forward`` (logits, log-probs, values), ``megatron_update`` (backward in 1F1B
order, the optimizer step, the schedule), ``megatron_weights`` (full HF-named weights
out), ``megatron_checkpoint`` (save, load, offline export). The model comes from
``megatron_model`` (``GPTModel`` from ``megatron_config``'s arguments, HF weights in and
out by ``megatron_convert``'s names), its modules from ``megatron_modules``.

How it is built:

- **Parallel state.** ``megatron.core.parallel_state`` is initialised on the process group
  the host already joined (gloo on CPU, nccl/RCCL on GPUs), in Megatron's rank order:
  tensor-parallel groups of ``tp`` consecutive ranks, then context parallel, then data
  parallel, pipeline stages slowest (so stages span nodes and TP stays within one).
  Every Megatron role of a process shares it, so colocated roles must use the same sizes.
- **Pipeline stages** (``megatron_pipeline``). Each stage builds ``GPTModel`` with its
  share of the layers (``pre_process`` on the first: the embedding; ``post_process`` on
  the last: the final norm and the head; tied embeddings get Megatron's copy on the
  last stage, its gradient all-reduced with the first's). ``forward_backward`` runs
  the micro-batches in 1F1B order with activations and gradients sent between
  neighbouring stages; the loss and the per-token results (log-probs, values) exist on
  the last stage only: earlier stages return zeros of the same shape, and the
  controller gathers the last stage's (``engine.controller.dispatch.
  ModelParallelLayout``). Megatron-core's own schedules are not used: they allocate CUDA
  tensors even at one stage and want the loss as their callback.
- **Model.** ``TransformerConfig``/``GPTModel`` arguments come from
  ``megatron_config``, which asks the model's family (``engine.models.families``: Llama,
  Mistral, Qwen2, Qwen3, their MoE; DeepSeek-V3 through ``MLATransformerConfig``). The
  layer spec is Megatron-core's local one (its own parallel linears) with the core attention replaced by ``SDPAttention``
  (``torch.nn.functional.scaled_dot_product_attention`` with an explicit causal +
  padding mask: memory-efficient kernels on GPUs, and runs on CPU), torch's RMSNorm in
  the norm slots (``TorchRMSNorm``) and, for multi-latent attention, whole down
  projections (``DuplicatedLinear``). Transformer Engine is not used; modules
  Megatron does not place itself are moved to the device after the build. Megatron's
  rotary embedding takes positions 0..S-1 and ignores ``position_ids``; rotary attention
  depends only on position differences, so for rows whose tokens are consecutive
  (left-padded prompt, right-padded response) this equals HF's ``position_ids`` (checked
  per batch).
- **Weights.** The HF safetensors are read on every rank, converted to Megatron names
  and each rank keeps its pipeline stage's tensors, its TP slices of them. The critic
  replaces the LM head with ``ValueHead`` (one output with a bias, exported as HF's
  token-classification ``score``; new heads start from N(0, initializer_range), bias 0,
  as HF initialises them).
- **Gradients and optimizer** (``megatron_update``): Megatron's
  ``DistributedDataParallel`` and, on GPUs, its optimizer; on CPU a fallback AdamW fed
  from the DDP buffers. **Checkpoints** (``megatron_checkpoint``): a file per rank,
  ``meta.json`` last; the same layout to resume, or ``hf_state_dict_from_checkpoint``
  without Megatron.
- **Sequence parallelism** (with TP > 1): Megatron's parallel linears split and gather
  the sequence; the norms are ``TorchRMSNorm`` (the local spec's wrapper refuses it),
  sequences are padded to a multiple of TP, and the critic's head gathers first.
- **Context parallelism** (``megatron_context``): each rank runs its zigzag share of every
  sequence; ``SDPAttention`` gathers the whole sequence's keys and values over the CP
  group; per-position results are gathered into sequence order before the response
  window is cut; gradients are scaled by DP × CP, the group DDP averages over.
- **Mixture of experts** (Qwen2-MoE, Qwen3-MoE, DeepSeek-V3): Megatron's ``MoELayer`` in
  the sparse layers, routed as Hugging Face routes (the family's ``router``), experts run
  one after another (``SequentialMLP``), sliced over TP like the dense MLP and spread over
  expert-parallel ranks (E/EP each; their names and checkpoints number experts in the
  whole model). Tokens meet in the experts through the all-gather exchange on CPU (each
  TP × EP group's micro-batches padded to one shape: ``_expert_group_shape``) and the
  all-to-all one on GPUs. Expert gradients are averaged by Megatron's DDP over the ranks
  holding the same experts; the CPU gradient norm sums them over TP × EP × PP. MoE
  routing replay (``routing_replay=True``, the actor's R2/R3) goes through Megatron-core's
  ``RouterReplay`` in every router (``megatron_routing``).

Not supported yet: virtual (interleaved) pipeline stages. Gradient checkpointing
(Megatron's full recompute) applies on GPUs only: its RNG bookkeeping calls
``torch.cuda.get_rng_state``. Costs on GPUs, against Transformer Engine's spec: unfused
norms and linears, a (B, 1, S/CP, S) boolean mask per forward, experts run one after
another (no grouped GEMM), and the LM head run over every position (GPTModel has no
``logits_to_keep``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.config import OptimConfig
from engine.config.megatron_parallel import CONFIG_KEYS, MegatronParallel
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.train.megatron_checkpoint import MegatronCheckpoint, hf_state_dict_from_checkpoint
from engine.train.megatron_forward import MegatronForward
from engine.train.megatron_model import (
    build_gpt,
    load_hf_state_dict,
    load_hf_weights,
    local_stage,
    wrap_ddp,
)
from engine.train.megatron_modules import SDPAttention
from engine.train.megatron_ops import attention_mask_B1SS, check_consecutive_positions
from engine.train.megatron_setup import init_parallel_state, require_megatron_core
from engine.train.megatron_update import MegatronUpdate
from engine.train.megatron_weights import MegatronWeights

ROLES = ("actor", "critic", "reference")


class MegatronEngine(MegatronForward, MegatronUpdate, MegatronWeights, MegatronCheckpoint):
    """One role's Megatron-core model, optimizer and schedule on this rank: its state
    (``megatron_state.EngineState``) and its parts, each in the module of its name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As ``EngineState``; with a DDP wrapper and an optimizer config, the optimizer
        at the schedule's first learning rate."""
        super().__init__(*args, **kwargs)
        if self.ddp is not None and self.optim_cfg is not None:
            self.optimizer = self._build_optimizer(self.optim_cfg)
            self._apply_lr()

    @classmethod
    def from_hf(
        cls,
        model_path: str | Path | None,
        parallel: MegatronParallel,
        optim_cfg: OptimConfig | None,
        device: DeviceSpec,
        *,
        role: str = "actor",
        hf_config: Any = None,
        state_dict: dict[str, torch.Tensor] | None = None,
        dtype: str = "bfloat16",
        gradient_checkpointing: bool = False,
        total_steps: int = 1,
        seed: int = 0,
        trust_remote_code: bool = False,
        routing_replay: bool = False,
    ) -> MegatronEngine:
        """Build from a Hugging Face folder (or ``hf_config`` + ``state_dict``) on this
        rank's share. ``optim_cfg=None`` builds a forward-only engine (the reference).
        ``routing_replay``: the routers under MoE routing replay (megatron_routing)."""
        require_megatron_core()
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; valid: {', '.join(ROLES)}")
        if device.type not in ("cpu", "cuda"):
            raise EngineError(
                f"the Megatron engine runs on NVIDIA/AMD GPUs (cuda) or, for tests, the CPU;"
                f" not on {device.type!r}: use strategy=fsdp2 there"
            )
        if hf_config is None:
            from transformers import AutoConfig

            hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        if not dist.is_initialized():
            raise EngineError("the Megatron engine needs torch.distributed initialised first")
        parallel.validate(dist.get_world_size(), hf_config, CONFIG_KEYS[role])
        init_parallel_state(parallel, device, seed)
        torch_dtype = torch.bfloat16 if dtype == "bfloat16" and device.supports_bf16 else None
        if dtype == "float16" and device.supports_bf16:
            raise EngineError("the Megatron engine trains in bfloat16 or float32, not float16")
        stage = local_stage(hf_config)
        model = build_gpt(
            hf_config,
            parallel,
            stage,
            device,
            torch_dtype or torch.float32,
            role,
            gradient_checkpointing and device.type != "cpu",
            routing_replay,
        )
        if state_dict is None:
            state_dict = load_hf_state_dict(model_path)
        load_hf_weights(model, state_dict, hf_config, stage, role, seed)
        del state_dict
        ddp = None
        if optim_cfg is not None:
            ddp = wrap_ddp(model, parallel, device)
        else:
            model.requires_grad_(False)
        engine = cls(model, ddp, hf_config, parallel, optim_cfg, device, role, total_steps, stage)
        if routing_replay:
            from engine.train.megatron_routing import MegatronRouterTap
            from engine.train.routing_replay import RoutingReplay

            # a forward's tokens are split over TP (sequence parallel) and CP ranks, its
            # layers over the pipeline stages: a recording is completed over all three
            groups = [engine.tp_group, engine.cp_group, engine.pp_group]
            tap = MegatronRouterTap(model)
            engine.routing = RoutingReplay(
                tap, hf_config.num_hidden_layers, groups, device.torch_device()
            )
        return engine


__all__ = [
    "MegatronEngine",
    "MegatronParallel",
    "SDPAttention",
    "attention_mask_B1SS",
    "check_consecutive_positions",
    "hf_state_dict_from_checkpoint",
]
