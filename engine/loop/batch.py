"""A generated and scored batch on the controller (``Rollout``), and the group-wise
slicing DAPO's dynamic sampling does on it."""

from __future__ import annotations

import dataclasses
import functools

import torch

from engine.controller.dispatch import concat, split
from engine.types import ImageInputs, SampleMeta, TokenBatch


@dataclasses.dataclass
class Rollout:
    """A generated and scored batch, on the controller. Ragged token lists are the
    source of truth; the padded ``tokens`` are derived, so slicing and joining
    batches (DAPO's group filter) never has to re-pad by hand."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    meta: SampleMeta
    scores_B: torch.Tensor
    acc_B: torch.Tensor
    preds: list[str | None]  # each sample's extracted answer, when the scorer gives one
    # the other numbers each sample's reward function returned (None where it failed)
    reward_extras: list[dict[str, float] | None]
    pad_token_id: int
    # The engine's log-prob of each response token (rollout.calculate_log_probs), or None
    rollout_logprobs: list[list[float]] | None = None
    # Multi-turn rows (engine.agents): 0 on the tools' tokens; their per-row statistics
    response_masks: list[list[int]] | None = None
    agent_stats: list[dict[str, float]] | None = None
    prompt_index: list[int] | None = None  # each sample's prompt, in its dataset
    # The rollout engine's MoE routing of each sample's tokens (routing replay R3)
    routed_experts: list[torch.Tensor] | None = None
    # A vision-language model's: each sample's prompt's images (None: a row without)
    images: list[ImageInputs | None] | None = None

    @functools.cached_property
    def tokens(self) -> TokenBatch:
        return TokenBatch.from_ragged(
            self.prompt_ids,
            self.response_ids,
            self.pad_token_id,
            self.response_masks,
            routed_experts=self.routed_experts,
            images=self.images,
        )

    @property
    def prompt_lengths_B(self) -> torch.Tensor:
        return torch.tensor([len(p) for p in self.prompt_ids], dtype=torch.float32)

    def __len__(self) -> int:
        return len(self.prompt_ids)


def split_groups(rollout: Rollout, n: int) -> list[Rollout]:
    return split(rollout, len(rollout) // n)


def join_groups(groups: list[Rollout]) -> Rollout:
    """Concatenate groups into one batch, group ids renumbered."""
    joined = concat(groups)
    n = len(groups[0])
    joined.meta.group_ids = [i // n for i in range(len(joined))]
    return joined
