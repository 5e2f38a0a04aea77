"""The FSDP2 training backend: shard a Hugging Face model, optimize it, run it.

Each decoder layer (the model's ``_no_split_modules`` classes) becomes its own
``fully_shard`` unit, then the root: parameters are gathered one layer at a time
in forward and backward. Gradients are reduce-scattered and averaged over the
data-parallel group; see ``engine.algo.aggregate`` for how losses undo that mean.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from engine.algo.aggregate import LossScale
from engine.config import FSDPConfig, ModelConfig, OptimConfig
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.train.fused_head import HeadOptions
from engine.train.logit_options import PLAIN, LogitOptions
from engine.train.routing_replay import NO_REPLAY
from engine.types import TokenBatch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_hf_model(model_cfg: ModelConfig, kind: str = "causal_lm") -> nn.Module:
    """The model in fp32 on CPU (FSDP casts for compute): ``causal_lm`` for the policy
    and reference (a vision-language model's image-text-to-text class, e.g.
    ``Qwen2_5_VLForConditionalGeneration``), ``value`` (a token-classification head
    with one output) for the critic; built from its config with ``override_config``
    applied (``engine.models.hf_config``)."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForTokenClassification,
    )

    from engine.models.hf_config import is_vision_language, load_hf_config, loading_kwargs

    path = model_cfg.path
    common = {
        "trust_remote_code": model_cfg.trust_remote_code,
        "dtype": torch.float32,
        **loading_kwargs(model_cfg),
    }
    if kind == "causal_lm":
        config = load_hf_config(model_cfg)
        auto = AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
        model = auto.from_pretrained(path, config=config, **common)
    elif kind == "value":
        config = load_hf_config(model_cfg, num_labels=1)
        from transformers.utils import logging as hf_logging

        # The value head is new by design: silence the "newly initialized" report.
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            model = AutoModelForTokenClassification.from_pretrained(path, config=config, **common)
        finally:
            hf_logging.set_verbosity(verbosity)
        # The token-classification head applies dropout (0.1 by default) in training:
        # noise in value regression, and the values of the update would not be those
        # the advantages were computed with. (transformers 5 ignores classifier_dropout=0.)
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    model.config.use_cache = False
    return model


def shard_model(
    model: nn.Module,
    fsdp_cfg: FSDPConfig,
    device: DeviceSpec,
    *,
    gradient_checkpointing: bool,
) -> nn.Module:
    if gradient_checkpointing:
        # transformers 5 renamed it (and its keyword); 4.x only has the old name.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable({"use_reentrant": False})
    kwargs: dict = {"reshard_after_forward": fsdp_cfg.reshard_after_forward}
    if device.supports_bf16:
        mp = fsdp_cfg.mixed_precision
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=DTYPES[mp.param_dtype], reduce_dtype=DTYPES[mp.reduce_dtype]
        )
    if fsdp_cfg.cpu_offload and device.type != "cpu":
        # Parameters, gradients and optimizer state live in host memory; FSDP moves
        # each unit to the device for its forward and backward. (On a CPU device
        # everything is in host memory already: there is nothing to offload.)
        kwargs["offload_policy"] = CPUOffloadPolicy()
    else:
        model.to(device.torch_device())
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise RuntimeError(
            f"{type(model).__name__} names no decoder layer class in _no_split_modules;"
            " cannot pick FSDP units"
        )
    # FSDP2 warns when a unit returns a view (an in-place op on it would skip the
    # backward hook). Model outputs here are only sliced, never modified in place.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


