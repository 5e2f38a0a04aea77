"""Generation overlapped with training (``async_training``; docs/async.md).

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
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.metrics import STALENESS
from engine.types import GenerationRequest

if TYPE_CHECKING:
    from engine.batch import Rollout
    from engine.data.dataset import PromptSample
    from engine.metrics import StageTimer
    from engine.trainer import Trainer


@dataclass
class Generating:
    """A generation sent to the rollout and not yet waited for."""

    expanded: list[PromptSample]  # each prompt n times, in the request's order
    request: GenerationRequest
    pending: Any  # engine.controller.worker_group.Pending
    n: int
    version: int  # the actor's weights version the rollout generates with


class OneStepOff:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.pending: Generating | None = None
        self._loader_before: dict[str, Any] | None = None  # before the pending batch's prompts

    def next_batch(self, timer: StageTimer, metrics: dict[str, float]) -> Rollout:
        """This step's batch (generated during the last step), after starting the next."""
        t = self.trainer
        if self.pending is None:  # the first step (or the first after a resume)
            self.pending = self._start()
        done = self.pending
        with timer("wait_prev_gen"):
            output = done.pending.result()
        metrics[STALENESS] = float(t.weights_version - done.version)
        # The next batch generates while this one is scored (a reward model on the
        # training workers) and trained; none after the last step. The scoring says
        # whether it overlapped (timing_s/reward_overlapped).
        self.pending = self._start() if t.step < t.total_steps else None
        generating = self.pending is not None
        return t.scorer.rollout(done.expanded, done.n, output, timer, generating)

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The loader's state to save, and the trainer state's ``extra`` (none here)."""
        t = self.trainer
        if self.pending is None or self._loader_before is None:
            return t.train_loader.state_dict(), {}
        return self._loader_before, {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Nothing: the loader's state already draws the pending batch again."""

    def rollout_exclusive(self) -> contextlib.AbstractContextManager[None]:
        """Validation's generation queues behind the pending one on the rollout workers."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Nothing runs beside the trainer."""

    def _start(self) -> Generating:
        t = self.trainer
        self._loader_before = t.train_loader.state_dict()
        return t.start_generation(t.next_prompts(), t.sampling)


def make_overlap(trainer: Trainer, mode: str) -> Any:
    """The trainer's source of batches for an ``async_training.mode`` (None: sync)."""
    if mode == "one_step_off":
        return OneStepOff(trainer)
    if mode == "fully_async":
        from engine.fully_async import FullyAsync

        return FullyAsync(trainer)
    return None
