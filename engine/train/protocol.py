"""``TrainEngine``: what the actor, critic and reference workers ask of a training backend
(``FSDPEngine``, ``MegatronEngine``; engine.train.engines builds one), beside the
rollout's ``RolloutEngine`` (engine.rollout.base). Per-token results are (B, R) over the
batch's response positions, 0 on padding; Megatron's stages before the last return
placeholders the controller never reads. The LoRA methods (``adapter_disabled``, the
base and adapter tensors) are FSDP's alone: LoRA runs under FSDP2 only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from engine.algo.aggregate import LossScale
from engine.types import TokenBatch


class TrainEngine(Protocol):
    module: nn.Module  # what runs forward (a colocated HF rollout's too)

    @property
    def dp_size(self) -> int: ...  # ranks holding different rows

    @property
    def lr(self) -> float: ...

    def train(self) -> None: ...

    def eval(self) -> None: ...

    def response_logprobs(
        self,
        tokens: TokenBatch,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def response_logprobs_at(
        self,
        tokens: TokenBatch,
        ids_BRK: torch.Tensor,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]: ...

    def response_logprobs_sum_pi_squared(
        self, tokens: TokenBatch, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def response_values(self, tokens: TokenBatch) -> torch.Tensor: ...

    def global_loss_scale(self, mask_BR: torch.Tensor) -> LossScale: ...

    def forward_backward(
        self, micro_batches: Sequence[Any], step: Callable[[Any], torch.Tensor]
    ) -> None: ...

    def updating(self) -> contextlib.AbstractContextManager: ...

    def optimizer_step(self, grad_clip: float) -> float: ...

    def lr_scheduler_step(self) -> None: ...

    def hf_named_tensors(
        self, dtype: torch.dtype | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]: ...

    def save(self, path: str, extra: dict | None = None, tokenizer: object = None) -> None: ...

    def load(self, path: str) -> dict: ...
