"""vLLM serving turns as they come: requests added to its engine one at a time and
completions taken as they finish, so a multi-turn trajectory takes its next turn as soon
as its own tools have answered (``engine.rollout.turn_stream``), never waiting for the
slowest trajectory of a batch. Uses ``LLM.llm_engine`` (``add_request``, ``step``,
``abort_request``), the engine ``LLM.generate`` itself drives, in-process.

``VLLMSampleStream`` serves the fully asynchronous mode's samples the same way
(``engine.rollout.stream``), each token tagged with the weights version that made it."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.rollout.base import finish_row
from engine.rollout.stream import StreamDone, StreamItem, add_run, cut_runs
from engine.rollout.turn_stream import Completion
from engine.rollout.vllm_outputs import finish_completion
from engine.types import SamplingParams


class VLLMTurnStream:
    def __init__(
        self,
        llm_engine: Any,
        params_for: Callable[[SamplingParams], Any],
        eos_token_ids: set[int],
        want_logprobs: bool,
        lora_request: Any = None,
    ) -> None:
        self.engine = llm_engine
        self.lora_request = lora_request  # a LoRA actor's adapter (rollout.lora_as_adapter)
        self.params_for = params_for
        self.eos_token_ids = eos_token_ids
        self.want_logprobs = want_logprobs
        self._ids = itertools.count()
        self._pending: dict[str, bool] = {}  # handle -> ignore_eos

    def submit(self, prompt_ids: list[int], sampling: SamplingParams) -> str:
        from vllm.inputs import TokensPrompt

        handle = f"turn-{next(self._ids)}"
        self.engine.add_request(
            handle,
            TokensPrompt(prompt_token_ids=list(prompt_ids)),
            self.params_for(sampling),
            lora_request=self.lora_request,
        )
        self._pending[handle] = sampling.ignore_eos
        return handle

    def step(self) -> list[Completion]:
        """One engine step; the turns that finished in it."""
        done = []
        for output in self.engine.step():
            if not output.finished or output.request_id not in self._pending:
                continue
            ignore_eos = self._pending.pop(output.request_id)
            tokens, lps, finished = finish_completion(
                output.outputs[0], self.eos_token_ids, ignore_eos, self.want_logprobs
            )
            done.append(Completion(output.request_id, tokens, lps, finished))
        return done

    def abort(self) -> None:
        """Drop the turns still generating (the run stopped with an error)."""
        if self._pending:
            self.engine.abort_request(list(self._pending))
            self._pending.clear()


class VLLMSampleStream:
    """vLLM's engine as a sample stream (``engine.rollout.stream``): each sample is a
    request of its own, and ``step`` is one engine step. Outputs come as deltas, so that
    each step's new tokens can be tagged with the weights version that made them."""

    def __init__(
        self,
        llm_engine: Any,
        params_for: Callable[[SamplingParams], Any],
        eos_token_ids: set[int],
        want_logprobs: bool,
        lora_request: Callable[[], Any] = lambda: None,
    ) -> None:
        self.engine = llm_engine
        # A LoRA actor's adapter (rollout.lora_as_adapter), asked for at each add: a
        # sample starts under the version served then, and goes on under each later one
        # (they replace it under the same id, engine.rollout.vllm_lora).
        self.lora_request = lora_request
        self.params_for = params_for
        self.eos_token_ids = eos_token_ids
        self.want_logprobs = want_logprobs
        self._live: dict[str, _Live] = {}

    @property
    def in_flight(self) -> int:
        return len(self._live)

    def add(self, items: list[StreamItem], sampling: SamplingParams) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = self.params_for(sampling)
        params.output_kind = RequestOutputKind.DELTA
        lora = self.lora_request()
        for item in items:
            handle = f"sample-{item.uid}"
            self.engine.add_request(
                handle,
                TokensPrompt(prompt_token_ids=list(item.prompt_ids)),
                params,
                lora_request=lora,
            )
            self._live[handle] = _Live(item.uid, sampling.ignore_eos)

    def step(self, version: int) -> list[StreamDone]:
        done = []
        for output in self.engine.step():
            live = self._live.get(output.request_id)
            if live is None:
                continue
            completion = output.outputs[0]
            new = list(completion.token_ids)
            live.tokens += new
            if self.want_logprobs:
                live.logprobs += [
                    step[token].logprob
                    for token, step in zip(new, completion.logprobs, strict=True)
                ]
            add_run(live.runs, version, len(new))
            if not output.finished:
                continue
            del self._live[output.request_id]
            tokens, lps, finished = finish_row(
                live.tokens,
                live.logprobs if self.want_logprobs else None,
                self.eos_token_ids,
                live.ignore_eos,
            )
            done.append(
                StreamDone(live.uid, tokens, finished, lps, cut_runs(live.runs, len(tokens)))
            )
        return done

    def drop(self) -> None:
        if self._live:
            self.engine.abort_request(list(self._live))
            self._live.clear()


@dataclass
class _Live:
    uid: int
    ignore_eos: bool
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    runs: list[tuple[int, int]] = field(default_factory=list)
