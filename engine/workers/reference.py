"""The reference role: log-probs of the frozen initial policy, for KL terms."""

from __future__ import annotations

from typing import Any

import torch

from engine.config import EngineConfig
from engine.controller.dispatch import take
from engine.device import DeviceSpec
from engine.train import fsdp
from engine.train.forward import plan_micro_batches, response_logprobs
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
        model = fsdp.load_hf_model(arr.model)
        model.requires_grad_(False)
        self.module = fsdp.shard_model(
            model, arr.ref.fsdp_config, device, gradient_checkpointing=False
        )
        self.module.eval()

    @torch.no_grad()
    def log_probs(self, tokens: TokenBatch) -> torch.Tensor:
        device = self.device.torch_device()
        out = []
        for rows in plan_micro_batches(tokens, self.micro_batch_size, self.token_budget, device):
            logp, _ = response_logprobs(self.module, take(tokens, rows), device, self.temperature)
            out.append(logp.cpu())
        return torch.cat(out)
