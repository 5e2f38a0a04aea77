"""The RL loop, run by the single controller.

One step, top to bottom:

    prompts ─► generate ─► score ─► old log-probs ─► ref log-probs ─► values
            ─► rollout correction ─► advantages ─► critic update ─► actor update ─► metrics

The controller holds the algorithm's control flow and the typed batches; the
worker group (``engine.controller.worker_group``) holds the weights and does
every forward and backward pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from engine.agents.metrics import agent_metrics
from engine.algo.advantage import AdvantageInputs, AdvantageOutputs, compute_advantages
from engine.algo.kl import apply_kl_in_reward, make_kl_controller
from engine.algo.masked import last_valid_index
from engine.algo.names import EstimatorNeeds, estimator_needs
from engine.algo.rollout_correction import Correction, correct_rollout, ragged_to_padded
from engine.checkpoint import CheckpointManager, TrainerState, read_trainer_state
from engine.config import EngineConfig, RolloutConfig, SamplingConfig, to_yaml
from engine.config.routing_replay import RECORD
from engine.controller.dispatch import concat, take
from engine.controller.workers import Workers
from engine.data.dataset import PromptDataset, PromptSample
from engine.data.loader import PromptLoader, PromptStream
from engine.errors import EXIT_PREEMPTED, EngineError
from engine.loop import distill
from engine.loop.balance import balance
from engine.loop.batch import Rollout
from engine.loop.generate import Generator
from engine.loop.generations import generation_rows, pick_samples, write_generations
from engine.loop.metrics import (
    StageTimer,
    batch_metrics,
    reduce_rank_metrics,
    throughput_metrics,
)
from engine.loop.overlap import OverlapContext, make_overlap
from engine.loop.scoring import Scorer, reward_components
from engine.loop.validation import ValidationSample, validation_metrics
from engine.loop.weights_version import WeightsVersion
from engine.memory_peaks import near_limit, peak_metrics
from engine.startup import StartupClock
from engine.tracking import Tracker, progress
from engine.types import (
    ActorBatch,
    CriticBatch,
    GenerationRequest,
    PolicyProbs,
    SampleMeta,
    SamplingParams,
    TeacherScores,
    TokenBatch,
)

WEIGHTS_VERSION = "weights_version"  # in the trainer state's extra: the actor's updates


class Preempted(EngineError):
    """The run stopped on SIGTERM; a launcher should requeue it (exit code 75)."""

    exit_code = EXIT_PREEMPTED
    reason = "preempted"

    def __init__(self, step: int) -> None:
        super().__init__(
            f"stopped on SIGTERM after step {step}; resume continues from the last checkpoint"
        )


class UpdatesDiverged(EngineError):
    """The actor's updates kept being NaN/inf: the run stops (exit code 2); the same data
    and weights would diverge again, so no restart (engine.exits)."""

    reason = "nan_updates"


@dataclasses.dataclass
class Passes:
    """One step's forward passes over its batch: what each later stage reads (None where
    the run makes none)."""

    tokens: TokenBatch  # the batch; with π_old's routing where routing replay records it
    old_logprobs: torch.Tensor | None = None  # π_old; None: the update's own serve (on-policy)
    sum_pi_squared: torch.Tensor | None = None  # Σ_v π_old(v)², for an estimator that reads it
    ref_logprobs: torch.Tensor | None = None
    teacher: TeacherScores | None = None
    values: torch.Tensor | None = None


class Trainer:
    def __init__(
        self,
        cfg: EngineConfig,
        workers: Workers,
        scorer: Scorer,
        tokenizer: Any,
        train_loader: PromptLoader,
        val_dataset: PromptDataset | None,
        tracker: Tracker,
        checkpoints: CheckpointManager,
        resume_from: str | None = None,
        startup: StartupClock | None = None,
    ) -> None:
        self.cfg = cfg
        self.workers = workers
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.val_dataset = val_dataset
        self.tracker = tracker
        self.kl_ctrl = make_kl_controller(cfg.algorithm.kl_ctrl)
        self.total_steps = cfg.actor_rollout_ref.actor.optim.total_training_steps
        self.step = 0
        self.checkpoints = checkpoints
        self.resume_from = resume_from
        self.stop_requested = False
        self._memory_told: set[str] = set()  # phases already said to be near their limit
        rollout = cfg.actor_rollout_ref.rollout
        max_new = cfg.data.max_response_length
        self.sampling = sampling_params(rollout, max_new, ignore_eos=rollout.ignore_eos)
        self.val_sampling = sampling_params(rollout.val_kwargs, max_new)
        self.prompts = PromptStream(train_loader)
        # The actor's weights, counted (every update, every load); a rollout on workers of
        # its own (placement=separate) is pushed the version it lacks before it generates.
        self.weights = WeightsVersion(separate=rollout.placement == "separate")
        self.generator = Generator(cfg, workers, scorer, self.weights)
        self.overlap = make_overlap(
            OverlapContext(
                cfg, workers, self.prompts, self.generator, scorer, self.weights, self.sampling
            ),
            cfg.async_training.mode,
        )
        # the start-up's milestones, logged with this process's first step
        self.startup = startup or StartupClock()

    # -- the loop -----------------------------------------------------------

    def fit(self) -> None:
        try:
            self._fit()
        finally:
            self.overlap.close()

    def _fit(self) -> None:
        if self.resume_from is not None:
            self.resume(self.resume_from)
        if self.cfg.trainer.val_only:  # verl's key: one validation, no training
            self.tracker.log(self.step, self.validate())
            return
        if (
            self.resume_from is None
            and self.val_dataset is not None
            and (self.cfg.trainer.val_before_train)
        ):
            self.tracker.log(self.step, self.validate())
            self.startup.mark("validation")
        while self.step < self.total_steps:
            self.step += 1
            self.startup.mark("first_step")  # the first counts
            metrics = self.train_step()
            metrics |= self.startup.first_step_done()  # once: the start-up's milestones
            metrics |= self.memory_metrics()
            problem = self.update_problem(metrics)
            if problem:
                self.tracker.log(self.step, metrics)  # the failing step is on record
                raise UpdatesDiverged(problem)
            test_freq = self.cfg.trainer.test_freq
            if self.val_dataset is not None and (
                self.step == self.total_steps or (test_freq > 0 and self.step % test_freq == 0)
            ):
                metrics |= self.validate()
            if self.checkpoints.should_save(self.step, self.total_steps):
                self.save()
            self.tracker.log(self.step, metrics)
            self.checkpoints.finish_uploads(self.workers, block=False)
            if self.stop_requested:
                self.stop_for_preemption()
        self.checkpoints.finish_uploads(self.workers, block=True)

    def memory_metrics(self) -> dict[str, float]:
        """The step's peak memory per role and phase over the workers; a phase near its
        limit is said once (engine.memory_peaks)."""
        # With generation overlapping training the rollout's workers are busy now: ask
        # the training group alone (a host serves one call at a time)
        hosts = self.workers.group_of("actor") if self.overlap.overlapped else self.workers
        reports = hosts.host_all("memory_peaks")
        metrics = peak_metrics(reports)
        for line in near_limit(metrics, self._memory_told):
            print(line, flush=True)
        return metrics

    # -- checkpoints and faults ---------------------------------------------

    def state(self) -> TrainerState:
        # Generations in flight (async_training) drew their prompts ahead: the checkpoint
        # records them, or the loader from before, so that a resume draws them again.
        loader, extra = self.overlap.checkpoint_state()
        return TrainerState(
            step=self.step,
            loader=loader,
            kl_ctrl=self.kl_ctrl.state_dict(),
            extra={**extra, WEIGHTS_VERSION: self.weights.version},
        )

    def save(self) -> None:
        self.checkpoints.save(self.step, self.workers, self.state(), to_yaml(self.cfg))

    def resume(self, path: str) -> None:
        """Continue exactly where checkpoint ``path`` left off."""
        state = read_trainer_state(path)
        local = self.checkpoints.fetch(path, self.workers)
        self.workers.host_all("load_checkpoint", local)
        # the weights' version as saved (staleness counts on from it); a separate rollout
        # gets them before it generates
        self.weights.restore(state.extra.get(WEIGHTS_VERSION, self.weights.version + 1))
        self.step = state.step
        self.prompts.load_state_dict(state.loader)
        self.overlap.load_extra_state(state.extra)
        self.kl_ctrl.load_state_dict(state.kl_ctrl)
        self.checkpoints.last_saved_step = state.step
        print(f"resumed from {path} at step {state.step}", flush=True)

    def update_problem(self, metrics: dict[str, float]) -> str | None:
        """Why the run must stop: the actor keeps producing non-finite gradients (its
        updates are skipped and counted, so one bad batch does not end a run)."""
        in_a_row = metrics.get("actor/consecutive_skipped_updates", 0.0)
        limit = self.cfg.trainer.max_consecutive_skipped_updates
        if in_a_row < limit:
            return None
        return (
            f"{int(in_a_row)} actor updates in a row had a NaN/inf loss or gradient norm"
            f" (trainer.max_consecutive_skipped_updates={limit}); the last good checkpoint"
            " is intact. Check the reward for NaN, lower the learning rate, or clip"
            " gradients harder (actor_rollout_ref.actor.grad_clip)"
        )

    def request_stop(self) -> None:
        """Called from the SIGTERM handler: finish this step, then stop."""
        self.stop_requested = True

    def stop_for_preemption(self) -> None:
        since = self.step - self.checkpoints.last_saved_step
        wanted = self.cfg.trainer.preemption_save_steps
        if wanted > 0 and since >= wanted:
            self.save()
        self.checkpoints.finish_uploads(self.workers, block=True)
        raise Preempted(self.step)

    def train_step(self) -> dict[str, float]:
        cfg = self.cfg
        timer = StageTimer()
        metrics: dict[str, float] = {}
        with timer("step"):
            with timer("gen"):
                rollout = self.overlap.next_batch(self.step, self.total_steps, timer, metrics)
            rollout = self.prepare(rollout, metrics)
            updates_actor = self.step > cfg.trainer.critic_warmup
            needs = estimator_needs(cfg.algorithm.adv_estimator)
            passes = self.forward_passes(rollout, updates_actor, needs, timer)
            # Weights and rejection first: the optimal token baseline reads the weights.
            correction = self.rollout_correction(rollout, passes.old_logprobs, metrics)
            with timer("adv"):
                token_rewards = self.token_rewards(
                    rollout, passes.old_logprobs, passes.ref_logprobs, metrics
                )
                adv = self.advantages(rollout, passes, token_rewards, correction, timer, metrics)
            self.update(passes, adv, correction, updates_actor, timer, metrics)
        metrics |= batch_metrics(
            scores_B=rollout.scores_B,
            token_rewards_BR=token_rewards,
            advantages_BR=adv.advantages_BT,
            returns_BR=adv.returns_BT,
            response_mask_BR=rollout.tokens.response_mask_BR,
            prompt_lengths_B=rollout.prompt_lengths_B,
            max_response_length=cfg.data.max_response_length,
            values_BR=passes.values,
        )
        metrics["critic/acc/mean"] = float(rollout.acc_B.mean())
        return metrics | self.step_metrics(rollout, timer)

    def prepare(self, rollout: Rollout, metrics: dict[str, float]) -> Rollout:
        """The generated batch written out (``rollout_data_dir``), balanced over the ranks,
        and its agent statistics."""
        cfg = self.cfg
        if cfg.trainer.rollout_data_dir:
            write_generations(cfg.trainer.rollout_data_dir, self.step, rollout, self.tokenizer)
        if cfg.trainer.balance_batch:  # equal tokens per data-parallel rank
            rollout, balanced = balance(rollout, cfg.data_parallel_size("actor"))
            metrics |= balanced
        if rollout.agent_stats is not None and rollout.response_masks is not None:
            metrics |= agent_metrics(rollout.agent_stats, rollout.response_masks)
        return rollout

    def forward_passes(
        self, rollout: Rollout, updates_actor: bool, needs: EstimatorNeeds, timer: StageTimer
    ) -> Passes:
        """π_old, the reference, the teachers and the critic's values, each when read."""
        cfg = self.cfg
        tokens = rollout.tokens
        passes = Passes(tokens)
        if cfg.algorithm.rollout_correction.bypass_mode:
            # verl's bypass mode: the sampler's own log-probs are π_old, no pass
            passes.old_logprobs = ragged_to_padded(rollout.rollout_logprobs, tokens.response_length)
        elif self.needs_old_pass(updates_actor, needs):
            with timer("old_log_prob"):
                old = self.old_policy(tokens, needs.sum_pi_squared)
            passes.old_logprobs, passes.sum_pi_squared = old.logprobs_BR, old.sum_pi_squared_BR
            if old.routed_experts_BSLK is not None:  # routing replay R2: the update's
                passes.tokens = dataclasses.replace(
                    tokens, routed_experts_BSLK=old.routed_experts_BSLK
                )
        free = tokens.without_routing()  # the reference and the critic route freely
        if cfg.use_reference:
            with timer("ref"):
                passes.ref_logprobs = self.workers.call_split("ref", "log_probs", free)
        if cfg.distillation.enabled:
            with timer("teacher"):
                passes.teacher = distill.score(self.workers, cfg, free, rollout.meta)
        if cfg.use_critic:
            with timer("values"):
                passes.values = self.workers.call_split("critic", "values", free)
        return passes

    def needs_old_pass(self, updates_actor: bool, needs: EstimatorNeeds) -> bool:
        """Whether π_old needs a pass of its own. On-policy the update's own log-probs
        serve as π_old; off-policy (generation overlapping training) π_old is the
        proximal policy, the weights now, not the ones that sampled, and TIS corrects
        between the two (rollout_correction)."""
        cfg = self.cfg
        off_policy = self.overlap.overlapped
        return (
            needs.sum_pi_squared  # the optimal token baseline: always a π_old pass
            or cfg.algorithm.use_kl_in_reward
            or (updates_actor and (off_policy or not cfg.update_is_on_policy))
        )

    def advantages(
        self,
        rollout: Rollout,
        passes: Passes,
        token_rewards: torch.Tensor,
        correction: Correction,
        timer: StageTimer,
        metrics: dict[str, float],
    ) -> AdvantageOutputs:
        cfg = self.cfg
        needs = estimator_needs(cfg.algorithm.adv_estimator)
        baseline = self.greedy_baseline(rollout, timer) if needs.greedy_baseline else None
        components = (
            reward_components(rollout, cfg.algorithm.gdpo_reward_keys or [], metrics)
            if needs.reward_components
            else None
        )
        return compute_advantages(
            cfg.algorithm.adv_estimator,
            AdvantageInputs(
                token_rewards_BT=token_rewards,
                response_mask_BT=rollout.tokens.response_mask_BR,
                group_ids_B=torch.tensor(rollout.meta.group_ids),
                values_BT=passes.values,
                baseline_rewards_B=baseline,
                reward_components_BK=components,
                old_logprobs_BT=passes.old_logprobs if needs.sum_pi_squared else None,
                sum_pi_squared_BT=passes.sum_pi_squared,
                is_weights_BT=correction.is_weights_BT,
            ),
            cfg.algorithm,
        )

    def update(
        self,
        passes: Passes,
        adv: AdvantageOutputs,
        correction: Correction,
        updates_actor: bool,
        timer: StageTimer,
        metrics: dict[str, float],
    ) -> None:
        """The critic's update, then the actor's (after the critic's warm-up)."""
        tokens = passes.tokens
        if self.cfg.use_critic:
            with timer("update_critic"):
                batch = CriticBatch(tokens.without_routing(), passes.values, adv.returns_BT)
                metrics |= self.workers.call_split(
                    "critic", "update", batch, gather=reduce_rank_metrics
                )
        if not updates_actor:
            return
        with timer("update_actor"):
            actor_batch = ActorBatch(
                correction.actor_tokens(tokens),  # rejected tokens out of the loss
                passes.old_logprobs,
                adv.advantages_BT,
                passes.ref_logprobs,
                correction.is_weights_BT,
                passes.teacher,
            )
            metrics |= self.workers.call_split(
                "actor", "update", actor_batch, gather=reduce_rank_metrics
            )
        self.weights.updated()

    def step_metrics(self, rollout: Rollout, timer: StageTimer) -> dict[str, float]:
        """The judges', the times, the throughput, the epoch and the weights pushed."""
        metrics = self.scorer.judge_metrics()  # every judging of the step (ReMax's too)
        metrics |= timer.metrics()
        num_tokens = int(rollout.tokens.attention_mask_BS.sum())
        metrics |= throughput_metrics(num_tokens, timer.seconds["step"], self.cfg.world_size)
        metrics["training/epoch"] = float(self.prompts.loader.epoch)
        if self.weights.separate:  # a LoRA adapter served by vLLM: only the first push is large
            sent = self.weights.take_sent()
            metrics["rollout/weights_pushed_mb"] = sent.bytes / 2**20
            metrics["rollout/weights_pushed_tensors"] = float(sent.tensors)
        return metrics

    # -- stages -------------------------------------------------------------

    def old_policy(self, tokens: TokenBatch, sum_pi_squared: bool) -> PolicyProbs:
        """The actor's π_old pass: its log-probs, and Σπ² or (routing replay R2) the
        routing it took when something reads them."""
        if sum_pi_squared or self.cfg.routing_replay.old_pass == RECORD:
            return self.workers.call_split("actor", "old_policy", tokens, sum_pi_squared)
        return PolicyProbs(self.workers.call_split("actor", "log_probs", tokens))

    def rollout_correction(
        self, rollout: Rollout, old_logprobs: torch.Tensor | None, metrics: dict[str, float]
    ) -> Correction:
        """Decoupled mode: the rollout engine's probabilities against π_old's, the mismatch
        metrics, and the weights and rejection ``algorithm.rollout_correction`` asks for
        (bypass mode corrects in the actor's loss instead)."""
        rc = self.cfg.algorithm.rollout_correction
        if rollout.rollout_logprobs is None or old_logprobs is None or rc.bypass_mode:
            return Correction()
        tokens = rollout.tokens
        engine_logprobs = ragged_to_padded(rollout.rollout_logprobs, tokens.response_length)
        correction = correct_rollout(old_logprobs, engine_logprobs, tokens.response_mask_BR, rc)
        metrics |= correction.metrics
        return correction

    def token_rewards(
        self,
        rollout: Rollout,
        old_logprobs: torch.Tensor | None,
        ref_logprobs: torch.Tensor | None,
        metrics: dict[str, float],
    ) -> torch.Tensor:
        """The sequence score on each response's last token, minus the KL penalty
        when the KL is in the reward."""
        mask = rollout.tokens.response_mask_BR
        scores = torch.zeros_like(mask)
        last = last_valid_index(mask)  # the model's last token (tool tokens come between)
        has_tokens = mask.sum(-1) > 0
        rows = torch.arange(len(rollout))[has_tokens]
        scores[rows, last[has_tokens]] = rollout.scores_B[has_tokens]
        if not self.cfg.algorithm.use_kl_in_reward:
            return scores
        rewards, kl_metrics = apply_kl_in_reward(
            scores, old_logprobs, ref_logprobs, mask, self.kl_ctrl, self.cfg.algorithm.kl_penalty
        )
        metrics |= {k: float(v) for k, v in kl_metrics.items()}
        self.kl_ctrl.update(float(kl_metrics["actor/reward_kl_penalty"]), n_steps=len(rollout))
        return rewards

    def greedy_baseline(self, rollout: Rollout, timer: StageTimer) -> torch.Tensor:
        """ReMax: the score of each prompt's greedy response, for each of its samples."""
        n = self.sampling.n
        greedy = dataclasses.replace(self.sampling, n=1, do_sample=False)
        prompt_ids = rollout.prompt_ids[::n]
        with timer("gen_baseline"):
            self.weights.push(self.workers)
            images = None if rollout.images is None else rollout.images[::n]
            output = self.workers.call_split(
                "rollout", "generate", GenerationRequest(prompt_ids, greedy, images=images)
            )
        meta = SampleMeta(
            *(getattr(rollout.meta, f.name)[::n] for f in dataclasses.fields(SampleMeta))
        )
        with timer("reward"):
            results = self.scorer.score(output.response_ids, meta, prompt_ids)
        return torch.tensor([r.score for r in results], dtype=torch.float32).repeat_interleave(n)

    def validate(self) -> dict[str, float]:
        """Generate on the validation set with the validation sampling settings, score,
        and report per data source (mean@n, best/worst@k, pass@k, maj@k).

        Prompts go in chunks of ``data.val_batch_size`` (all at once when null)."""
        assert self.val_dataset is not None
        timer = StageTimer()
        n = self.val_sampling.n
        total = len(self.val_dataset)
        chunk = self.cfg.data.val_batch_size or total
        samples: list[ValidationSample] = []
        rollouts: list[Rollout] = []  # the real samples, for the dump and the logged ones
        with timer("val"), self.overlap.rollout_exclusive(), progress(total, "validation") as bar:
            for start in range(0, total, chunk):
                prompts = [self.val_dataset[i] for i in range(start, min(start + chunk, total))]
                padded = self.pad_for_ranks(prompts, n)
                rollout = self.generator.generate(padded, self.val_sampling, timer)
                rollouts.append(take(rollout, slice(0, len(prompts) * n)))
                samples += [
                    ValidationSample(
                        data_source=rollout.meta.data_source[i],
                        prompt_index=start + i // n,
                        score=float(rollout.scores_B[i]),
                        acc=float(rollout.acc_B[i]),
                        pred=rollout.preds[i],
                    )
                    for i in range(len(prompts) * n)  # the padding's samples dropped
                ]
                bar.update(len(prompts))
        metrics = validation_metrics(samples, seed=self.cfg.trainer.seed)
        metrics |= self.scorer.judge_metrics(prefix="val/")
        self.record_validation(concat(rollouts))
        return metrics | {"timing_s/val": timer.seconds["val"]}

    def record_validation(self, rollout: Rollout) -> None:
        """verl's trainer.validation_data_dir (every sample, <dir>/<step>.jsonl) and
        trainer.log_val_generations (a fixed choice of samples to the loggers)."""
        t = self.cfg.trainer
        if t.validation_data_dir:
            write_generations(t.validation_data_dir, self.step, rollout, self.tokenizer)
        if t.log_val_generations > 0:
            rows = generation_rows(rollout, self.tokenizer)
            self.tracker.log_samples(self.step, pick_samples(rows, t.log_val_generations, t.seed))

    def pad_for_ranks(self, prompts: list[PromptSample], n: int) -> list[PromptSample]:
        """Repeat prompts at the end until the samples split evenly over the ranks:
        every rank must generate."""
        world = self.cfg.world_size
        extra = 0
        while (len(prompts) + extra) * n % world:
            extra += 1
        return prompts + [prompts[i % len(prompts)] for i in range(extra)]


def sampling_params(
    settings: RolloutConfig | SamplingConfig, max_new_tokens: int, ignore_eos: bool = False
) -> SamplingParams:
    """Training (``rollout.*``) or validation (``rollout.val_kwargs.*``) sampling."""
    return SamplingParams(
        n=settings.n,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        do_sample=settings.do_sample,
        max_new_tokens=max_new_tokens,
        ignore_eos=ignore_eos,
    )
