"""The Megatron-core training backend: a ``GPTModel`` built from a Hugging Face config,
tensor (with sequence), pipeline, context, expert and data parallel, for the actor, the
critic and the reference.

The interface (``engine.train.fsdp.FSDPEngine`` has the same methods; the actor, critic
and reference workers get either from ``engine.train.engines``)::

    engine = MegatronEngine.from_hf(model_path, parallel, optim_cfg, device, role="actor")
    engine.eval()
    with torch.no_grad():
        logp_BR, _ = engine.response_logprobs(tokens, temperature)   # critic: response_values
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
  ``megatron_config`` (Llama, Mistral, Qwen2, Qwen3, their MoE; DeepSeek-V3 through
  ``MLATransformerConfig``). The layer spec is Megatron-core's local one (its own
  parallel linears) with the core attention replaced by ``SDPAttention``
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
- **Gradients.** Megatron's ``DistributedDataParallel`` (contiguous fp32 gradient
  buffers, averaged over the data-parallel group at ``optimizer_step``), then
  ``finalize_model_grads`` (Qwen3's q/k norm gradients summed over TP ranks).
- **Optimizer.** On GPUs Megatron's own (``get_megatron_optimizer``: the
  ``DistributedOptimizer`` when ``use_distributed_optimizer``, fp32 master weights for
  bf16). On CPU — *a fallback, not Megatron's optimizer* — ``torch.optim.AdamW`` over the
  Megatron parameters, fed from the DDP buffers, with the global norm computed over TP
  slices and pipeline stages: Megatron-core 0.13/0.14's optimizers allocate CUDA tensors
  in their constructors (``torch.tensor(..., device='cuda')`` in
  ``FP32Optimizer``/``MixedPrecisionOptimizer``, and the gradient-norm code), so they
  cannot be built on a CPU-only torch. Both decay
  every parameter (``no_weight_decay_cond`` returns False), as ``fsdp.build_optimizer``
  does, so that the two backends train alike. The learning rate follows
  ``fsdp.lr_multiplier`` (warmup, then constant or cosine).
- **Checkpoints.** One file per rank (``rank_<r>.pt``, written atomically: its TP slices
  named by their place in the whole model, the optimizer state, the schedule step, the
  caller's extras), ``meta.json`` (the layout; written last by rank 0, so it marks a
  complete checkpoint) and ``hf/`` (config and tokenizer). Loading needs the same
  parallel layout; ``hf_state_dict_from_checkpoint`` turns any of them back into a
  Hugging Face state dict without Megatron.
- **Sequence parallelism** (with TP > 1): Megatron's parallel linears split and gather
  the sequence; the norms are ``TorchRMSNorm`` (the local spec's wrapper refuses it),
  sequences are padded to a multiple of TP, and the critic's head gathers first.
- **Context parallelism** (``megatron_context``): each rank runs its zigzag share of every
  sequence; ``SDPAttention`` gathers the whole sequence's keys and values over the CP
  group; per-position results are gathered into sequence order before the response
  window is cut; gradients are scaled by DP × CP, the group DDP averages over.

- **Mixture of experts** (Qwen2-MoE, Qwen3-MoE): Megatron's ``MoELayer`` in the sparse
  layers, routed as Hugging Face routes (``megatron_config._moe_kwargs``), experts run
  one after another (``SequentialMLP``), sliced over TP like the dense MLP and spread over
  expert-parallel ranks (E/EP each; their names and checkpoints number experts in the
  whole model). Tokens meet in the experts through the all-gather exchange on CPU (each
  TP × EP group's micro-batches padded to one shape: ``_expert_group_shape``) and the
  all-to-all one on GPUs. Expert gradients are averaged by Megatron's DDP over the ranks
  holding the same experts; the CPU gradient norm sums them over TP × EP × PP.

Not supported yet: virtual (interleaved) pipeline stages. Gradient checkpointing
(Megatron's full recompute) applies on GPUs only: its RNG bookkeeping calls
``torch.cuda.get_rng_state``. Costs on GPUs, against Transformer Engine's spec: unfused
norms and linears, a (B, 1, S/CP, S) boolean mask per forward, experts run one after
another (no grouped GEMM), and the LM head run over every position (GPTModel has no
``logits_to_keep``).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from engine.algo.aggregate import LossScale
from engine.algo.entropy import entropy_from_logits, logprobs_from_logits
from engine.config import OptimConfig
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.train import fsdp, megatron_context
from engine.train.forward import trim_padding
from engine.train.megatron_convert import (
    is_expert,
    merge_from_tp,
    shift_expert,
)
from engine.train.megatron_model import (
    _LAYOUT_DEFAULTS,
    _build_gpt,
    _full_shape,
    _is_tp_split,
    _load_hf_weights,
    _local_experts,
    _stage,
    _to_hf_pairs,
    _weights,
    _wrap_ddp,
    hf_state_dict_from_checkpoint,
    load_hf_state_dict,
)
from engine.train.megatron_modules import SDPAttention
from engine.train.megatron_ops import (
    _atomic_save,
    _pad_responses,
    attention_mask_B1SS,
    check_consecutive_positions,
    vocab_parallel_logprobs_entropy,
)
from engine.train.megatron_parallel import CONFIG_KEYS, MegatronParallel
from engine.train.megatron_pipeline import Stage, StageLink, one_f_one_b, shift_layer
from engine.train.megatron_setup import _init_parallel_state, require_megatron_core
from engine.types import TokenBatch

ROLES = ("actor", "critic", "reference")
CHECKPOINT_FORMAT = 1


# ---------------------------------------------------------------------------
# the engine


@dataclass(frozen=True)
class _Layout:
    world_size: int
    rank: int
    tp: int
    tp_rank: int
    dp: int
    dp_rank: int
    pp: int = 1
    pp_rank: int = 0
    cp: int = 1
    cp_rank: int = 0
    ep: int = 1
    ep_rank: int = 0
    edp_rank: int = 0  # expert data parallel: ranks holding the same experts


class MegatronEngine:
    """One role's Megatron-core model, optimizer and schedule on this rank."""

    def __init__(
        self,
        model: nn.Module,
        ddp: nn.Module | None,
        hf_config: Any,
        parallel: MegatronParallel,
        optim_cfg: OptimConfig | None,
        device: DeviceSpec,
        role: str,
        total_steps: int,
        stage: Stage,
    ) -> None:
        from megatron.core import parallel_state as ps

        self.model = model  # the GPTModel (names as megatron_convert expects)
        self.ddp = ddp  # its DDP wrapper (None: forward only)
        self.hf_config = hf_config
        self.parallel = parallel
        self.optim_cfg = optim_cfg
        self.device = device
        self.role = role
        self.total_steps = max(1, total_steps)
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.dp_group = ps.get_data_parallel_group()
        self.model_parallel_group = ps.get_model_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.layout = _Layout(
            world_size=dist.get_world_size(),
            rank=dist.get_rank(),
            tp=ps.get_tensor_model_parallel_world_size(),
            tp_rank=ps.get_tensor_model_parallel_rank(),
            dp=ps.get_data_parallel_world_size(),
            dp_rank=ps.get_data_parallel_rank(),
            pp=ps.get_pipeline_model_parallel_world_size(),
            pp_rank=ps.get_pipeline_model_parallel_rank(),
            cp=ps.get_context_parallel_world_size(),
            cp_rank=ps.get_context_parallel_rank(),
            ep=ps.get_expert_model_parallel_world_size(),
            ep_rank=ps.get_expert_model_parallel_rank(),
            edp_rank=ps.get_expert_data_parallel_rank(),
        )
        self.cp_group = ps.get_context_parallel_group()
        self.ep_group = ps.get_expert_model_parallel_group()
        # The ranks whose tokens meet in the experts (Megatron's TP × EP group).
        self.tp_ep_group = ps.get_expert_tensor_and_model_parallel_group()
        # Each routed expert's TP slice once: what the gradient norm sums over for them.
        self.expert_norm_group = ps.get_expert_tensor_model_pipeline_parallel_group()
        self.experts = _local_experts(hf_config)  # global numbers of this rank's experts
        self.stage = stage
        self.link = StageLink()
        # (stage input, stage output) of each micro-batch whose backward is still to come:
        # the input's gradient goes to the previous stage, the output's comes from the next.
        self._in_flight: deque[tuple[torch.Tensor | None, torch.Tensor]] = deque()
        self._scheduling = False  # inside forward_backward with pipeline stages
        self.lr_step = 0  # schedule steps taken
        self.optimizer: Any = None
        # Megatron's optimizer on accelerators; on CPU torch's AdamW (see the module doc).
        self.uses_megatron_optimizer = device.type != "cpu"
        if ddp is not None and optim_cfg is not None:
            self.optimizer = self._build_optimizer(optim_cfg)
            self._apply_lr()

    # -- construction ---------------------------------------------------------

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
    ) -> MegatronEngine:
        """Build from a Hugging Face folder (or ``hf_config`` + ``state_dict``) on this
        rank's share. ``optim_cfg=None`` builds a forward-only engine (the reference)."""
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
        _init_parallel_state(parallel, device, seed)
        torch_dtype = torch.bfloat16 if dtype == "bfloat16" and device.supports_bf16 else None
        if dtype == "float16" and device.supports_bf16:
            raise EngineError("the Megatron engine trains in bfloat16 or float32, not float16")
        stage = _stage(hf_config)
        model = _build_gpt(
            hf_config,
            parallel,
            stage,
            device,
            torch_dtype or torch.float32,
            role,
            gradient_checkpointing and device.type != "cpu",
        )
        if state_dict is None:
            state_dict = load_hf_state_dict(model_path)
        _load_hf_weights(model, state_dict, hf_config, stage, role, seed)
        del state_dict
        ddp = None
        if optim_cfg is not None:
            ddp = _wrap_ddp(model, parallel, device)
        else:
            model.requires_grad_(False)
        return cls(model, ddp, hf_config, parallel, optim_cfg, device, role, total_steps, stage)

    def _build_optimizer(self, cfg: OptimConfig) -> Any:
        if not self.uses_megatron_optimizer:
            return fsdp.build_optimizer(self.model, cfg)
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        bf16 = self.model.config.bf16
        config = OptimizerConfig(
            optimizer="adam",
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            adam_beta1=cfg.betas[0],
            adam_beta2=cfg.betas[1],
            adam_eps=1e-8,  # torch AdamW's, as the FSDP backend uses
            bf16=bf16,
            params_dtype=torch.bfloat16 if bf16 else torch.float32,
            use_distributed_optimizer=self.parallel.use_distributed_optimizer,
        )
        # Decay every parameter. Megatron-core 0.14 takes ``no_weight_decay_cond``; 0.16
        # removed it for ``config_overrides``, whose default (None) skips biases and 1-D
        # parameters, and whose empty dict means no overrides: one decay for all.
        if "config_overrides" in inspect.signature(get_megatron_optimizer).parameters:
            return get_megatron_optimizer(config, [self.ddp], config_overrides={})
        return get_megatron_optimizer(
            config, [self.ddp], no_weight_decay_cond=lambda name, param: False
        )

    # -- properties -------------------------------------------------------------

    @property
    def dp_size(self) -> int:
        return self.layout.dp

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0

    @property
    def module(self) -> nn.Module:
        """What runs forward: the DDP wrapper, or the bare model when forward-only."""
        return self.ddp if self.ddp is not None else self.model

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()

    # -- forward ----------------------------------------------------------------

    def _forward(
        self, input_ids_BS, attention_mask_BS, position_ids_BS
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stage's output and, under context parallelism, the positions it covers.

        On the last stage the output is the model's, batch first ((B, S, V/tp) logits, or
        (B, S, 1) values); on earlier stages the (S, B, H) hidden states, also sent to the
        next stage. Stages after the first take their input from the previous one.
        Inside ``forward_backward`` the (input, output) pair is kept for the micro-batch's
        backward. Under sequence parallelism the sequence is padded on the right to a
        multiple of the TP size (masked keys; the output is cut back) and what travels
        between stages is each rank's slice of it. Under context parallelism (padded to a
        multiple of 2·CP) each rank runs its zigzag share of the positions
        (``megatron_context``), returned with the output for ``_whole_sequence``."""
        device = self.device.torch_device()
        ids = input_ids_BS.to(device)
        mask = attention_mask_BS.to(device)
        check_consecutive_positions(position_ids_BS.to(device), mask)
        b, s = ids.shape
        rows, columns = self._expert_group_shape(b, s)
        if (rows, columns) != (b, s):  # padding rows: masked, attending only to themselves
            ids = F.pad(ids, (0, columns - s, 0, rows - b))
            mask = F.pad(mask, (0, columns - s, 0, rows - b))
        sp = self.model.config.sequence_parallel
        cp = self.layout.cp
        multiple = (self.layout.tp if sp else 1) * (2 * cp if cp > 1 else 1)
        if columns % multiple:
            ids = F.pad(ids, (0, -columns % multiple))
            mask = F.pad(mask, (0, -columns % multiple))
        b, padded = ids.shape
        held = None
        if cp > 1:  # this rank's queries (rows of the mask) against every key
            held = megatron_context.zigzag_index(padded, cp, self.layout.cp_rank, device)
            ids = ids[:, held]
        mask_B1SS = attention_mask_B1SS(mask, held)
        length = ids.shape[1]
        positions = torch.arange(padded, device=device)[:length].expand(b, length)
        stage_input = None
        if not self.stage.first:
            shape = (length // self.layout.tp if sp else length, b, self.hf_config.hidden_size)
            dtype = self.model.config.params_dtype
            stage_input = self.link.recv(shape, dtype, device, self.stage.prev_rank)
            stage_input.requires_grad_(torch.is_grad_enabled())
            self.model.set_input_tensor(stage_input)
        out = self.module(input_ids=ids, position_ids=positions, attention_mask=mask_B1SS)
        if not self.stage.last:
            self.link.send(out, self.stage.next_rank)
        if self._scheduling and torch.is_grad_enabled():
            self._in_flight.append((stage_input, out))
        if self.stage.last:
            out = out[: input_ids_BS.shape[0]]
            if held is None and padded != s:
                out = out[:, :s]
        return out, held

    def _expert_group_shape(self, b: int, s: int) -> tuple[int, int]:
        """The (rows, columns) every rank whose tokens meet in the experts runs: with
        expert parallelism, Megatron's all-gather token exchange needs the same number
        of tokens from each of them, and they hold different data-parallel rows (their
        micro-batch counts already agree: ``forward.token_budget_micro_batches``)."""
        if self.layout.ep == 1 or self.model.config.moe_token_dispatcher_type != "allgather":
            return b, s
        shape = torch.tensor([b, s], device=self.device.torch_device())
        dist.all_reduce(shape, op=dist.ReduceOp.MAX, group=self.tp_ep_group)
        rows, columns = shape.tolist()
        return rows, columns

    def _whole_sequence(self, values_BL: torch.Tensor, held: torch.Tensor | None, s: int):
        """Per-position results (B, L) of this rank's positions as (B, s) in sequence
        order: gathered over the context-parallel group when there is one."""
        if held is None:
            return values_BL
        return megatron_context.gather(values_BL, 1, self.cp_group, sum_grads=False)[:, :s]

    def _stage_placeholder(self, tokens: TokenBatch) -> torch.Tensor:
        """What a stage before the last returns for per-token results it does not compute
        (they come from the last stage; the controller gathers them there)."""
        return torch.zeros(tokens.responses_BR.shape, device=self.device.torch_device())

    def logits(self, input_ids_BS, attention_mask_BS, position_ids_BS) -> torch.Tensor:
        """(B, S, V) logits over the whole vocabulary (gathered over TP ranks)."""
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        if self.role == "critic":
            raise EngineError("the critic has a value head, not logits: use response_values")
        out, held = self._forward(input_ids_BS, attention_mask_BS, position_ids_BS)
        if not self.stage.last:
            return None  # with pipeline stages, only the last one has logits
        out = gather_from_tensor_model_parallel_region(out) if self.layout.tp > 1 else out
        return self._whole_sequence(out, held, input_ids_BS.shape[1])

    def response_logprobs(
        self,
        tokens: TokenBatch,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As ``engine.train.forward.response_logprobs``: log π of each response token
        (logits divided by the sampling temperature) and optionally the entropy, whose
        graph is kept only with ``entropy_grad``. With TP > 1 the vocabulary stays split."""
        r_len = tokens.response_length
        trimmed = trim_padding(tokens)
        kept = trimmed.response_length
        ids = trimmed.input_ids_BS
        out, held = self._forward(ids, trimmed.attention_mask_BS, trimmed.position_ids_BS)
        if not self.stage.last:
            zeros = self._stage_placeholder(tokens)
            return zeros, zeros if with_entropy else None
        s = ids.shape[1]
        if held is None:  # the logits before each response token
            logits = out[:, -kept - 1 : -1, :]
            targets = trimmed.responses_BR
        else:  # every position this rank holds predicts the token after it
            logits = out
            padded = len(held) * self.layout.cp
            targets = F.pad(ids[:, 1:], (0, padded - s + 1))[:, held.cpu()]
        logits = logits.float()
        if temperature != 1.0:
            logits = logits / temperature
        targets = targets.to(logits.device)
        entropy = None
        if self.layout.tp == 1:
            logp = logprobs_from_logits(logits, targets)
            if with_entropy:
                with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                    entropy = entropy_from_logits(logits)
        else:
            logp, entropy = vocab_parallel_logprobs_entropy(
                logits, targets, with_entropy, entropy_grad
            )
        if held is not None:
            window = slice(s - kept - 1, s - 1)
            logp = self._whole_sequence(logp, held, s)[:, window]
            if entropy is not None:
                entropy = self._whole_sequence(entropy, held, s)[:, window]
        if entropy is not None:
            entropy = _pad_responses(entropy, r_len)
        return _pad_responses(logp, r_len), entropy

    def response_values(self, tokens: TokenBatch) -> torch.Tensor:
        """V(prefix) before each response token (the critic)."""
        if self.role != "critic":
            raise EngineError(f"response_values needs the critic's value head, not the {self.role}")
        r_len = tokens.response_length
        trimmed = trim_padding(tokens)
        kept = trimmed.response_length
        ids = trimmed.input_ids_BS
        out, held = self._forward(ids, trimmed.attention_mask_BS, trimmed.position_ids_BS)
        if not self.stage.last:
            return self._stage_placeholder(tokens)
        s = ids.shape[1]
        values = self._whole_sequence(out[..., 0].float(), held, s)
        return _pad_responses(values[:, s - kept - 1 : s - 1], r_len)

    # -- backward and update ------------------------------------------------------

    def global_loss_scale(self, mask_BR: torch.Tensor) -> LossScale:
        """The mini-batch's token and sequence counts summed over the data-parallel group
        (TP ranks hold the same rows, so they are not counted again)."""
        local = LossScale.of(mask_BR)
        counts = torch.tensor(
            [local.num_tokens, local.num_seqs],
            dtype=torch.float64,
            device=self.device.torch_device(),
        )
        dist.all_reduce(counts, group=self.dp_group)
        tokens, seqs = counts.tolist()
        return LossScale(num_tokens=tokens, num_seqs=seqs)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of ``loss``, this DP rank's part of a global sum.

        DDP averages gradients over the data- (and context-) parallel group; × dp × cp
        undoes that mean (context-parallel ranks hold parts of one sum).
        With pipeline stages this is the backward of the oldest micro-batch still in
        flight: the last stage starts from ``loss``, earlier stages (whose ``loss`` came
        from placeholders and is ignored) from the gradient the next stage sends; every
        stage but the first sends its input's gradient on."""
        if self.ddp is None:
            raise EngineError(f"the {self.role} engine was built without an optimizer")
        scale = self.layout.dp * self.layout.cp
        if self.stage.count == 1:
            (loss * scale).backward()
            return
        if not self._scheduling:
            raise EngineError("with pipeline stages, backward runs inside forward_backward")
        stage_input, out = self._in_flight.popleft()
        if self.stage.last:
            (loss * scale).backward()
        else:
            grad = self.link.recv(out.shape, out.dtype, out.device, self.stage.next_rank)
            torch.autograd.backward(out, grad)
        if stage_input is not None:
            self.link.send(stage_input.grad, self.stage.prev_rank)

    def forward_backward(
        self, micro_batches: Sequence[Any], step: Callable[[Any], torch.Tensor]
    ) -> None:
        """Gradients of ``step(micro)`` (the micro-batch's loss, computed from this
        engine's ``response_logprobs``/``response_values``) accumulated over all
        micro-batches. With pipeline stages, in 1F1B order (``megatron_pipeline``)."""
        if self.stage.count == 1:
            for micro in micro_batches:
                self.backward(step(micro))
            return
        losses: deque[torch.Tensor] = deque()
        self._scheduling = True
        try:
            with self.link.batched():
                for op, i in one_f_one_b(self.stage.index, self.stage.count, len(micro_batches)):
                    if op == "F":
                        losses.append(step(micro_batches[i]))
                    else:
                        self.backward(losses.popleft())
        finally:
            self._scheduling = False
            in_flight, self._in_flight = len(self._in_flight), deque()
        if in_flight:
            raise EngineError("forward_backward: each step must run exactly one forward")

    def updating(self) -> contextlib.AbstractContextManager:
        """Around an update (the FSDP engine brings offloaded optimizer state back here;
        optimizer offload is not implemented for Megatron)."""
        return contextlib.nullcontext()

    def optimizer_step(self, grad_clip: float) -> float:
        """Reduce gradients over DP (and q/k norms over TP), clip to ``grad_clip``, step.
        Returns the global norm before clipping; inf/NaN skips the update (and drops the
        gradients), as ``fsdp.optimizer_step`` does."""
        from megatron.core.distributed import finalize_model_grads

        if self.optimizer is None:
            raise EngineError(f"the {self.role} engine was built without an optimizer")
        finalize_model_grads([self.ddp])
        if self.uses_megatron_optimizer:
            self.optimizer.prepare_grads()
            grad_norm = float(self.optimizer.clip_grad_norm(grad_clip))
            if math.isfinite(grad_norm):
                self.optimizer.step_with_ready_grads()
        else:
            grad_norm = self._cpu_clip_and_step(grad_clip)
        self.zero_grad()
        return grad_norm

    def _cpu_clip_and_step(self, grad_clip: float) -> float:
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            p.grad = p.main_grad  # the DDP buffer's view, reduced over DP
        # Replicated parameters (norms, the value head) count once over the TP group; the
        # last stage's copy of tied embeddings (``shared``) is the first stage's. Routed
        # experts under expert parallelism (``allreduce`` False: not replicated over DP)
        # are summed over the ranks holding them, Megatron's TP × EP × PP.
        squares = torch.zeros((), dtype=torch.float64)
        expert_squares = torch.zeros((), dtype=torch.float64)
        for p in params:
            if not getattr(p, "allreduce", True):
                expert_squares += p.grad.double().pow(2).sum()
            elif param_is_not_tensor_parallel_duplicate(p) and not getattr(p, "shared", False):
                squares += p.grad.double().pow(2).sum()
        dist.all_reduce(squares, group=self.model_parallel_group)
        if self.layout.ep > 1:
            dist.all_reduce(expert_squares, group=self.expert_norm_group)
        grad_norm = float((squares + expert_squares).sqrt())
        if math.isfinite(grad_norm):
            coef = grad_clip / (grad_norm + 1e-6)  # torch's clip_grad_norm_ formula
            if coef < 1.0:
                for p in params:
                    p.grad.mul_(coef)
            self.optimizer.step()
        for p in params:
            p.grad = None
        return grad_norm

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    def lr_scheduler_step(self) -> None:
        self.lr_step += 1
        self._apply_lr()

    def _apply_lr(self) -> None:
        lr = self.optim_cfg.lr * fsdp.lr_multiplier(self.lr_step, self.optim_cfg, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # -- weights out --------------------------------------------------------------

    def _stage_parameters(self, with_shared: bool = False) -> Iterator[tuple[str, nn.Parameter]]:
        """This stage's parameters by their global Megatron names (layers and routed
        experts numbered in the whole model); the last stage's copy of tied embeddings
        (``shared``) only when asked."""
        for name, param in _weights(self.model):
            if with_shared or not getattr(param, "shared", False):
                global_name = shift_layer(name, self.stage.layer_offset)
                yield shift_expert(global_name, self.experts.start), param

    def _gathered(self, name: str, param: torch.Tensor) -> torch.Tensor:
        """The full tensor of this rank's slice (the TP group takes part)."""
        tensor = param.detach()
        if self.layout.tp > 1 and _is_tp_split(name, self.role):
            slices = [torch.empty_like(tensor) for _ in range(self.layout.tp)]
            dist.all_gather(slices, tensor.contiguous(), group=self.tp_group)
            tensor = merge_from_tp(name, slices)
        return tensor

    def _expert_peers(self, name: str) -> list[str]:
        """The names of what one parameter and its counterparts on the other
        expert-parallel ranks hold: a routed expert's on each EP rank, else itself."""
        if self.layout.ep == 1 or not is_expert(name):
            return [name]
        n, mine = len(self.experts), self.layout.ep_rank
        return [shift_expert(name, (r - mine) * n) for r in range(self.layout.ep)]

    def _full_tensors_of(self, name: str, param: torch.Tensor) -> Iterator[torch.Tensor]:
        """The full tensors of ``_expert_peers(name)``: TP slices gathered, and a routed
        expert's gathered over the EP group (its ranks hold the same local experts)."""
        tensor = self._gathered(name, param)
        if len(peers := self._expert_peers(name)) == 1:
            yield tensor
            return
        parts = [torch.empty_like(tensor) for _ in peers]
        dist.all_gather(parts, tensor.contiguous(), group=self.ep_group)
        yield from parts

    def _full_megatron_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(global Megatron name, full tensor): TP slices and expert-parallel shares
        gathered, and with pipeline stages each stage's tensors broadcast to the others,
        stage by stage, one tensor at a time. Every rank takes part in the same order
        and gets every tensor."""
        if self.stage.count == 1:
            for name, param in self._stage_parameters():
                peers = self._expert_peers(name)
                yield from zip(peers, self._full_tensors_of(name, param), strict=True)
            return
        device = self.device.torch_device()
        tp = self.layout.tp
        for stage in range(self.stage.count):
            src = dist.get_global_rank(self.pp_group, stage)
            mine = list(self._stage_parameters()) if stage == self.stage.index else []
            shapes = ((n, _full_shape(n, p.shape, tp, self.role), p.dtype) for n, p in mine)
            specs = [[(peer, s, d) for n, s, d in shapes for peer in self._expert_peers(n)]]
            dist.broadcast_object_list(specs, src=src, group=self.pp_group)
            tensors = (t for n, p in mine for t in self._full_tensors_of(n, p))
            for name, shape, dtype in specs[0]:
                if mine:
                    tensor = next(tensors).contiguous()
                else:
                    tensor = torch.empty(shape, dtype=dtype, device=device)
                dist.broadcast(tensor, src=src, group=self.pp_group)
                yield name, tensor

    def hf_named_tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Any]]:
        """Full Hugging Face (name, tensor) pairs, one parameter at a time (collective: call
        on every rank). The critic's value head comes out as ``score.{weight,bias}``.
        Tensors not split over TP are views of the live parameters: copy what you keep."""
        pairs = self._full_megatron_tensors()
        for name, tensor in _to_hf_pairs(pairs, self.hf_config, self.role):
            yield name, tensor if dtype is None else tensor.to(dtype)

    # -- checkpoints ----------------------------------------------------------------

    def save(self, path: str | Path, extra: dict[str, Any] | None = None, tokenizer: Any = None):
        """Every rank writes ``rank_<r>.pt``; rank 0 writes ``hf/`` and, last, ``meta.json``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.layout.rank == 0:  # an older checkpoint here is incomplete until the end
            (path / "meta.json").unlink(missing_ok=True)
        layout = asdict(self.layout)
        state = {
            "format": CHECKPOINT_FORMAT,
            "layout": layout,
            "role": self.role,
            "model": {
                n: p.detach().cpu().clone() for n, p in self._stage_parameters(with_shared=True)
            },
            # Copies of another stage's tensors (tied embeddings): left out of exports.
            "shared": [
                n
                for n, p in self._stage_parameters(with_shared=True)
                if getattr(p, "shared", False)
            ],
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "lr_step": self.lr_step,
            "extra": extra or {},
        }
        _atomic_save(state, path / f"rank_{self.layout.rank}.pt")
        if self._distributed_optimizer:  # its state is sharded over DP: gathered to DP rank 0
            self.optimizer.save_parameter_state(str(path / self._dist_optim_file()))
        layouts: list[Any] = [None] * self.layout.world_size
        dist.all_gather_object(layouts, layout)
        if self.layout.rank == 0:
            hf = path / "hf"
            self.hf_config.save_pretrained(hf)
            if tokenizer is not None:
                tokenizer.save_pretrained(hf)
            meta = {"format": CHECKPOINT_FORMAT, "role": self.role, "ranks": layouts}
            tmp = path / ".meta.json.tmp"
            tmp.write_text(json.dumps(meta, indent=1))
            os.replace(tmp, path / "meta.json")
        dist.barrier()

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore weights, optimizer state and schedule in place; returns the extras."""
        path = Path(path)
        if not (path / "meta.json").exists():
            raise EngineError(f"{path} is not a complete Megatron checkpoint (no meta.json)")
        state = torch.load(path / f"rank_{self.layout.rank}.pt", weights_only=False)
        saved, now = {**_LAYOUT_DEFAULTS, **state["layout"]}, asdict(self.layout)
        if saved != now:
            raise EngineError(
                f"checkpoint {path} was written with layout {saved}; this run is {now}. Resume"
                " with the same parallel sizes and world size, or export it"
                " (hf_state_dict_from_checkpoint) and start from the Hugging Face weights"
            )
        with torch.no_grad():
            params = dict(self._stage_parameters(with_shared=True))
            if set(params) != set(state["model"]):
                raise EngineError(f"checkpoint {path} holds other parameters than this model")
            for name, tensor in state["model"].items():
                params[name].copy_(tensor)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            if self._distributed_optimizer:
                self.optimizer.load_parameter_state(str(path / self._dist_optim_file()))
            self.lr_step = state["lr_step"]
            self._apply_lr()
        dist.barrier()
        return state["extra"]

    @property
    def _distributed_optimizer(self) -> bool:
        return (
            self.optimizer is not None
            and self.uses_megatron_optimizer
            and self.parallel.use_distributed_optimizer
        )

    def _dist_optim_file(self) -> str:
        return f"dist_optimizer_tp{self.layout.tp_rank}.pt"


__all__ = [
    "MegatronEngine",
    "MegatronParallel",
    "SDPAttention",
    "attention_mask_B1SS",
    "check_consecutive_positions",
    "hf_state_dict_from_checkpoint",
]
