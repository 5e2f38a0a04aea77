"""A learned reward model's part of scoring, on the controller: which samples it scores
(``reward_model.data_sources``; null: all, as in verl), the token sequences it reads, and
its scores merged with the rule functions' for the rest.

The sequences are the policy's own prompt and response tokens, unless
``reward_model.model.input_tokenizer`` says the tokenizers differ: then each response is
decoded with the policy's tokenizer and the chat (the prompt's messages, then the response
as the assistant's turn) is templated and tokenized with the reward model's tokenizer.
The forward passes run on the workers (``engine.workers.reward_model``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.config import EngineConfig, RewardModelConfig
from engine.reward.manager import RewardManager
from engine.reward.model_rows import even_for_ranks, scored_with_rules
from engine.reward.types import ScoreRequest, ScoreResult

# The trainer's way to run the reward model on the workers: sequences -> (B,) scores.
RunModel = Callable[[list[list[int]]], torch.Tensor]


def model_rewards(cfg: EngineConfig, tokenizer: Any, judge_tokenizer: Any = None) -> Any:
    """The learned reward model's part of scoring, of ``reward_model.style`` (a
    ``ModelRewards`` or an ``engine.reward.judge.JudgeRewards``, with ``judge_tokenizer``
    when it was loaded already); None without one."""
    rm = cfg.reward_model
    if not rm.enable:
        return None
    if rm.style == "generative":
        from engine.reward.judge import JudgeRewards

        return JudgeRewards(rm, cfg.rm_world_size, judge_tokenizer)
    return ModelRewards(rm, tokenizer, cfg.rm_world_size)


class ModelRewards:
    def __init__(self, cfg: RewardModelConfig, policy_tokenizer: Any, ranks: int) -> None:
        self.ranks = ranks  # the rows go evenly over the rm role's ranks
        self.sources = None if cfg.data_sources is None else set(cfg.data_sources)
        self.policy_tokenizer = policy_tokenizer
        self.rm_tokenizer = None
        if cfg.model.input_tokenizer is not None:
            from transformers import AutoTokenizer

            self.rm_tokenizer = AutoTokenizer.from_pretrained(
                cfg.model.path, trust_remote_code=cfg.model.trust_remote_code
            )

    def covers(self, data_source: str) -> bool:
        return self.sources is None or data_source in self.sources

    def sequences(
        self,
        prompt_ids: list[list[int]],
        responses: list[list[int]],
        messages: list[list[dict[str, Any]]],
    ) -> list[list[int]]:
        """What the reward model reads for each sample."""
        if self.rm_tokenizer is None:
            return [p + r for p, r in zip(prompt_ids, responses, strict=True)]
        texts = self.policy_tokenizer.batch_decode(responses, skip_special_tokens=True)
        chats = [
            self.rm_tokenizer.apply_chat_template(
                [*chat, {"role": "assistant", "content": text}], tokenize=False
            )
            for chat, text in zip(messages, texts, strict=True)
        ]
        # the template already holds any BOS: no second one from the tokenizer
        return self.rm_tokenizer(chats, add_special_tokens=False)["input_ids"]

    def score(
        self,
        requests: list[ScoreRequest],
        prompt_ids: list[list[int]],
        responses: list[list[int]],
        messages: list[list[dict[str, Any]]],
        rules: RewardManager,
        run_model: RunModel,
    ) -> list[ScoreResult]:
        """Each request's result: the reward model's score (``acc`` 0: no ground truth is
        checked; the score also in ``extras["rm_score"]``) where it covers the data
        source, the rule functions' elsewhere; DAPO's overlong penalty on both."""

        def score_rows(rows: list[int]) -> list[ScoreResult]:
            seqs = self.sequences(
                [prompt_ids[i] for i in rows],
                [responses[i] for i in rows],
                [messages[i] for i in rows] if self.rm_tokenizer is not None else [],
            )
            values = run_model(even_for_ranks(seqs, self.ranks))[: len(seqs)].tolist()
            return [ScoreResult(score=v, acc=0.0, extras={"rm_score": v}) for v in values]

        return scored_with_rules(requests, self.covers, rules, score_rows)
