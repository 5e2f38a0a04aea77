"""MoE routing replay in a training engine (``engine.config.routing_replay``): what one
role's forwards do with the routing during a pass, and the routing laid out between the
batch's (B, S) tokens and the tokens a forward's routers see.

The routing travels with the batch as ``TokenBatch.routed_experts_BSLK``. A forward
runs the batch's tokens in a layout of its own (trimmed, packed in bins, a Ulysses or
tensor-parallel slice, context-parallel zigzag, sequence-first in Megatron), given by a
token index: for each token a router sees, its row × S + column in the batch, or -1
(padding of the forward's own). Replay lays the batch's routing out by that index; a
recording is put back by it, so that a pass may split, trim and pack the batch as it
likes and the update may do it differently.

Each engine brings a tap over its routers (Hugging Face's: ``engine.models.router_tap``;
Megatron-core's ``RouterReplay``: ``engine.train.megatron_routing``) with ``layers``,
``top_k``, ``record()``, ``replay(targets)``, ``native()``, ``taken()`` (the last
forward's recorded indices per layer), ``after_forward()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from engine.config.routing_replay import NATIVE, RECORD, REPLAY
from engine.errors import EngineError
from engine.types import TokenBatch


def lay_out(routed_BSLK: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(N, L, K) routing of the N tokens of ``index`` (any shape; -1 entries get -1)."""
    flat = index.reshape(-1).to(routed_BSLK.device)
    b, s, *lk = routed_BSLK.shape
    out = routed_BSLK.reshape(b * s, *lk)[flat.clamp(min=0)].long()
    out[flat < 0] = -1
    return out


def put_back(
    taken: dict[int, torch.Tensor], index: torch.Tensor, rows: int, width: int, layers: int, k: int
) -> torch.Tensor:
    """(rows, width, layers, k) int16 from each layer's (N, k) indices of the tokens of
    ``index``; -1 where no token or no layer of this rank's gave one."""
    out = torch.full((rows * width, layers, k), -1, dtype=torch.int16)
    flat = index.reshape(-1).cpu()
    real = flat >= 0
    for layer, indices in taken.items():
        out[flat[real], layer] = (
            indices.reshape(-1, k)[real.to(indices.device)].cpu().to(torch.int16)
        )
    return out.view(rows, width, layers, k)


@dataclass
class Recorded:
    """A recording pass's routing: each forward's (b, S, L, K), in order; after the pass
    ``routed_experts_BSLK``, all of them, complete on every rank of a model replica."""

    parts: list[torch.Tensor] = field(default_factory=list)
    routed_experts_BSLK: torch.Tensor | None = None


class RoutingReplay:
    """One engine's routers under replay. ``during(action)`` sets what a pass does:
    native, record (yields the ``Recorded``), or replay the batches' routing; ``around``
    wraps each forward of the pass. ``groups``: the process groups whose ranks hold parts
    of one forward's tokens or layers (Ulysses; Megatron's TP, CP and pipeline stages):
    a recording is completed over them."""

    def __init__(
        self,
        tap: Any,
        num_layers: int,
        groups: Sequence[Any] = (),
        device: torch.device | None = None,
    ) -> None:
        self.tap = tap
        self.num_layers = num_layers
        self.groups = [g for g in groups if g is not None and dist.get_world_size(g) > 1]
        self.device = device or torch.device("cpu")  # where the collectives run
        self.action = NATIVE
        self._recorded: Recorded | None = None

    @contextlib.contextmanager
    def during(self, action: str) -> Iterator[Recorded]:
        recorded = Recorded()
        self.action, self._recorded = action, recorded
        try:
            yield recorded
        finally:
            self.action, self._recorded = NATIVE, None
            self.tap.native()
        if action == RECORD and recorded.parts:
            recorded.routed_experts_BSLK = self._complete(torch.cat(recorded.parts))

    @contextlib.contextmanager
    def around(self, tokens: TokenBatch, index: torch.Tensor) -> Iterator[None]:
        """One forward of ``tokens``, its routers' tokens at ``index``."""
        if self.action == REPLAY:
            routed = tokens.routed_experts_BSLK
            if routed is None:
                raise EngineError(
                    "routing replay: the actor's batch carries no routing to replay (R2 records"
                    " it in the π_old pass, R3 in the rollout)"
                )
            targets = lay_out(routed, index).to(index.device)
            self.tap.replay({layer: targets[:, layer] for layer in self.tap.layers})
        elif self.action == RECORD:
            self.tap.record()
        yield
        if self.action == RECORD:
            rows, width = tokens.input_ids_BS.shape
            part = put_back(self.tap.taken(), index, rows, width, self.num_layers, self.tap.top_k)
            part[~tokens.attention_mask_BS.bool()] = -1  # a padded forward routes its padding
            self._recorded.parts.append(part)
        elif self.action == REPLAY:
            self.tap.after_forward()

    def _complete(self, routed: torch.Tensor) -> torch.Tensor:
        """Each position filled by the rank that ran it (-1 on the others): the maximum
        over the group (as int32, which every backend reduces)."""
        if not self.groups:
            return routed
        whole = routed.to(device=self.device, dtype=torch.int32)
        for group in self.groups:
            dist.all_reduce(whole, op=dist.ReduceOp.MAX, group=group)
        return whole.to(device="cpu", dtype=torch.int16)


class NoReplay:
    """The engine of a role that routes freely (no tap): every pass native."""

    @contextlib.contextmanager
    def during(self, action: str) -> Iterator[Recorded]:
        if action != NATIVE:
            raise EngineError(
                f"routing replay ({action}) asked of an engine built without it"
                " (actor_rollout_ref.actor.router_replay.mode)"
            )
        yield Recorded()

    def around(self, tokens: TokenBatch, index: torch.Tensor) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


NO_REPLAY = NoReplay()
