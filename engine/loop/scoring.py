"""Scoring generated responses, on the controller: each response decoded and scored by
the rule functions (``engine.reward.manager``) or, for the data sources it covers, by a
learned reward model or a judge whose passes run on the workers' ``rm`` role
(``engine.reward.model``, ``engine.reward.judge``); the scores make the step's
``Rollout``. Also GDPO's reward components, read from what the functions returned."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from engine.config import EngineConfig
from engine.controller.workers import Workers
from engine.data.dataset import PromptSample
from engine.errors import EngineError
from engine.loop.batch import Rollout
from engine.loop.metrics import StageTimer
from engine.reward.judge import JudgeRewards
from engine.reward.manager import RewardManager
from engine.reward.model import model_rewards
from engine.reward.types import ScoreRequest, ScoreResult
from engine.types import GenerationOutput, ImageInputs, SampleMeta

# Scoring that began while the rollout was generating another batch (one_step_off's
# next): hidden behind generation, not added to the step's wait for it.
OVERLAPPED = "reward_overlapped"


class Scorer:
    def __init__(
        self,
        cfg: EngineConfig,
        rules: RewardManager,
        tokenizer: Any,
        workers: Workers,
        judge_tokenizer: Any = None,
    ) -> None:
        """``judge_tokenizer``: a generative reward model's (loaded once, at start, where
        its chat template is checked); loaded here when not given."""
        self.rules = rules
        self.tokenizer = tokenizer
        self.workers = workers
        self.model = model_rewards(cfg, tokenizer, judge_tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else tokenizer.eos_token_id

    def rollout(
        self,
        expanded: list[PromptSample],
        n: int,
        output: GenerationOutput,
        timer: StageTimer,
        generating: bool = False,
    ) -> Rollout:
        """The rollout of ``expanded`` (each prompt ``n`` times, adjacent), scored;
        ``generating``: the rollout generates another batch meanwhile, so the scoring
        is timed as ``timing_s/reward_overlapped`` too."""
        meta = SampleMeta(
            group_ids=[i // n for i in range(len(expanded))],
            data_source=[p.data_source for p in expanded],
            ground_truth=[p.ground_truth for p in expanded],
            # an interaction's score of each answer reaches the reward function (verl's key)
            extra_info=[
                {**p.extra_info, "turn_scores": output.turn_scores[i]}
                if output.turn_scores is not None
                else p.extra_info
                for i, p in enumerate(expanded)
            ],
            messages=[p.messages for p in expanded],
        )
        overlapped = timer(OVERLAPPED) if generating else contextlib.nullcontext()
        with timer("reward"), overlapped:
            results = self.score(output.response_ids, meta, [p.prompt_ids for p in expanded])
        return Rollout(
            prompt_ids=[p.prompt_ids for p in expanded],
            response_ids=output.response_ids,
            meta=meta,
            scores_B=torch.tensor([r.score for r in results], dtype=torch.float32),
            acc_B=torch.tensor([r.acc for r in results], dtype=torch.float32),
            preds=[r.pred for r in results],
            reward_extras=[None if r.error else r.extras for r in results],
            pad_token_id=self.pad_token_id,
            rollout_logprobs=output.logprobs,
            response_masks=output.response_mask,
            agent_stats=output.agent_stats,
            prompt_index=[p.index for p in expanded],
            routed_experts=output.routed_experts,
            images=prompt_images(expanded),
        )

    def score(
        self, responses: list[list[int]], meta: SampleMeta, prompt_ids: list[list[int]]
    ) -> list[ScoreResult]:
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        requests = [
            ScoreRequest(
                data_source=meta.data_source[i],
                response=texts[i],
                ground_truth=meta.ground_truth[i],
                extra_info=meta.extra_info[i],
                response_length=len(responses[i]),
            )
            for i in range(len(responses))
        ]
        if self.model is None:
            return self.rules.score(requests)
        # the judge generates verdicts (engine.workers.judge); a classifier scores
        method = "generate" if isinstance(self.model, JudgeRewards) else "scores"
        return self.model.score(
            requests,
            prompt_ids,
            responses,
            meta.messages,
            self.rules,
            lambda batch: self.workers.call_split("rm", method, batch),
        )

    def judge_metrics(self, prefix: str = "") -> dict[str, float]:
        """The judge's counts since the last call (unparsed verdicts...); none without one."""
        if not isinstance(self.model, JudgeRewards):
            return {}
        return {prefix + k: v for k, v in self.model.take_metrics().items()}


def prompt_images(prompts: list[PromptSample]) -> list[ImageInputs | None] | None:
    """Each prompt's images, or None when none has any (a text-only batch)."""
    images = [p.images for p in prompts]
    return images if any(i is not None for i in images) else None


def reward_components(rollout: Rollout, keys: list[str], metrics: dict[str, float]) -> torch.Tensor:
    """(B, K): each sample's value of each of ``keys`` among the numbers its reward
    function returned (GDPO), with their mean, std, max and min in ``metrics``
    (``gdpo/KEY/...``, verl's names). A sample whose scorer failed scores 0 on every key,
    as its score is 0; a key missing from a sample that was scored is an error."""
    rows = []
    for i, extras in enumerate(rollout.reward_extras):
        if extras is None:
            rows.append([0.0] * len(keys))
            continue
        missing = [key for key in keys if key not in extras]
        if missing:
            raise EngineError(
                f"algorithm.gdpo_reward_keys names {missing}, which the reward function did"
                f" not return for a sample of {rollout.meta.data_source[i]!r} (it returned"
                f" {sorted(extras)}): return each key as a number in the reward function's"
                " dict, or fix algorithm.gdpo_reward_keys"
            )
        rows.append([extras[key] for key in keys])
    components = torch.tensor(rows, dtype=torch.float32).reshape(len(rows), len(keys))
    for k, key in enumerate(keys):
        column = components[:, k]
        metrics[f"gdpo/{key}/mean"] = float(column.mean())
        metrics[f"gdpo/{key}/std"] = float(column.std()) if len(column) > 1 else 0.0
        metrics[f"gdpo/{key}/max"] = float(column.max())
        metrics[f"gdpo/{key}/min"] = float(column.min())
    return components
