"""Tensor-parallel rollout inside data-parallel workers.

The controller splits a generation batch by worker (every worker is a data-parallel
rank of the actor). A rollout engine with tensor parallelism ``tp`` spans ``tp``
consecutive workers of one node, and every member must hand it the same prompts
(vLLM's ``external_launcher`` runs the engine SPMD in those processes). So each
member gathers its group's prompts, the engine generates all of them, and each
member keeps the rows it was given: the controller sees no difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from engine.errors import EngineError


@dataclass(frozen=True)
class TPLayout:
    rank: int  # global rank
    world_size: int
    tp: int

    @property
    def group_index(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def group_ranks(self) -> list[int]:
        start = self.group_index * self.tp
        return list(range(start, start + self.tp))

    def all_groups(self) -> list[list[int]]:
        return [list(range(s, s + self.tp)) for s in range(0, self.world_size, self.tp)]


def tp_layout(tp: int, local_world_size: int | None = None) -> TPLayout:
    """This process's place in the rollout's tensor-parallel groups (consecutive ranks)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if local_world_size is not None and local_world_size % tp:
        raise EngineError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size {tp} must divide the"
            f" devices per node {local_world_size}: tensor parallelism stays within a node"
        )
    if world % tp:
        raise EngineError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size {tp} must divide the"
            f" number of rollout workers {world}"
        )
    return TPLayout(rank=rank, world_size=world, tp=tp)


def new_tp_group(layout: TPLayout) -> Any:
    """The process group of this rank's TP peers; every rank must call this (new_group is
    collective over the whole world)."""
    if layout.tp == 1:
        return None
    mine = None
    for ranks in layout.all_groups():
        group = dist.new_group(ranks, backend="gloo")  # for Python objects: prompts
        if layout.rank in ranks:
            mine = group
    return mine


def merge_rows(parts: Sequence[Sequence[Any]]) -> tuple[list[Any], list[slice]]:
    """Concatenate each member's rows; returns them and each member's slice."""
    rows: list[Any] = []
    slices: list[slice] = []
    for part in parts:
        slices.append(slice(len(rows), len(rows) + len(part)))
        rows.extend(part)
    return rows, slices


def gather_group_rows(rows: list[Any], layout: TPLayout, group: Any) -> tuple[list[Any], slice]:
    """All the rows of this rank's TP group, in rank order, and the slice that is ours."""
    if layout.tp == 1:
        return list(rows), slice(0, len(rows))
    parts: list[Any] = [None] * layout.tp
    dist.all_gather_object(parts, rows, group=group)
    merged, slices = merge_rows(parts)
    return merged, slices[layout.tp_rank]


def group_seed(layout: TPLayout, group: Any) -> int:
    """A seed drawn from this rank's random state, the same on every member of its TP
    group (the first member's). An engine that runs SPMD over the group must sample
    the same tokens on every member, or their schedules part ways; drawing it from the
    (checkpointed) random state makes a resumed run sample as the uninterrupted one."""
    import torch

    seed = [int(torch.randint(0, 2**31 - 1, ()))]
    if layout.tp > 1:
        dist.broadcast_object_list(seed, src=layout.group_ranks[0], group=group)
    return seed[0]


def group_token(layout: TPLayout, group: Any) -> str:
    """A random token shared by the members of this rank's TP group (the first
    member's), drawn from the OS so that the run's random state is left alone."""
    import os

    token = [os.urandom(6).hex()]
    if layout.tp > 1:
        dist.broadcast_object_list(token, src=layout.group_ranks[0], group=group)
    return token[0]
