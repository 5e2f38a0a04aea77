"""The actor role: the policy being trained, with FSDP2 or Megatron-core
(``actor_rollout_ref.actor.strategy``) behind one engine interface."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any

import torch

from engine.algo.aggregate import LossScale, aggregate_loss
from engine.algo.distillation import (
    distillation_loss,
    forward_kl_topk,
    sampled_token_divergence,
)
from engine.algo.kl import kl_loss
from engine.algo.policy_loss import PolicyLossInputs, compute_policy_loss
from engine.algo.rollout_correction import bypass_loss_mode, bypass_policy_inputs
from engine.config import EngineConfig
from engine.controller.dispatch import take
from engine.device import DeviceSpec
from engine.train.engines import actor_engine
from engine.train.forward import forward_in_micro_batches, micro_batches, plan_micro_batches
from engine.types import ActorBatch, PolicyProbs, TeacherScores, TokenBatch


@dataclasses.dataclass
class LossSums:
    """This rank's parts of a mini-batch's losses, summed over its micro-batches."""

    pg: float = 0.0
    entropy: float = 0.0
    kl: float = 0.0
    distill: float = 0.0


class ActorWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        arr = cfg.actor_rollout_ref
        # Bypass mode corrects each micro-batch's loss against the sampler (rejection;
        # loss_type=reinforce: explicit weights and GPG's loss), when it asks for either.
        rc = cfg.algorithm.rollout_correction
        self.bypass = (
            rc if rc.bypass_mode and (rc.rollout_rs or rc.loss_type != "ppo_clip") else None
        )
        loss_mode = bypass_loss_mode(rc, arr.actor.policy_loss.loss_mode)
        # seq-mean-token-sum-norm's constant: the configured length, never the padding
        # of whichever micro-batch is at hand.
        self.cfg = dataclasses.replace(
            arr.actor,
            loss_scale_factor=arr.actor.loss_scale_factor or float(cfg.data.max_response_length),
            policy_loss=dataclasses.replace(arr.actor.policy_loss, loss_mode=loss_mode),
        )
        self.rollout_cfg = arr.rollout
        self.distill = cfg.distillation.distillation_loss if cfg.distillation.enabled else None
        self.replay = cfg.routing_replay  # what each pass does with MoE routing
        self.update_budget = cfg.token_budget("actor")
        self.log_prob_budget = cfg.token_budget("actor_log_prob")
        self.device = device
        self.engine = actor_engine(cfg, device)
        # What runs forward: the FSDP module (a colocated HF rollout generates with it),
        # or Megatron's DDP wrapper.
        self.module = self.engine.module
        self.tokenizer = tokenizer
        self.skipped_updates = 0  # non-finite gradient norms, over the run
        # Bumped whenever the weights change (update, checkpoint load): a colocated
        # inference engine with its own copy re-syncs when it sees a new version.
        self.weights_version = 0
        self.consecutive_skips = 0  # ... in a row, up to the last update
        # A separate vLLM serving the adapter holds the base weights once this process
        # has pushed them (send_weights)
        self._base_pushed = False

    def log_probs(self, tokens: TokenBatch) -> torch.Tensor:
        """log π_θ of each response token under the current weights (PPO's π_old)."""
        return self.old_policy(tokens).logprobs_BR

    def log_probs_sum_pi_squared(self, tokens: TokenBatch) -> PolicyProbs:
        """``log_probs`` and, from the same forward, Σ_v π_θ(v)² at each response position
        (the optimal token baseline's inputs; asked for by the trainer only then)."""
        return self.old_policy(tokens, sum_pi_squared=True)

    @torch.no_grad()
    def old_policy(self, tokens: TokenBatch, sum_pi_squared: bool = False) -> PolicyProbs:
        """The π_old pass: the log-probs, Σπ² when asked, and with routing replay R2 the
        routing the pass took (R3: it replays the rollout's, which ``tokens`` carry)."""
        self.engine.eval()
        temperature = self.rollout_cfg.temperature

        def forward(micro: TokenBatch) -> torch.Tensor:
            if sum_pi_squared:
                both = self.engine.response_logprobs_sum_pi_squared(micro, temperature)
                return torch.stack(both, dim=-1)
            return self.engine.response_logprobs(micro, temperature)[0]

        with self.engine.routing.during(self.replay.old_pass) as recorded:
            out = forward_in_micro_batches(
                tokens,
                self.rollout_cfg.log_prob_micro_batch_size_per_gpu,
                self.log_prob_budget,
                self.device.torch_device(),
                forward,
            )
        logprobs, sum_sq = (
            (t.contiguous() for t in out.unbind(-1)) if sum_pi_squared else (out, None)
        )
        return PolicyProbs(logprobs, sum_sq, recorded.routed_experts_BSLK)

    def update(self, batch: ActorBatch) -> dict[str, float]:
        """PPO epochs over mini-batches of this rank's shard; one optimizer step per
        mini-batch, gradients accumulated over its micro-batches. Without
        ``old_logprobs_BR`` the update must be on-policy (one epoch, one mini-batch):
        its own log-probs, detached, are π_old."""
        cfg = self.cfg
        self.engine.train()
        rows = len(batch.tokens)
        mini = cfg.ppo_mini_batch_size * self.rollout_cfg.n // self.engine.dp_size
        if batch.old_logprobs_BR is None and (cfg.ppo_epochs > 1 or mini < rows):
            raise ValueError("old log-probs may be left out only when the update is on-policy")
        metrics: dict[str, list[float]] = defaultdict(list)
        with self.engine.updating(), self.engine.routing.during(self.replay.update):
            for _epoch in range(cfg.ppo_epochs):
                for mini_rows in micro_batches(rows, mini):
                    self._update_mini_batch(take(batch, mini_rows), metrics)
        self.engine.lr_scheduler_step()
        self.weights_version += 1
        result = {k: sum(v) / len(v) for k, v in metrics.items()}
        result["actor/lr"] = self.engine.lr
        result["actor/skipped_updates"] = float(self.skipped_updates)
        result["actor/consecutive_skipped_updates"] = float(self.consecutive_skips)
        return result

    def send_weights(self, address: Any) -> Any:
        """The weights, to a rollout on workers of its own (placement=separate): every
        rank gathers each tensor (one collective a tensor, in the same order), the first
        sends it over the bridge (engine.rollout.bridge); what it sent (a ``Pushed``;
        None on the other ranks)."""
        import torch.distributed as dist

        from engine.rollout.bridge import SENDER, WeightBridge
        from engine.train.fsdp import DTYPES

        dtype = DTYPES[self.rollout_cfg.dtype] if self.device.supports_bf16 else None
        parts = self._weight_parts(dtype)
        pushed = None
        if dist.get_rank() != SENDER:
            for _, tensors in parts:  # the gathers are collective: walk them all the same
                for _ in tensors:
                    pass
        else:
            if getattr(self, "_bridge", None) is None:
                self._bridge = WeightBridge(address, SENDER, self.device.torch_device())
            bucket_bytes = self.rollout_cfg.update_weights_bucket_megabytes * 2**20
            pushed = self._bridge.send_push(parts, bucket_bytes)
        self._base_pushed = True
        return pushed

    def _weight_parts(self, dtype: torch.dtype | None) -> list[tuple[Any, Any]]:
        """Merged weights; or, for a vLLM that serves the adapter itself
        (``rollout.lora_as_adapter``), the frozen base weights at this process's first
        push only (the engine starts with dummy weights), and the adapter at every push
        (after a resume it is not zero, so the first push carries it too)."""
        from engine.rollout.bridge import WeightPart

        if not self.rollout_cfg.lora_as_adapter:
            return [(WeightPart.FULL, self.engine.hf_named_tensors(dtype))]
        adapter = (WeightPart.ADAPTER, self.engine.adapter_named_tensors(dtype))
        if self._base_pushed:
            return [adapter]
        return [(WeightPart.BASE, self.engine.base_named_tensors(dtype)), adapter]

    def save(self, path: str) -> None:
        counters = {"skipped": self.skipped_updates, "consecutive": self.consecutive_skips}
        self.engine.save(path, counters, self.tokenizer)

    def load(self, path: str) -> None:
        counters = self.engine.load(path)
        self.weights_version += 1
        self.skipped_updates = counters["skipped"]
        self.consecutive_skips = counters["consecutive"]

    def _update_mini_batch(self, batch: ActorBatch, metrics: dict[str, list[float]]) -> None:
        cfg = self.cfg
        scale = self.engine.global_loss_scale(batch.tokens.response_mask_BR)
        micro_rows = plan_micro_batches(
            batch.tokens,
            cfg.ppo_micro_batch_size_per_gpu,
            self.update_budget,
            self.device.torch_device(),
        )
        sums = LossSums()

        def step(rows: slice) -> torch.Tensor:
            """One micro-batch's loss (the engine runs its backward)."""
            return self._micro_loss(take(batch, rows), scale, sums, metrics)

        self.engine.forward_backward(micro_rows, step)
        # This rank's parts of the mini-batch's losses; × the data-parallel size they
        # average to the global values over ranks (how the controller reduces metrics).
        dp_size = self.engine.dp_size
        metrics["actor/pg_loss"].append(sums.pg * dp_size)
        metrics["actor/entropy"].append(sums.entropy * dp_size)
        if cfg.use_kl_loss:
            metrics["actor/kl_loss"].append(sums.kl * dp_size)
            metrics["actor/kl_coef"].append(cfg.kl_loss_coef)
        if self.distill is not None:
            metrics["distillation/loss"].append(sums.distill * dp_size)
        grad_norm = self.engine.optimizer_step(cfg.grad_clip)
        metrics["actor/grad_norm"].append(grad_norm)
        if math.isfinite(grad_norm):
            self.consecutive_skips = 0
        else:
            self.skipped_updates += 1
            self.consecutive_skips += 1

    def _micro_forward(
        self, micro: ActorBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The micro-batch's log-probs and entropy, and with top-k teachers the
        log-probs at the teachers' tokens."""
        entropy_grad = self.cfg.entropy_coeff != 0
        temperature = self.rollout_cfg.temperature
        teacher = micro.teacher
        if teacher is not None and teacher.topk_ids_BRK is not None:
            return self.engine.response_logprobs_at(
                micro.tokens,
                teacher.topk_ids_BRK,
                temperature=temperature,
                with_entropy=True,
                entropy_grad=entropy_grad,
            )
        logp, entropy = self.engine.response_logprobs(
            micro.tokens, temperature=temperature, with_entropy=True, entropy_grad=entropy_grad
        )
        return logp, entropy, None

    def _micro_loss(
        self,
        micro: ActorBatch,
        scale: LossScale,
        sums: LossSums,
        metrics: dict[str, list[float]],
    ) -> torch.Tensor:
        """This rank's part of the mini-batch's loss from one micro-batch: the policy
        loss, the entropy bonus, the KL loss and the distillation term, as configured."""
        cfg = self.cfg
        device = self.device.torch_device()
        mask = micro.tokens.response_mask_BR.to(device)
        teacher = micro.teacher
        logp, entropy, at_topk = self._micro_forward(micro)
        old_logp = logp.detach() if micro.old_logprobs_BR is None else micro.old_logprobs_BR
        is_weights = micro.rollout_is_weights_BR
        inputs = PolicyLossInputs(
            logprobs_BT=logp,
            old_logprobs_BT=old_logp.to(device),
            advantages_BT=micro.advantages_BR.to(device),
            response_mask_BT=mask,
            is_weights_BT=None if is_weights is None else is_weights.to(device),
        )
        if self.bypass is not None:
            inputs, correction_metrics = bypass_policy_inputs(inputs, self.bypass)
            for k, v in correction_metrics.items():
                metrics[k].append(v)
        pg = compute_policy_loss(inputs, cfg, scale)
        loss = pg.loss
        entropy_loss = aggregate_loss(
            entropy, mask, cfg.loss_agg_mode, scale, cfg.loss_scale_factor
        )
        if cfg.entropy_coeff:
            loss = loss - cfg.entropy_coeff * entropy_loss
        if cfg.use_kl_loss:
            kl_term, kl_metrics = kl_loss(logp, micro.ref_logprobs_BR.to(device), mask, cfg, scale)
            loss = loss + kl_term
            sums.kl += kl_metrics["actor/kl_loss"]
        if teacher is not None and self.distill is not None:
            term, distill_metrics = self._distillation_term(inputs, logp, teacher, at_topk, scale)
            sums.distill += float(term.detach())
            for k, v in distill_metrics.items():
                metrics[k].append(v)
            # use_task_rewards=false: the distillation loss alone, as verl's
            coef = self.distill.distillation_loss_coef
            loss = loss + coef * term if self.distill.use_task_rewards else term
        sums.pg += float(pg.loss.detach())
        sums.entropy += float(entropy_loss.detach())
        for k, v in pg.metrics.items():
            metrics[k].append(float(v))
        return loss

    def _distillation_term(
        self,
        inputs: PolicyLossInputs,
        logp: torch.Tensor,
        teacher: TeacherScores,
        at_topk: torch.Tensor | None,
        scale: LossScale,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's distillation loss (before its coefficient) and metrics."""
        assert self.distill is not None
        device = logp.device
        if at_topk is not None:
            divergence = forward_kl_topk(
                at_topk,
                teacher.topk_logprobs_BRK.to(device),
                self.distill.log_prob_min_clamp,
            )
        else:
            divergence = sampled_token_divergence(
                self.distill.loss_mode, logp, teacher.logprobs_BR.to(device)
            )
        return distillation_loss(divergence, inputs, self.distill, self.cfg, scale)
