"""Splitting a batch over data-parallel ranks, and gathering the results.

The rule is the same for every typed batch (``engine.types``): each field is a
tensor with B rows, a list with B items, a nested batch, or something shared by
all rows (None, a number, ``SamplingParams``), which every shard gets whole.
Rank r receives the r-th contiguous chunk, so gathering is concatenation in
rank order and the controller's row order survives the round trip. What is ragged per
row (a vision-language prompt's images: each its own number of patches) is a list with
one item a row, so it splits with its rows unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def batch_rows(batch: Any) -> int | None:
    """The number of rows of a batch (None when it has no per-row field)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, list):
        return len(batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for f in dataclasses.fields(batch):
            rows = batch_rows(getattr(batch, f.name))
            if rows is not None:
                return rows
    return None


def split(batch: T, parts: int) -> list[T]:
    """Split into ``parts`` contiguous shards of equal size (B must divide evenly:
    every rank runs the same number of forward passes, or collectives would hang)."""
    rows = batch_rows(batch)
    if rows is None:
        return [batch] * parts
    if rows % parts:
        raise ValueError(
            f"a batch of {rows} rows cannot be split evenly over {parts} data-parallel ranks"
        )
    size = rows // parts
    return [take(batch, slice(i * size, (i + 1) * size)) for i in range(parts)]


def take(value: Any, rows: slice) -> Any:
    """Rows ``rows`` of every per-row field; shared fields whole."""
    if isinstance(value, torch.Tensor | list):
        return value[rows]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if batch_rows(value) is None:
            return value  # shared by all rows, e.g. SamplingParams
        return dataclasses.replace(
            value, **{f.name: take(getattr(value, f.name), rows) for f in dataclasses.fields(value)}
        )
    return value


def concat(shards: list[T]) -> T:
    """Gather shards in rank order (the inverse of ``split``)."""
    first = shards[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(shards, dim=0)
    if isinstance(first, list):
        return [item for shard in shards for item in shard]  # type: ignore[return-value]
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        if batch_rows(first) is None:
            return first
        return dataclasses.replace(
            first,
            **{
                f.name: concat([getattr(s, f.name) for s in shards])
                for f in dataclasses.fields(first)
            },
        )
    return first  # shared by all rows (None, SamplingParams, ...)


@dataclass(frozen=True)
class ModelParallelLayout:
    """How a role's ranks share rows when its model is split (Megatron): ranks in
    Megatron's order (tensor parallel fastest, then context, then data parallel,
    pipeline slowest). The tp × cp × pp ranks of one model replica receive the same rows,
    and its result is taken from the last pipeline stage's first TP and CP rank (earlier
    stages return placeholders; TP and CP ranks compute the same result)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1

    def data_parallel(self, world_size: int) -> int:
        return world_size // (self.tp * self.cp * self.pp)

    def shard(self, rank: int, world_size: int) -> int:
        """The data-parallel shard that ``rank`` receives."""
        return (rank // (self.tp * self.cp)) % self.data_parallel(world_size)

    def output_ranks(self, world_size: int) -> list[int]:
        """The ranks whose results are gathered, in shard order."""
        dp = self.data_parallel(world_size)
        replica = self.tp * self.cp  # consecutive ranks of one replica's stage
        last_stage = (self.pp - 1) * replica * dp
        return [last_stage + d * replica for d in range(dp)]
