"""The fully asynchronous mode's side of the trainer (``async_training.mode=fully_async``;
docs/async.md): each step takes ``data.train_batch_size`` finished groups from the
rollouter (``engine.loop.rollouter``), which never stops generating, and every
``trigger_parameter_sync_step`` steps pushes the actor's weights to the rollout:

    sync v0 │ take b0 ─ train → v1 │ sync v1 │ take b1 ─ train → v2 │ ...
    rollout: generates without a break; parked only for the push (partial rollouts),
             or until its samples in flight finish first (partial_rollout=false)

Like one step off, π_old is the proximal policy (the weights now), and the rollout's own
log-probs, which travel with the batch, correct for the sampler
(``algorithm.rollout_correction``, or its bypass mode). The step logs the samples'
staleness (weights versions between the sampler's first token and the trainer),
how many came from more than one version (partial rollouts), the trainer's wait
(``timing_s/wait_batch``) and the rollout's idle share (``rollouter/idle_ratio``).

A checkpoint records the prompts drawn and not yet trained (in flight, finished, or
waiting to start) by dataset index, with the loader's state after them: a resume starts
those again first, so no prompt is lost or repeated.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from engine.config.async_training import admission_cap
from engine.data.dataset import PromptSample
from engine.loop.metrics import STALENESS
from engine.loop.rollouter import Rollouter
from engine.rollout.stream import StreamDone
from engine.types import GenerationOutput

if TYPE_CHECKING:
    from engine.loop.batch import Rollout
    from engine.loop.metrics import StageTimer
    from engine.loop.overlap import OverlapContext

PENDING = "fully_async_pending"  # the trainer state's extra: dataset indices, oldest first


class FullyAsync:
    overlapped = True

    def __init__(self, ctx: OverlapContext) -> None:
        self.ctx = ctx
        cfg = ctx.cfg
        self.cfg = cfg.async_training
        self.batch = cfg.data.train_batch_size
        self.logprobs = cfg.actor_rollout_ref.rollout.calculate_log_probs
        self.rollouter: Rollouter | None = None
        self._resumed: list[PromptSample] = []  # a checkpoint's prompts, started first
        self._since_sync = 0  # batches taken since the last sync
        self._last_take = time.perf_counter()

    def next_batch(
        self, step: int, total_steps: int, timer: StageTimer, metrics: dict[str, float]
    ) -> Rollout:
        ctx = self.ctx
        if self.rollouter is None:
            with timer("sync_weights"):
                self._start()
        elif self._since_sync >= self.cfg.trigger_parameter_sync_step:
            with timer("sync_weights"):
                self._sync()
        assert self.rollouter is not None
        with timer("wait_batch"):
            groups = self.rollouter.take(self.batch)
        self._since_sync += 1
        now = time.perf_counter()
        metrics["rollouter/idle_ratio"] = self.rollouter.idle_seconds() / max(
            now - self._last_take, 1e-9
        )
        self._last_take = now
        n = ctx.sampling.n
        expanded = [g.prompt for g in groups for _ in range(n)]
        samples = [g.samples[j] for g in groups for j in range(n)]
        metrics |= staleness_metrics(samples, ctx.weights.version)
        output = GenerationOutput(
            response_ids=[s.response_ids for s in samples],
            finished=[s.finished for s in samples],
            logprobs=[s.logprobs or [] for s in samples] if self.logprobs else None,
        )
        return ctx.scorer.rollout(expanded, n, output, timer)

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The loader's state and the prompts drawn ahead of it, taken together (the
        rollouter draws under the same lock)."""
        loader = self.ctx.prompts.loader
        if self.rollouter is None:
            return loader.state_dict(), {PENDING: [p.index for p in self._resumed]}
        with self.rollouter.lock:
            return loader.state_dict(), {PENDING: [p.index for p in self.rollouter.pending()]}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        dataset = self.ctx.prompts.loader.dataset
        self._resumed = [dataset[i] for i in state.get(PENDING, [])]

    @contextlib.contextmanager
    def rollout_exclusive(self) -> Iterator[None]:
        """The rollout to itself (validation): the samples in flight finish first and
        none start until it is over; what it pushes starts a new sync interval."""
        if self.rollouter is None:
            yield
            return
        self.rollouter.pause(drain=True)
        yield
        self.rollouter.resume()
        self._since_sync = 0

    def close(self) -> None:
        if self.rollouter is not None:
            self.rollouter.stop()

    def _start(self) -> None:
        ctx = self.ctx
        ctx.weights.push(ctx.workers)
        self.rollouter = Rollouter(
            ctx.workers,
            ctx.workers.group_of("rollout").world_size,
            ctx.prompts.next,
            ctx.sampling,
            admission_cap(ctx.cfg),
            ctx.weights,
            pending=self._resumed,
        )
        self._resumed = []
        self.rollouter.resume()
        self._last_take = time.perf_counter()

    def _sync(self) -> None:
        assert self.rollouter is not None
        self.rollouter.pause(drain=not self.cfg.partial_rollout)
        self.ctx.weights.push(self.ctx.workers)
        self.rollouter.resume()
        self._since_sync = 0


def staleness_metrics(samples: list[StreamDone], trainer_version: int) -> dict[str, float]:
    """How old the batch's samples are, in weights versions, against the trainer's."""
    ages = [trainer_version - s.first_version for s in samples]
    spans = [s.last_version - s.first_version for s in samples]
    return {
        STALENESS: sum(ages) / len(ages),
        "training/staleness_max": float(max(ages)),
        "training/stale_samples": float(sum(age > 0 for age in ages)),
        "training/partial_ratio": sum(span > 0 for span in spans) / len(spans),
        "training/max_partial_span": float(max(spans)),
    }
