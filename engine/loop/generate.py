"""The controller's generation calls: prompts sent to the rollout (each ``n`` times), the
actor's weights pushed first where the rollout has its own, the output scored. Started
and finished apart, so that an overlap mode (engine.loop.overlap) can generate during
training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.loop.scoring import prompt_images
from engine.types import GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.controller.worker_group import Pending
    from engine.controller.workers import Workers
    from engine.data.dataset import PromptSample
    from engine.loop.batch import Rollout
    from engine.loop.metrics import StageTimer
    from engine.loop.scoring import Scorer
    from engine.loop.weights_version import WeightsVersion


@dataclass
class Generating:
    """A generation sent to the rollout and not yet waited for."""

    expanded: list[PromptSample]  # each prompt n times, in the request's order
    request: GenerationRequest
    pending: Pending
    n: int
    version: int  # the actor's weights version the rollout generates with


class Generator:
    def __init__(
        self, cfg: EngineConfig, workers: Workers, scorer: Scorer, weights: WeightsVersion
    ) -> None:
        self.multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
        self.workers = workers
        self.scorer = scorer
        self.weights = weights

    def start(self, prompts: list[PromptSample], sampling: SamplingParams) -> Generating:
        """Send the prompts (each ``sampling.n`` times) to the rollout; not waited for."""
        expanded = [p for p in prompts for _ in range(sampling.n)]
        request = GenerationRequest(
            [p.prompt_ids for p in expanded], sampling, images=prompt_images(expanded)
        )
        if self.multi_turn.enable:
            default = self.multi_turn.default_agent
            request.agent_names = [p.agent_name or default for p in expanded]
            request.extra_info = [p.extra_info for p in expanded]
        self.weights.push(self.workers)
        pending = self.workers.submit_split("rollout", "generate", request)
        return Generating(expanded, request, pending, sampling.n, self.weights.version)

    def finish(self, started: Generating, timer: StageTimer) -> Rollout:
        """Wait for a generation and score it."""
        output = started.pending.result()
        return self.scorer.rollout(started.expanded, started.n, output, timer)

    def generate(
        self, prompts: list[PromptSample], sampling: SamplingParams, timer: StageTimer
    ) -> Rollout:
        return self.finish(self.start(prompts, sampling), timer)
