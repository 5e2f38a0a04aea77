"""vLLM serving turns as they come: requests added to its engine one at a time and
completions taken as they finish, so a multi-turn trajectory takes its next turn as soon
as its own tools have answered (``engine.agents.streaming``), never waiting for the
slowest trajectory of a batch. Uses ``LLM.llm_engine`` (``add_request``, ``step``,
``abort_request``), the engine ``LLM.generate`` itself drives, in-process."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from engine.agents.streaming import Completion
from engine.rollout.vllm import finish_completion
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
