"""Conversations as the ``TokenBatch`` the training engines take (``engine.types``), and
the validation set cut into batches every data-parallel rank can take.

A conversation is split where its loss starts: the tokens before its first loss token
are the batch's prompt (left-padded), the rest its response (right-padded), the loss
mask the response mask. The engines then compute log-probs only at the positions that
predict response tokens (the system prompt and the first question cost no LM-head
work), and later user and tool turns inside the response carry mask 0, as the tool
turns of a multi-turn rollout do. Packing (``model.use_remove_padding``) lays the rows
end to end without any padding at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.sft.conversation import Conversation
from engine.types import TokenBatch


def token_batch(conversations: Sequence[Conversation], pad_token_id: int) -> TokenBatch:
    prompts, responses, masks = [], [], []
    for c in conversations:
        first = next((i for i, m in enumerate(c.loss_mask) if m), len(c))
        cut = max(1, min(first, len(c) - 1))  # token 0 is never predicted: it opens the prompt
        prompts.append(c.ids[:cut])
        responses.append(c.ids[cut:])
        masks.append(c.loss_mask[cut:])
    return TokenBatch.from_ragged(prompts, responses, pad_token_id, masks)


def evenly(conversations: list[Conversation], ranks: int) -> list[Conversation]:
    """``conversations`` padded to a multiple of ``ranks`` with copies that carry no
    loss (every data-parallel rank must run the same passes; the copies count nothing)."""
    short = -len(conversations) % ranks
    fill = [Conversation(c.ids, [0] * len(c)) for c in (conversations * ranks)[:short]]
    return conversations + fill


def chunks(rows: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, rows)) for i in range(0, rows, size)]