@contextlib.contextmanager
def full_parameters(model: nn.Module) -> Iterator[nn.Module]:
    """Gather every shard and keep it gathered, so that the model runs forward any
    number of times with no collective (ranks may generate different lengths)."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False)
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True)


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    # Frozen weights (LoRA's base model) get no moments: AdamW state only for what trains.
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.lr,
        betas=(cfg.betas[0], cfg.betas[1]),
        weight_decay=cfg.weight_decay,
        eps=cfg.eps,
    )


def lr_multiplier(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Linear warmup (from ``init_lr_ratio``), then constant or cosine decay to
    ``min_lr_ratio``.

    Warmup steps are ``lr_warmup_steps`` when >= 0, else ``lr_warmup_steps_ratio``
    of the total. ``step`` counts optimizer-schedule steps from 0.
    """
    warmup = (
        cfg.lr_warmup_steps
        if cfg.lr_warmup_steps >= 0
        else int(cfg.lr_warmup_steps_ratio * total_steps)
    )
    if warmup > 0 and step < warmup:
        return cfg.init_lr_ratio + (1.0 - cfg.init_lr_ratio) * (step + 1) / warmup
    if cfg.lr_scheduler_type == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total_steps - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * cfg.num_cycles * min(progress, 1.0)))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, cfg, total_steps)
    )


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm; returns the norm before clipping (inf/nan kept,
    so the caller can skip a bad step)."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def global_loss_scale(mask_BR: torch.Tensor, device: DeviceSpec, sp_size: int = 1) -> LossScale:
    """The loss normalisers of a mini-batch of which this rank holds ``mask_BR``: the
    token and sequence counts summed over the data-parallel group (summed over every
    rank, then divided by the Ulysses size: the ranks of a group hold the same rows)."""
    local = LossScale.of(mask_BR)
    counts = torch.tensor(
        [local.num_tokens, local.num_seqs], dtype=torch.float64, device=device.torch_device()
    )
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    tokens, seqs = (count / sp_size for count in counts.tolist())
    return LossScale(num_tokens=tokens, num_seqs=seqs)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move AdamW's moments (the largest training state after the weights) to ``device``.

    With ``fsdp_config.optimizer_offload`` the states live on the CPU between updates,
    leaving device memory to a colocated rollout; they come back for the step. (With
    ``param_offload`` FSDP2 keeps parameters, gradients and these states on the CPU
    throughout, and the optimizer steps there.)
    """
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.device != device:
                state[key] = value.to(device, non_blocking=True)


@contextlib.contextmanager
def optimizer_on_device(
    optimizer: torch.optim.Optimizer, device: DeviceSpec, offload: bool
) -> Iterator[None]:
    """Bring offloaded optimizer state to the device for an update, then send it back."""
    if offload and device.type != "cpu":
        move_optimizer_state(optimizer, device.torch_device())
    try:
        yield
    finally:
        if offload and device.type != "cpu":
            move_optimizer_state(optimizer, torch.device("cpu"))


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> float:
    """Clip and step, unless the gradient norm is inf/NaN: then the update is skipped
    (and the gradients dropped). Returns the norm before clipping."""
    grad_norm = clip_grad_norm(model, max_norm)
    if math.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


class FSDPEngine:
    """One role's FSDP2 model, optimizer and schedule on this rank, behind the method names
    of ``engine.train.megatron.MegatronEngine``: the actor, critic and reference workers
    call either backend through the same interface (``engine.train.engines``)."""

    # The model's use_fused_kernels (engine.train.fused_head): None computes full logits.
    head: HeadOptions | None = None
    # The model's use_remove_padding: rows packed end to end (engine.train.packing).
    packed: bool = False
    # The role's Ulysses group (engine.train.ulysses); None at size 1.
    ulysses: Any = None
    # The role's entropy chunking, checkpointing and compile (engine.train.logit_options).
    logit_options: LogitOptions = PLAIN
    # MoE routing replay (engine.train.routing_replay): the actor's when it replays.
    routing: Any = NO_REPLAY

    def __init__(
        self,
        module: nn.Module,
        optim_cfg: OptimConfig | None,
        device: DeviceSpec,
        fsdp_cfg: FSDPConfig,
        peft_model: Any = None,
    ) -> None:
        self.module = module
        # LoRA (engine.train.lora): peft's wrapper around ``module``, whose adapter the
        # optimizer trains; None when every weight trains.
        self.peft_model = peft_model
        self.device = device
        self.fsdp_cfg = fsdp_cfg
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if optim_cfg is None:  # forward only (the reference)
            module.eval()
            return
        self.optimizer = build_optimizer(module, optim_cfg)
        total = max(1, optim_cfg.total_training_steps)
        self.scheduler = build_scheduler(self.optimizer, optim_cfg, total)
        self.optimizer.zero_grad(set_to_none=True)

    @classmethod
    def from_hf(
        cls,
        model_cfg: ModelConfig,
        fsdp_cfg: FSDPConfig,
        optim_cfg: OptimConfig | None,
        device: DeviceSpec,
        *,
        kind: str = "causal_lm",
        gradient_checkpointing: bool = False,
        lora: bool = False,
        ulysses: int = 1,
        ulysses_key: str = "ulysses_sequence_parallel_size",
        routing_replay: bool = False,
    ) -> FSDPEngine:
        """``routing_replay``: tap the MoE routers (engine.train.routing_replay)."""
        model = load_hf_model(model_cfg, kind=kind)
        if ulysses > 1:  # checked by config too; here against the model loaded
            from engine.train import ulysses as sp

            sp.check_heads(model, ulysses, ulysses_key)
            sp.enable(model)
        peft_model = None
        if optim_cfg is None:
            model.requires_grad_(False)
        elif lora:  # the adapter's layers go in before sharding, then shard with the rest
            from engine.train.lora import apply_lora

            peft_model = apply_lora(model, model_cfg)
            if model_cfg.lora_adapter_path:  # a saved adapter's weights (engine.train.lora_saved)
                from engine.train.lora_saved import load_weights

                load_weights(peft_model, model_cfg.lora_adapter_path)
        module = shard_model(model, fsdp_cfg, device, gradient_checkpointing=gradient_checkpointing)
        engine = cls(module, optim_cfg, device, fsdp_cfg, peft_model)
        if kind == "causal_lm":
            engine.head = HeadOptions.of(model_cfg)
        engine.packed = model_cfg.use_remove_padding
        if ulysses > 1:
            engine.ulysses = sp.UlyssesGroup.create(ulysses)
        if routing_replay:
            from engine.models.router_tap import RouterTap
            from engine.train.routing_replay import RoutingReplay

            tap = RouterTap(model).install()
            # Ulysses: each rank of the group routes its slice of the tokens
            group = engine.ulysses.group if engine.ulysses is not None else None
            engine.routing = RoutingReplay(tap, tap.num_layers, [group], device.torch_device())
        return engine

    @property
    def dp_size(self) -> int:
        """Ranks holding different rows: all of them, but for a Ulysses group's ranks,
        which share theirs."""
        return dist.get_world_size() // self.sp_size

    @property
    def sp_size(self) -> int:
        return 1 if self.ulysses is None else self.ulysses.size

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0] if self.scheduler is not None else 0.0

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()

    def response_logprobs(
        self,
        tokens: TokenBatch,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        from engine.train.forward import response_logprobs

        return response_logprobs(
            self.module,
            tokens,
            self.device.torch_device(),
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            head=self.head,
            packed=self.packed,
            ulysses=self.ulysses,
            options=self.logit_options,
            routing=self.routing,
        )

    def response_logprobs_at(
        self,
        tokens: TokenBatch,
        ids_BRK: torch.Tensor,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``response_logprobs`` and the log-probs of the tokens ``ids_BRK`` names at
        each response position (``engine.train.forward.response_logprobs_at``)."""
        from engine.train.forward import response_logprobs_at

        if self.head is not None or self.ulysses is not None:
            raise EngineError(
                "distillation's forward_kl_topk needs the student's whole logits: set"
                " actor_rollout_ref.model.use_fused_kernels=false and"
                " ulysses_sequence_parallel_size=1"
            )
        return response_logprobs_at(
            self.module,
            tokens,
            self.device.torch_device(),
            ids_BRK,
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            packed=self.packed,
            options=self.logit_options,
            routing=self.routing,
        )

    def response_logprobs_sum_pi_squared(
        self, tokens: TokenBatch, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from engine.train.forward import response_logprobs_sum_pi_squared

        return response_logprobs_sum_pi_squared(
            self.module,
            tokens,
            self.device.torch_device(),
            temperature,
            self.head,
            self.packed,
            self.ulysses,
            routing=self.routing,
        )

    def response_values(self, tokens: TokenBatch) -> torch.Tensor:
        from engine.train.forward import response_values

        return response_values(
            self.module, tokens, self.device.torch_device(), self.packed, self.ulysses
        )

    def global_loss_scale(self, mask_BR: torch.Tensor) -> LossScale:
        return global_loss_scale(mask_BR, self.device, self.sp_size)

    def backward(self, loss: torch.Tensor) -> None:
        """Each rank holds part of the global sum; FSDP averages gradients over all ranks.
        A Ulysses group's ranks hold the same part, each its positions' share of the
        gradient (``engine.train.ulysses``): × the world size undoes the mean either way."""
        (loss * dist.get_world_size()).backward()

    def forward_backward(
        self, micro_batches: Sequence[Any], step: Callable[[Any], torch.Tensor]
    ) -> None:
        """Gradients of ``step(micro)``, each micro-batch's loss, accumulated in order."""
        for micro in micro_batches:
            self.backward(step(micro))

    def updating(self) -> contextlib.AbstractContextManager:
        """Around an update: offloaded optimizer state comes to the device and goes back."""
        return optimizer_on_device(self.optimizer, self.device, self.fsdp_cfg.optimizer_offload)

    def optimizer_step(self, grad_clip: float) -> float:
        return optimizer_step(self.module, self.optimizer, grad_clip)

    def lr_scheduler_step(self) -> None:
        self.scheduler.step()

    def adapter_disabled(self) -> contextlib.AbstractContextManager:
        """The base model for the duration (LoRA's reference policy): peft's switch."""
        if self.peft_model is None:
            raise RuntimeError("adapter_disabled() needs a LoRA actor (lora_rank > 0)")
        return self.peft_model.disable_adapter()

    def hf_named_tensors(self, dtype: torch.dtype | None = None):
        """Full HF-named tensors, one gather at a time (collective: every rank calls it);
        with LoRA the adapted weights merged (engine.train.lora.merged_tensors)."""
        from engine.rollout.weights import full_tensors

        device = self.device.torch_device()
        if self.peft_model is not None:
            from engine.train.lora import merged_tensors

            return merged_tensors(self.module, dtype, device)
        return full_tensors(self.module, dtype=dtype, device=device)

    def base_named_tensors(self, dtype: torch.dtype | None = None):
        """LoRA: the frozen base weights under plain HF names, unmerged (collective)."""
        from engine.train.lora import merged_tensors

        return merged_tensors(self.module, dtype, self.device.torch_device(), merge=False)

    def adapter_named_tensors(self, dtype: torch.dtype | None = None):
        """LoRA: the adapter's tensors under peft's saved names (collective)."""
        from engine.train.lora import adapter_tensors

        return adapter_tensors(self.module, dtype, self.device.torch_device())

    def save(self, path: str, extra: dict | None = None, tokenizer: object = None) -> None:
        from engine.train.fsdp_checkpoint import save_role

        save_role(
            path,
            self.module,
            self.optimizer,
            self.scheduler,
            extra or {},
            tokenizer,
            peft_model=self.peft_model,
        )

    def load(self, path: str) -> dict:
        """Restore in place; returns this rank's extras (those given to ``save``)."""
        from engine.train.fsdp_checkpoint import load_role

        return load_role(
            path,
            self.module,
            self.optimizer,
            self.scheduler,
            adapter_only=self.peft_model is not None,
        )
