"""The update step of ``MegatronEngine`` (``engine.train.megatron``): the loss scale,
backward (in 1F1B order with pipeline stages), the gradient reduction, clipping and the
optimizer step, the learning-rate schedule.

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
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from engine.algo.aggregate import LossScale
from engine.config import OptimConfig
from engine.errors import EngineError
from engine.train import fsdp
from engine.train.megatron_pipeline import one_f_one_b
from engine.train.megatron_state import EngineState


class MegatronUpdate(EngineState):
    """Training: ``global_loss_scale``, ``forward_backward``, ``optimizer_step``,
    ``lr_scheduler_step``."""

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
            adam_eps=cfg.eps,  # as the FSDP backend's AdamW
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

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0

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
        # experts on their own grid (``allreduce`` False: not replicated over DP) are
        # summed over the ranks holding one slice each, Megatron's ETP × EP × PP.
        squares = torch.zeros((), dtype=torch.float64)
        expert_squares = torch.zeros((), dtype=torch.float64)
        for p in params:
            if not getattr(p, "allreduce", True):
                expert_squares += p.grad.double().pow(2).sum()
            elif param_is_not_tensor_parallel_duplicate(p) and not getattr(p, "shared", False):
                squares += p.grad.double().pow(2).sum()
        dist.all_reduce(squares, group=self.model_parallel_group)
        if self.parallel.experts_apart:
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
