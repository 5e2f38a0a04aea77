"""The critic role: a value function V(prefix) for GAE, trained on the returns."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from engine.algo.value import value_loss
from engine.config import EngineConfig
from engine.controller.dispatch import take
from engine.device import DeviceSpec
from engine.train import fsdp
from engine.train.forward import micro_batches, plan_micro_batches, response_values
from engine.train.fsdp_checkpoint import load_role, save_role
from engine.types import CriticBatch, TokenBatch


class CriticWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        self.cfg = cfg.critic
        self.device = device
        self.world_size = cfg.world_size
        self.n = cfg.actor_rollout_ref.rollout.n
        self.mini_batch_size = (
            self.cfg.ppo_mini_batch_size or cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        )
        self.ppo_epochs = self.cfg.ppo_epochs or cfg.actor_rollout_ref.actor.ppo_epochs
        self.max_response_length = float(cfg.data.max_response_length)
        self.log_prob_micro = cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
        self.token_budget = cfg.token_budget("critic")
        model_cfg = self.cfg.model if self.cfg.model.path else cfg.actor_rollout_ref.model
        model = fsdp.load_hf_model(model_cfg, kind="value")
        self.module = fsdp.shard_model(
            model,
            self.cfg.fsdp_config,
            device,
            gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
        )
        self.optimizer = fsdp.build_optimizer(self.module, self.cfg.optim)
        total = max(1, self.cfg.optim.total_training_steps)
        self.scheduler = fsdp.build_scheduler(self.optimizer, self.cfg.optim, total)

    @torch.no_grad()
    def values(self, tokens: TokenBatch) -> torch.Tensor:
        self.module.eval()
        device = self.device.torch_device()
        out = []
        for rows in plan_micro_batches(tokens, self.log_prob_micro, self.token_budget, device):
            micro = take(tokens, rows)
            values = response_values(self.module, micro, device)
            out.append((values * micro.response_mask_BR.to(values.device)).cpu())
        return torch.cat(out)

    def update(self, batch: CriticBatch) -> dict[str, float]:
        """PPO epochs over mini-batches of this rank's shard, as the actor does."""
        self.module.train()
        mini = self.mini_batch_size * self.n // self.world_size
        metrics: dict[str, list[float]] = defaultdict(list)
        offload = self.cfg.fsdp_config.optimizer_offload
        with fsdp.optimizer_on_device(self.optimizer, self.device, offload):
            for _epoch in range(self.ppo_epochs):
                for mini_rows in micro_batches(len(batch.tokens), mini):
                    self._update_mini_batch(take(batch, mini_rows), metrics)
        self.scheduler.step()
        result = {k: sum(v) / len(v) for k, v in metrics.items()}
        result["critic/lr"] = self.scheduler.get_last_lr()[0]
        return result

    def save(self, path: str) -> None:
        save_role(path, self.module, self.optimizer, self.scheduler, {})

    def load(self, path: str) -> None:
        load_role(path, self.module, self.optimizer, self.scheduler)

    def _update_mini_batch(self, batch: CriticBatch, metrics: dict[str, list[float]]) -> None:
        device = self.device.torch_device()
        scale = fsdp.global_loss_scale(batch.tokens.response_mask_BR, self.device)
        loss_sum = 0.0  # this rank's part of the mini-batch loss (see ActorWorker)
        micro_size = self.cfg.ppo_micro_batch_size_per_gpu
        for rows in plan_micro_batches(batch.tokens, micro_size, self.token_budget, device):
            micro = take(batch, rows)
            values = response_values(self.module, micro.tokens, device)
            loss, m = value_loss(
                values,
                micro.old_values_BR.to(device),
                micro.returns_BR.to(device),
                micro.tokens.response_mask_BR.to(device),
                self.cfg,
                scale,
                loss_scale_factor=self.max_response_length,
            )
            (loss * self.world_size).backward()
            loss_sum += float(loss.detach())
            metrics["critic/vf_clipfrac"].append(m["critic/vf_clipfrac"])
            metrics["critic/vpred_mean"].append(m["critic/vpred_mean"])
        metrics["critic/vf_loss"].append(loss_sum * self.world_size)
        metrics["critic/grad_norm"].append(
            fsdp.optimizer_step(self.module, self.optimizer, self.cfg.grad_clip)
        )
