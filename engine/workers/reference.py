"""The reference role: log-probs of the frozen initial policy, for KL terms; FSDP2 or
Megatron-core (``actor_rollout_ref.ref.strategy``, by default the actor's).

With LoRA the initial policy is the actor's own module with its adapter disabled: no model
is loaded here; the actor beside it (the reference is always placed with the actor)
runs the forward under peft's ``disable_adapter()``."""

from __future__ import annotations

from typing import Any

import torch

from engine.config import EngineConfig
from engine.device import DeviceSpec
from engine.train.engines import reference_engine
from engine.train.forward import forward_in_micro_batches
from engine.types import TokenBatch


class ReferenceWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        arr = cfg.actor_rollout_ref
        self.device = device
        self.temperature = arr.rollout.temperature
        self.micro_batch_size = arr.ref.log_prob_micro_batch_size_per_gpu
        self.token_budget = cfg.token_budget("ref_log_prob")
        self.lora = arr.model.uses_lora
        self.engine = colocated["actor"].engine if self.lora else reference_engine(cfg, device)
        self.engine.eval()
        self.module = self.engine.module

    @torch.no_grad()
    def log_probs(self, tokens: TokenBatch) -> torch.Tensor:
        if not self.lora:
            return self._log_probs(tokens)
        self.engine.eval()  # the actor's module, left in train mode by its last update
        with self.engine.adapter_disabled():
            return self._log_probs(tokens)

    def _log_probs(self, tokens: TokenBatch) -> torch.Tensor:
        return forward_in_micro_batches(
            tokens,
            self.micro_batch_size,
            self.token_budget,
            self.device.torch_device(),
            lambda micro: self.engine.response_logprobs(micro, self.temperature)[0],
        )
