"""The SFT role: a model trained on fixed targets, the negative log-likelihood of the
batch's loss tokens (``response_mask_BR``: the assistant's tokens of each conversation,
``engine.sft.batches``). Its training engine is the RL actor's (``actor_engine``: FSDP2 or
Megatron-core, LoRA, packing, Ulysses or context parallelism), built from the RL-side
view of the SFT config (``engine.config.sft.engine_view``); checkpoints go through the
host as every trained role's do (``engine.workers.host.TRAINED_ROLES``)."""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.algo.aggregate import aggregate_loss
from engine.config import EngineConfig
from engine.controller.dispatch import take
from engine.device import DeviceSpec
from engine.train.engines import actor_engine
from engine.train.forward import plan_micro_batches
from engine.types import TokenBatch


class SFTWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        actor = cfg.actor_rollout_ref.actor
        self.micro_batch_size = actor.ppo_micro_batch_size_per_gpu
        self.budget = cfg.token_budget("actor")  # data.max_token_len_per_gpu × CP/Ulysses
        self.grad_clip = actor.grad_clip
        self.device = device
        self.tokenizer = tokenizer
        self.engine = actor_engine(cfg, device)
        self.skipped_updates = 0  # steps with a non-finite gradient norm, over the run
        self.consecutive_skips = 0  # ... in a row, up to the last step

    def train_batch(self, tokens: TokenBatch) -> dict[str, float]:
        """One optimizer step on this rank's rows: gradients of the token-mean NLL over
        the whole global batch, accumulated over micro-batches, then clip and step.
        ``train/loss`` is this rank's part × the data-parallel size: its mean over the
        ranks (how the controller reduces) is the global loss."""
        engine = self.engine
        engine.train()
        device = self.device.torch_device()
        scale = engine.global_loss_scale(tokens.response_mask_BR)
        rows = plan_micro_batches(tokens, self.micro_batch_size, self.budget, device)
        part = 0.0

        def step(micro_rows: slice) -> torch.Tensor:
            nonlocal part
            micro = take(tokens, micro_rows)
            logp, _ = engine.response_logprobs(micro)
            mask = micro.response_mask_BR.to(device)
            loss = aggregate_loss(-logp, mask, "token-mean", scale)
            part += float(loss.detach())
            return loss

        lr = engine.lr  # the rate this step trains with (the schedule moves after it)
        with engine.updating():
            engine.forward_backward(rows, step)
            grad_norm = engine.optimizer_step(self.grad_clip)
        engine.lr_scheduler_step()
        if math.isfinite(grad_norm):
            self.consecutive_skips = 0
        else:
            self.skipped_updates += 1
            self.consecutive_skips += 1
        return {
            "train/loss": part * engine.dp_size,
            "train/grad_norm": grad_norm,
            "train/lr": lr,
            "train/loss_tokens": scale.num_tokens,
            "train/skipped_updates": float(self.skipped_updates),
            "train/consecutive_skipped_updates": float(self.consecutive_skips),
        }

    @torch.no_grad()
    def nll(self, tokens: TokenBatch) -> dict[str, float]:
        """The summed NLL of this rank's loss tokens and their count (the controller sums
        both over ranks and batches: the validation loss is their ratio)."""
        engine = self.engine
        engine.eval()
        device = self.device.torch_device()
        total, count = 0.0, 0.0
        for rows in plan_micro_batches(tokens, self.micro_batch_size, self.budget, device):
            micro = take(tokens, rows)
            logp, _ = engine.response_logprobs(micro)
            mask = micro.response_mask_BR.to(device)
            total += float(-(logp * mask).sum())
            count += float(mask.sum())
        return {"nll": total, "tokens": count}

    def save(self, path: str) -> None:
        counters = {"skipped": self.skipped_updates, "consecutive": self.consecutive_skips}
        self.engine.save(path, counters, self.tokenizer)

    def load(self, path: str) -> None:
        counters = self.engine.load(path)
        self.skipped_updates = counters["skipped"]
        self.consecutive_skips = counters["consecutive"]
