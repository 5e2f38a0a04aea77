"""How a role turns its logits into log-probs and entropy (verl's keys of the actor and
the reference): ``entropy_from_logits_with_chunking`` (the entropy over slices of
``entropy_from_logits_chunk_size`` positions, so that its (positions × vocabulary)
temporaries exist for one slice at a time), ``entropy_checkpointing`` (the entropy's
graph recomputed in the backward pass instead of kept: with chunking, one slice's at a
time) and ``use_torch_compile`` (the log-prob and entropy functions compiled with
torch.compile). The results are the same; memory and speed differ. FSDP roles read
them (``engine.train.forward``); the Megatron roles compute their vocabulary-parallel
logits their own way."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from engine.algo import entropy as logits_math


@dataclass(frozen=True)
class LogitOptions:
    entropy_chunk_size: int | None = None  # None: all positions at once
    entropy_checkpointing: bool = False
    compile: bool = False

    @classmethod
    def of(cls, role_cfg: Any) -> LogitOptions:
        """From a role's config (``ActorConfig``, ``RefConfig``)."""
        chunked = role_cfg.entropy_from_logits_with_chunking
        return cls(
            entropy_chunk_size=role_cfg.entropy_from_logits_chunk_size if chunked else None,
            entropy_checkpointing=role_cfg.entropy_checkpointing,
            compile=role_cfg.use_torch_compile,
        )

    def logprobs(self, logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        fn = (
            _compiled(logits_math.logprobs_from_logits)
            if self.compile
            else (logits_math.logprobs_from_logits)
        )
        return fn(logits_BTV, targets_BT)

    def entropy(self, logits_BTV: torch.Tensor) -> torch.Tensor:
        """The entropy at every position, chunked and checkpointed as asked."""
        fn: Callable[[torch.Tensor], torch.Tensor] = (
            _compiled(logits_math.entropy_from_logits) if self.compile
            else logits_math.entropy_from_logits
        )  # fmt: skip
        if not (
            self.entropy_checkpointing and torch.is_grad_enabled() and logits_BTV.requires_grad
        ):
            return fn(logits_BTV, self.entropy_chunk_size)
        size = self.entropy_chunk_size or logits_BTV.shape[-2]
        dim = logits_BTV.dim() - 2
        return torch.cat(
            [checkpoint(fn, piece, use_reentrant=False) for piece in logits_BTV.split(size, dim)],
            dim=dim,
        )


PLAIN = LogitOptions()  # all positions at once, nothing recomputed, nothing compiled


@functools.cache
def _compiled(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    # dynamic: the number of positions changes with every micro-batch
    return torch.compile(fn, dynamic=True)
