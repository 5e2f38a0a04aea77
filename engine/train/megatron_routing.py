"""MoE routing replay in the Megatron engine, through Megatron-core's own
``RouterReplay`` (``megatron.core.transformer.moe.router_replay``): with
``TransformerConfig.moe_enable_routing_replay`` every ``TopKRouter`` holds one, whose
action decides its top-k: ``RECORD`` keeps the indices it chose, ``REPLAY_FORWARD``
takes the target indices and gathers the scores at them (the softmax or sigmoid weights
then come from the current logits over those experts), ``REPLAY_BACKWARD`` pops the
targets in forward order when full recomputation runs the layer again in the backward
(after a forward the routers switch to it, so that a later micro-batch's forward, in
1F1B order, does not take the targets of one whose backward is still to come).

This module only addresses each layer's instance (by its decoder layer, over the
stage's layers): Megatron-core's class-wide list holds the routers of every model the
process built (the reference's and the tests' too). A token with nothing recorded
(padding, an R3 row's last token) is given experts 0..k-1: nothing the loss reads
depends on them (no auxiliary loss, no token dropping here).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.errors import EngineError


class MegatronRouterTap:
    """The stage's routers' ``RouterReplay`` instances by decoder layer (the tap
    interface of ``engine.train.routing_replay``)."""

    def __init__(self, model: nn.Module) -> None:
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self.actions = RouterReplayAction
        self.replays = {}
        for layer in model.decoder.layers:
            router = getattr(layer.mlp, "router", None)
            if getattr(router, "router_replay", None) is not None:
                self.replays[layer.layer_number - 1] = router.router_replay  # numbered from 1
        self.recompute = model.config.recompute_granularity is not None
        self.top_k = model.config.moe_router_topk
        if not self.replays and any(
            getattr(layer.mlp, "router", None) is not None for layer in model.decoder.layers
        ):
            raise EngineError("routing replay: the model was built without Megatron's RouterReplay")

    @property
    def layers(self) -> list[int]:
        return sorted(self.replays)

    def record(self) -> None:
        for replay in self.replays.values():
            replay.clear_indices()
            replay.set_router_replay_action(self.actions.RECORD)

    def replay(self, targets: dict[int, torch.Tensor]) -> None:
        for layer, replay in self.replays.items():
            target = targets[layer]
            missing = (target < 0).any(dim=-1)
            if missing.any():  # module docstring: any k distinct experts
                target = target.clone()
                target[missing] = torch.arange(target.shape[-1], device=target.device)
            replay.set_target_indices(target)
            replay.set_router_replay_action(self.actions.REPLAY_FORWARD)

    def after_forward(self) -> None:
        for replay in self.replays.values():
            if self.recompute and torch.is_grad_enabled():
                replay.set_router_replay_action(self.actions.REPLAY_BACKWARD)
            else:  # no recomputation will pop them
                replay.replay_backward_list.clear()

    def taken(self) -> dict[int, torch.Tensor]:
        taken = {layer: replay.get_recorded_indices() for layer, replay in self.replays.items()}
        return {layer: indices for layer, indices in taken.items() if indices is not None}

    def native(self) -> None:
        for replay in self.replays.values():
            replay.clear_indices()
            replay.clear_router_replay_action()


def router_index(
    index_BS: torch.Tensor, held: torch.Tensor | None, tp: int, tp_rank: int, sp: bool
) -> torch.Tensor:
    """(N,) the batch position of each token a router of this rank sees, from the
    forward's (B, S') token index (padded as its inputs were, -1 on padding): the
    context-parallel positions it holds, its sequence-parallel slice, sequence first
    (Megatron's hidden states are [S, B, H], flattened to tokens s·B + b)."""
    if held is not None:
        index_BS = index_BS[:, held.to(index_BS.device)]
    index_SB = index_BS.t()
    if sp and tp > 1:
        local = index_SB.shape[0] // tp
        index_SB = index_SB[tp_rank * local : (tp_rank + 1) * local]
    return index_SB.reshape(-1)
