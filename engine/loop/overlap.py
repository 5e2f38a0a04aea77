"""How generation and training take turns (``async_training.mode``; docs/async.md): each
mode is a strategy behind ``Overlap``, the trainer's one source of batches.

``sync``: each step generates its batch, then trains on it (with DAPO's dynamic
sampling, it draws prompt batches until enough groups have rewards that differ).

``one_step_off`` (verl's one-step-off-policy trainer, after AReaL): the rollout has
workers of its own (``rollout.placement=separate``), and while the actor trains on batch
k the rollout already generates batch k+1, with the weights of the update before:

    step 1   push v0, generate b0 | wait b0 | push v0, generate b1 ‖ train b0 -> v1
    step 2                          wait b1 | push v1, generate b2 ‖ train b1 -> v2
    step k                          wait bk-1 | push vk-1, generate bk ‖ train bk-1 -> vk

The next generation starts as soon as batch k has come back, before batch k is scored:
a reward model (on the training workers) scores it while the rollout generates, timed
as ``timing_s/reward_overlapped`` (every step but the last, which starts none).

So every batch is trained by weights one update newer than those that sampled it: the
PPO ratio takes the current weights as π_old (the proximal policy), and
``algorithm.rollout_correction`` corrects between them and the sampler when the engine's
own log-probs come back (``rollout.calculate_log_probs``). The step's wait for its batch
(``timing_s/gen``) is what generation costs beyond the training it hides behind.

A checkpoint taken while a batch is generating records the prompt loader from before it
drew that batch's prompts: a resume draws them again, so no prompt is lost or repeated.

``fully_async``: engine.loop.fully_async.

Each mode is given what it needs (``OverlapContext``), never the trainer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from engine.loop.batch import join_groups, split_groups
from engine.loop.metrics import STALENESS

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.controller.workers import Workers
    from engine.data.loader import PromptStream
    from engine.loop.batch import Rollout
    from engine.loop.generate import Generating, Generator
    from engine.loop.metrics import StageTimer
    from engine.loop.scoring import Scorer
    from engine.loop.weights_version import WeightsVersion
    from engine.types import SamplingParams


@dataclass(frozen=True)
class OverlapContext:
    """What a mode needs from the run: its config, workers, prompts, generation calls,
    scorer, weights version and the training sampling."""

    cfg: EngineConfig
    workers: Workers
    prompts: PromptStream
    generator: Generator
    scorer: Scorer
    weights: WeightsVersion
    sampling: SamplingParams


class Overlap(Protocol):
    # Generation runs beside training: the batches are off-policy (π_old is the weights
    # now), and the rollout's workers are busy during the step.
    overlapped: bool

    def next_batch(
        self, step: int, total_steps: int, timer: StageTimer, metrics: dict[str, float]
    ) -> Rollout:
        """Step ``step``'s scored batch."""
        ...

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The loader's state to save, and the trainer state's ``extra``."""
        ...

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """A checkpoint's ``extra`` (the loader's state is restored already)."""
        ...

    def rollout_exclusive(self) -> contextlib.AbstractContextManager[None]:
        """The rollout to the caller alone (validation)."""
        ...

    def close(self) -> None:
        """Stop what runs beside the trainer."""
        ...


class Synchronous:
    overlapped = False

    def __init__(self, ctx: OverlapContext) -> None:
        self.ctx = ctx

    def next_batch(
        self, step: int, total_steps: int, timer: StageTimer, metrics: dict[str, float]
    ) -> Rollout:
        """Generate and score one step's batch. With DAPO's dynamic sampling, keep
        drawing prompt batches until enough groups have rewards that differ."""
        ctx = self.ctx
        filt = ctx.cfg.algorithm.filter_groups
        want = ctx.cfg.data.train_batch_size
        if not filt.enable:
            return ctx.generator.generate(ctx.prompts.next(), ctx.sampling, timer)
        kept: list[Rollout] = []
        spare: list[Rollout] = []  # groups with equal rewards, used only to fill a shortfall
        num_kept = draws = 0
        while num_kept < want:
            if filt.max_num_gen_batches and draws >= filt.max_num_gen_batches:
                break
            draws += 1
            rollout = ctx.generator.generate(ctx.prompts.next(), ctx.sampling, timer)
            for group in split_groups(rollout, ctx.sampling.n):
                metric = group.acc_B if filt.metric == "acc" else group.scores_B
                (kept if metric.std() > 0 else spare).append(group)
            num_kept = len(kept)
        shortfall = max(0, want - len(kept))
        metrics["training/gen_batches"] = float(draws)
        metrics["training/filter_padded_groups"] = float(shortfall)
        return join_groups((kept + spare[:shortfall])[:want])

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.ctx.prompts.loader.state_dict(), {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Nothing: no prompts are drawn ahead."""

    def rollout_exclusive(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def close(self) -> None:
        """Nothing runs beside the trainer."""


class OneStepOff:
    overlapped = True

    def __init__(self, ctx: OverlapContext) -> None:
        self.ctx = ctx
        self.pending: Generating | None = None
        self._loader_before: dict[str, Any] | None = None  # before the pending batch's prompts

    def next_batch(
        self, step: int, total_steps: int, timer: StageTimer, metrics: dict[str, float]
    ) -> Rollout:
        """This step's batch (generated during the last step), after starting the next."""
        if self.pending is None:  # the first step (or the first after a resume)
            self.pending = self._start()
        done = self.pending
        with timer("wait_prev_gen"):
            output = done.pending.result()
        metrics[STALENESS] = float(self.ctx.weights.version - done.version)
        # The next batch generates while this one is scored (a reward model on the
        # training workers) and trained; none after the last step. The scoring says
        # whether it overlapped (timing_s/reward_overlapped).
        self.pending = self._start() if step < total_steps else None
        generating = self.pending is not None
        return self.ctx.scorer.rollout(done.expanded, done.n, output, timer, generating)

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The loader from before the pending batch drew its prompts (none extra)."""
        if self.pending is None or self._loader_before is None:
            return self.ctx.prompts.loader.state_dict(), {}
        return self._loader_before, {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Nothing: the loader's state already draws the pending batch again."""

    def rollout_exclusive(self) -> contextlib.AbstractContextManager[None]:
        """Validation's generation queues behind the pending one on the rollout workers."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Nothing runs beside the trainer."""

    def _start(self) -> Generating:
        ctx = self.ctx
        self._loader_before = ctx.prompts.loader.state_dict()
        return ctx.generator.start(ctx.prompts.next(), ctx.sampling)


def make_overlap(ctx: OverlapContext, mode: str) -> Overlap:
    """The trainer's source of batches for an ``async_training.mode``."""
    if mode == "one_step_off":
        return OneStepOff(ctx)
    if mode == "fully_async":
        from engine.loop.fully_async import FullyAsync  # its rollouter thread, only when asked

        return FullyAsync(ctx)
    return Synchronous(ctx)
