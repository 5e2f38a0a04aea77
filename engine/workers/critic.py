"""The critic role: a value function V(prefix) for GAE, trained on the returns, with
FSDP2 or Megatron-core (``critic.strategy``) behind one engine interface."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from engine.algo.value import value_loss
from engine.config import EngineConfig
from engine.controller.dispatch import take
from engine.device import DeviceSpec
from engine.train.engines import critic_engine
from engine.train.forward import forward_in_micro_batches, micro_batches, plan_micro_batches
from engine.types import CriticBatch, TokenBatch


class CriticWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        self.cfg = cfg.critic
        self.device = device
        self.n = cfg.actor_rollout_ref.rollout.n
        self.mini_batch_size = (
            self.cfg.ppo_mini_batch_size or cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        )
        self.ppo_epochs = self.cfg.ppo_epochs or cfg.actor_rollout_ref.actor.ppo_epochs
        self.max_response_length = float(cfg.data.max_response_length)
        self.log_prob_micro = cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
        self.token_budget = cfg.token_budget("critic")
        self.engine = critic_engine(cfg, device)
        self.module = self.engine.module

    @torch.no_grad()
    def values(self, tokens: TokenBatch) -> torch.Tensor:
        self.engine.eval()

        def masked_values(micro: TokenBatch) -> torch.Tensor:
            values = self.engine.response_values(micro)
            return values * micro.response_mask_BR.to(values.device)

        device = self.device.torch_device()
        return forward_in_micro_batches(
            tokens, self.log_prob_micro, self.token_budget, device, masked_values
        )

    def update(self, batch: CriticBatch) -> dict[str, float]:
        """PPO epochs over mini-batches of this rank's shard, as the actor does."""
        self.engine.train()
        mini = self.mini_batch_size * self.n // self.engine.dp_size
        metrics: dict[str, list[float]] = defaultdict(list)
        with self.engine.updating():
            for _epoch in range(self.ppo_epochs):
                for mini_rows in micro_batches(len(batch.tokens), mini):
                    self._update_mini_batch(take(batch, mini_rows), metrics)
        self.engine.lr_scheduler_step()
        result = {k: sum(v) / len(v) for k, v in metrics.items()}
        result["critic/lr"] = self.engine.lr
        return result

    def save(self, path: str) -> None:
        self.engine.save(path, {})

    def load(self, path: str) -> None:
        self.engine.load(path)

    def _update_mini_batch(self, batch: CriticBatch, metrics: dict[str, list[float]]) -> None:
        device = self.device.torch_device()
        scale = self.engine.global_loss_scale(batch.tokens.response_mask_BR)
        loss_sum = 0.0  # this rank's part of the mini-batch loss (see ActorWorker)
        micro_size = self.cfg.ppo_micro_batch_size_per_gpu

        def step(rows: slice) -> torch.Tensor:
            nonlocal loss_sum
            micro = take(batch, rows)
            values = self.engine.response_values(micro.tokens)
            loss, m = value_loss(
                values,
                micro.old_values_BR.to(device),
                micro.returns_BR.to(device),
                micro.tokens.response_mask_BR.to(device),
                self.cfg,
                scale,
                loss_scale_factor=self.max_response_length,
            )
            loss_sum += float(loss.detach())
            metrics["critic/vf_clipfrac"].append(m["critic/vf_clipfrac"])
            metrics["critic/vpred_mean"].append(m["critic/vpred_mean"])
            return loss

        rows = plan_micro_batches(batch.tokens, micro_size, self.token_budget, device)
        self.engine.forward_backward(rows, step)
        metrics["critic/vf_loss"].append(loss_sum * self.engine.dp_size)
        metrics["critic/grad_norm"].append(self.engine.optimizer_step(self.cfg.grad_clip))
