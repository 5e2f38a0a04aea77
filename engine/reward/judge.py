"""The generative reward model's part of scoring, on the controller: for the samples it
covers (``reward_model.data_sources``; null: all), the judge's prompts built and
tokenized with the judge's tokenizer, generated on the workers (``engine.workers.judge``),
decoded and parsed into rewards; the rule functions score the rest.

Counted for the step's metrics (``take_metrics``): verdicts the pattern did not parse,
prompts too long to judge, verdicts cut at ``judge.max_new_tokens``, and their lengths."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from engine.config import RewardModelConfig
from engine.reward.manager import RewardManager
from engine.reward.model_rows import even_for_ranks, scored_with_rules
from engine.reward.types import ScoreRequest, ScoreResult
from engine.reward.verdict import JudgePrompts, VerdictParser
from engine.types import GenerationOutput, GenerationRequest, SamplingParams

logger = logging.getLogger(__name__)

# The trainer's way to run the judge on the workers.
RunJudge = Callable[[GenerationRequest], GenerationOutput]


def load_judge_tokenizer(cfg: RewardModelConfig) -> Any:
    """The judge's tokenizer; a ConfigError naming the key when the chat template the
    config asks for is missing (a base model)."""
    from transformers import AutoTokenizer

    from engine.errors import ConfigError

    tokenizer = AutoTokenizer.from_pretrained(
        cfg.model.path, trust_remote_code=cfg.model.trust_remote_code
    )
    if cfg.judge.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            [
                f"reward_model.judge.apply_chat_template=true but the judge's tokenizer"
                f" ({cfg.model.path}) has no chat template: set"
                " reward_model.judge.apply_chat_template=false to send the raw prompt (a"
                " base model), or use an instruction-tuned judge"
            ]
        )
    return tokenizer


def judge_sampling(cfg: RewardModelConfig) -> SamplingParams:
    judge = cfg.judge
    return SamplingParams(
        n=1,
        temperature=judge.temperature if judge.temperature > 0 else 1.0,
        top_p=judge.top_p,
        do_sample=judge.temperature > 0,
        max_new_tokens=judge.max_new_tokens,
    )


class JudgeRewards:
    def __init__(self, cfg: RewardModelConfig, ranks: int, tokenizer: Any = None) -> None:
        self.ranks = ranks  # the prompts go evenly over the workers' ranks
        self.sources = None if cfg.data_sources is None else set(cfg.data_sources)
        self.tokenizer = tokenizer if tokenizer is not None else load_judge_tokenizer(cfg)
        self.prompts = JudgePrompts(cfg.judge, self.tokenizer)
        self.parse = VerdictParser(cfg.judge)
        self.sampling = judge_sampling(cfg)
        self.max_prompt_length = cfg.judge.max_prompt_length
        self.unparsed_score = cfg.judge.unparsed_score
        self._counts = _Counts()

    def covers(self, data_source: str) -> bool:
        return self.sources is None or data_source in self.sources

    def take_metrics(self) -> dict[str, float]:
        """The counts since the last call (a step's, over all its generations)."""
        counts, self._counts = self._counts, _Counts()
        return counts.metrics()

    def score(
        self,
        requests: list[ScoreRequest],
        prompt_ids: list[list[int]],
        responses: list[list[int]],
        messages: list[list[dict[str, Any]]],
        rules: RewardManager,
        run_judge: RunJudge,
    ) -> list[ScoreResult]:
        """Each request's result: the judge's reward (``acc`` the same: the judge's
        verdict is its call on correctness; ``extras["judge_score"]``, and
        ``extras["judge_unparsed"]`` 1 where it fell back) where it covers the data
        source, the rule functions' elsewhere; DAPO's overlong penalty on both."""
        return scored_with_rules(
            requests,
            self.covers,
            rules,
            lambda rows: self.judge(requests, messages, rows, run_judge),
        )

    def judge(
        self,
        requests: list[ScoreRequest],
        messages: list[list[dict[str, Any]]],
        rows: list[int],
        run_judge: RunJudge,
    ) -> list[ScoreResult]:
        texts = [
            self.prompts.text(messages[i], requests[i].response, requests[i].ground_truth)
            for i in rows
        ]
        ids = self.prompts.token_ids(texts)
        fits = [k for k, seq in enumerate(ids) if len(seq) <= self.max_prompt_length]
        self._counts.overlong += len(ids) - len(fits)
        if len(fits) < len(ids):
            logger.warning(
                "%d judge prompts are over reward_model.judge.max_prompt_length=%d tokens"
                " (the longest: %d) and score reward_model.judge.unparsed_score",
                len(ids) - len(fits),
                self.max_prompt_length,
                max(len(s) for s in ids),
            )
        verdicts: list[str | None] = [None] * len(ids)
        if fits:
            sent = [ids[k] for k in fits]
            output = run_judge(GenerationRequest(even_for_ranks(sent, self.ranks), self.sampling))
            decoded = self.tokenizer.batch_decode(
                output.response_ids[: len(sent)], skip_special_tokens=True
            )
            for k, text, done, tokens in zip(
                fits, decoded, output.finished, output.response_ids, strict=False
            ):
                verdicts[k] = text
                self._counts.lengths.append(len(tokens))
                self._counts.truncated += int(not done)
        results = []
        for text in verdicts:
            verdict = self.parse(text) if text is not None else None
            parsed = verdict is not None and verdict.parsed
            self._counts.unparsed += int(verdict is not None and not parsed)
            reward = verdict.reward if parsed else self.unparsed_score
            extras = {"judge_score": reward, "judge_unparsed": 0.0 if parsed else 1.0}
            results.append(ScoreResult(reward, reward, extras))
        return results


class _Counts:
    def __init__(self) -> None:
        self.unparsed = 0
        self.overlong = 0
        self.truncated = 0
        self.lengths: list[int] = []

    def metrics(self) -> dict[str, float]:
        judged = len(self.lengths)
        out = {
            "reward_model/judge_unparsed": float(self.unparsed),
            "reward_model/judge_overlong": float(self.overlong),
            "reward_model/judge_truncated": float(self.truncated),
        }
        if judged:
            out["reward_model/judge_response_length/mean"] = sum(self.lengths) / judged
        return out
