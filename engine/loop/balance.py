"""``trainer.balance_batch``: reorder a step's samples so that each data-parallel rank's
contiguous share (``engine.controller.dispatch.split``) holds about the same number of
tokens. Every rank gets the same number of samples either way; without balancing, one
rank can draw the long responses and the others wait for it at every collective.

The partition: samples from the longest down, each to the rank with the fewest tokens
among those that still have room (a greedy "longest first" with equal counts, which is
within 4/3 of the best maximum load). The order within a rank keeps the batch's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def balanced_order(lengths: Sequence[int], parts: int) -> list[int]:
    """An order of the rows such that splitting it into ``parts`` contiguous equal chunks
    gives each chunk about the same sum of ``lengths``. ``parts`` must divide the rows."""
    rows = len(lengths)
    if parts < 1 or rows % parts:
        raise ValueError(f"{rows} rows cannot be split evenly over {parts} ranks")
    size = rows // parts
    loads = [0] * parts
    members: list[list[int]] = [[] for _ in range(parts)]
    for row in sorted(range(rows), key=lambda r: (-lengths[r], r)):
        open_parts = [p for p in range(parts) if len(members[p]) < size]
        part = min(open_parts, key=lambda p: (loads[p], p))
        members[part].append(row)
        loads[part] += lengths[row]
    return [row for part in members for row in sorted(part)]


def chunk_loads(lengths: Sequence[int], parts: int) -> list[int]:
    """The sum of ``lengths`` in each of ``parts`` contiguous equal chunks."""
    size = len(lengths) // parts
    return [sum(lengths[i * size : (i + 1) * size]) for i in range(parts)]


def reorder(batch: T, order: Sequence[int]) -> T:
    """``batch`` with its rows in ``order``: every per-row field (a tensor or list with one
    entry a row, or a nested dataclass of them) reordered, shared fields kept."""
    rows = len(order)
    return _reorder(batch, list(order), rows)


def _reorder(value: Any, order: list[int], rows: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows:
        return value[torch.tensor(order, dtype=torch.long)]
    if isinstance(value, list) and len(value) == rows:
        return [value[i] for i in order]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(
            value,
            **{
                f.name: _reorder(getattr(value, f.name), order, rows)
                for f in dataclasses.fields(value)
                if f.init
            },
        )
    return value


def balance(rollout: Any, parts: int) -> tuple[Any, dict[str, float]]:
    """``rollout`` reordered for ``parts`` data-parallel ranks (``balanced_order`` of its
    prompt + response lengths), and how even the ranks' tokens are before and after:
    the largest share over the mean (1.0 is perfectly even)."""
    lengths = [
        len(p) + len(r) for p, r in zip(rollout.prompt_ids, rollout.response_ids, strict=True)
    ]
    order = balanced_order(lengths, parts)
    before = chunk_loads(lengths, parts)
    after = chunk_loads([lengths[i] for i in order], parts)
    mean = max(sum(lengths) / parts, 1e-9)
    metrics = {
        "training/balance_max_over_mean_before": max(before) / mean,
        "training/balance_max_over_mean": max(after) / mean,
    }
    return reorder(rollout, order), metrics
