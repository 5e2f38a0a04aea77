"""The HF rollout as a sample stream (``engine.rollout.stream``): every ``step`` extends
each sample in flight by up to ``chunk_tokens`` tokens, the rows as one batch (in
micro-batches of the rollout's ``micro_batch_size``), and new samples join at the next
step. HF ``generate`` keeps no cache between calls, so a step feeds each row's prompt
and its tokens so far again: a shorter chunk lets new weights and new samples in
sooner, at the cost of that prefill."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.rollout.base import finish_row
from engine.rollout.hf import HFRollout
from engine.rollout.stream import StreamDone, StreamItem, add_run
from engine.types import SamplingParams


@dataclass
class _Sample:
    item: StreamItem
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    runs: list[tuple[int, int]] = field(default_factory=list)


class HFSampleStream:
    def __init__(self, rollout: HFRollout, chunk_tokens: int) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
        self.rollout = rollout
        self.chunk_tokens = chunk_tokens
        self.sampling: SamplingParams | None = None
        self._live: list[_Sample] = []

    @property
    def in_flight(self) -> int:
        return len(self._live)

    def add(self, items: list[StreamItem], sampling: SamplingParams) -> None:
        self.sampling = sampling
        self._live += [_Sample(item) for item in items]

    def drop(self) -> None:
        self._live = []

    @torch.no_grad()
    def step(self, version: int) -> list[StreamDone]:
        if not self._live:
            return []
        assert self.sampling is not None
        sampling, rollout = self.sampling, self.rollout
        budget = sampling.max_new_tokens
        width = min(self.chunk_tokens, max(budget - len(s.tokens) for s in self._live))
        chunk = SamplingParams(**{**vars(sampling), "max_new_tokens": width})
        module = rollout.module
        was_training = module.training
        module.eval()
        outputs: list[tuple[list[int], list[float] | None]] = []
        try:
            with rollout.session():
                model = rollout.model_for_generation()
                size = rollout.micro_batch_size or len(self._live)
                for start in range(0, len(self._live), size):
                    part = self._live[start : start + size]
                    rows, lps = rollout._generate_chunk(
                        model, [s.item.prompt_ids + s.tokens for s in part], chunk
                    )
                    outputs += zip(rows, lps, strict=True)
        finally:
            module.train(was_training)
        done, live = [], []
        for sample, (row, lps) in zip(self._live, outputs, strict=True):
            room = budget - len(sample.tokens)
            tokens, lps, ended = finish_row(
                row[:room], lps[:room] if lps else lps, rollout.eos_token_ids, sampling.ignore_eos
            )
            sample.tokens += tokens
            sample.logprobs += lps or []
            add_run(sample.runs, version, len(tokens))
            if ended or len(sample.tokens) >= budget:
                done.append(
                    StreamDone(
                        sample.item.uid,
                        sample.tokens,
                        ended,
                        sample.logprobs if rollout.logprobs else None,
                        sample.runs,
                    )
                )
            else:
                live.append(sample)
        self._live = live
        return done
