"""Rollout with Hugging Face ``generate`` on the actor's own (FSDP) module.

Slow next to vLLM/SGLang, but exact, dependency-free and runs anywhere torch
does: the CPU quickstart, tests, and small models. Generation gathers the full
parameters once (``full_parameters``), so ranks may stop at different lengths.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from engine.rollout.base import trim_response
from engine.train.fsdp import full_parameters
from engine.types import GenerationOutput, GenerationRequest, SamplingParams


def eos_ids(tokenizer: Any, model: nn.Module) -> set[int]:
    """Every id that ends a response: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, gen_eos):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    return ids


class HFRollout:
    def __init__(
        self,
        module: nn.Module,
        tokenizer: Any,
        device: torch.device,
        micro_batch_size: int | None = None,
    ) -> None:
        self.module = module
        self.device = device
        self.micro_batch_size = micro_batch_size
        self.eos_token_ids = eos_ids(tokenizer, module)
        if not self.eos_token_ids:
            raise ValueError("the tokenizer defines no EOS token; responses would never end")
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else min(self.eos_token_ids)

    @torch.no_grad()
    def generate(self, request: GenerationRequest) -> GenerationOutput:
        responses: list[list[int]] = []
        finished: list[bool] = []
        was_training = self.module.training
        self.module.eval()
        try:
            with full_parameters(self.module):
                prompts = request.prompt_ids
                step = self.micro_batch_size or max(1, len(prompts))
                for start in range(0, len(prompts), step):
                    chunk = prompts[start : start + step]
                    for row in self._generate_chunk(chunk, request.sampling):
                        tokens, done = trim_response(
                            row, self.eos_token_ids, request.sampling.ignore_eos
                        )
                        responses.append(tokens)
                        finished.append(done)
        finally:
            self.module.train(was_training)
        return GenerationOutput(response_ids=responses, finished=finished)

    def _generate_chunk(
        self, prompts: list[list[int]], sampling: SamplingParams
    ) -> list[list[int]]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
            attention[i, width - len(prompt) :] = 1
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "do_sample": sampling.do_sample,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": None if sampling.ignore_eos else sorted(self.eos_token_ids),
            "use_cache": True,
        }
        if sampling.do_sample:
            kwargs.update(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else None,
            )
        else:  # greedy: clear the model's own sampling defaults so none leaks in
            kwargs.update(temperature=None, top_p=None, top_k=None)
        out = self.module.generate(
            input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device), **kwargs
        )
        return out[:, width:].tolist()

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Nothing to copy: generation runs on the actor's module."""

    def sleep(self) -> None:
        """Nothing to free: HF generate keeps no cache between calls."""

    def wake(self) -> None:
        """Nothing to restore."""
