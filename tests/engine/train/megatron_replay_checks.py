"""MoE routing replay on a running Megatron actor (engine.train.megatron_routing, through
Megatron-core's ``RouterReplay``), against Hugging Face's model holding the same weights:
``replay_checks`` runs inside test_megatron_backend.py's spawned MoE actor runs, on every
layout they cover (TP with sequence parallelism, expert and pipeline parallelism, the
experts' token exchange padding each group's micro-batches to one shape)."""

from __future__ import annotations

import dataclasses

import torch

from engine.config.routing_replay import RECORD, REPLAY
from engine.models.router_tap import RouterTap, find_routers
from engine.train.forward import response_logprobs
from engine.train.routing_replay import RoutingReplay, put_back

CPU = torch.device("cpu")


def _move(weight: torch.Tensor, layer: int) -> None:
    """The same move of layer ``layer``'s router on every rank and in both models, large
    enough next to its std 0.5 that some tokens change experts."""
    g = torch.Generator().manual_seed(100 + layer)
    weight.add_(3 * torch.randn(weight.shape, generator=g))


def replay_checks(engine, hf, batch) -> dict:
    """Run last (it moves the routers). ``hf``: the engine's weights in Hugging Face's
    model. The engine records the routing HF's model takes; after the routers moved, free
    routing differs, and under replay each router takes the recorded experts (its
    routing map, at the tokens it saw, by the index the engine laid the batch out with)
    and the log-probs are HF's replaying the same routing."""
    real = batch.attention_mask_BS.bool()
    mask = batch.response_mask_BR
    hf_tap = RouterTap(hf).install()
    hf_routing = RoutingReplay(hf_tap, hf_tap.num_layers)
    engine.eval()
    with torch.no_grad():
        with engine.routing.during(RECORD) as recorded:
            engine.response_logprobs(batch)
        with hf_routing.during(RECORD) as hf_recorded:
            response_logprobs(hf, batch, CPU, routing=hf_routing)
    routed, want = recorded.routed_experts_BSLK, hf_recorded.routed_experts_BSLK
    out = {
        "replay_records_as_hf": torch.equal(
            routed[real].sort(-1).values, want[real].sort(-1).values
        ),
        "replay_padding_unrecorded": bool((routed[~real] == -1).all()),
    }
    with torch.no_grad():
        for layer in engine.model.decoder.layers:
            if getattr(layer.mlp, "router", None) is not None:
                _move(layer.mlp.router.weight, layer.layer_number - 1)
        for layer, router in find_routers(hf).items():
            _move(router.weight, layer)
        with engine.routing.during(RECORD) as free:
            engine.response_logprobs(batch)
    out["replay_free_differs"] = not torch.equal(free.routed_experts_BSLK[real], routed[real])
    replayed = dataclasses.replace(batch, routed_experts_BSLK=routed)
    maps, indices = _spy(engine)
    with torch.no_grad(), engine.routing.during(REPLAY):
        logp, _ = engine.response_logprobs(replayed)
    (index,) = indices
    k = routed.shape[-1]
    taken = {layer: m.nonzero()[:, 1].view(-1, k) for layer, m in maps.items()}
    took = put_back(taken, index, *batch.input_ids_BS.shape, routed.shape[2], k)
    seen = index[index >= 0].cpu()
    seen = seen[real.flatten()[seen]]  # the real tokens this rank's routers saw
    layers = sorted(maps)
    took = took.flatten(0, 1)[seen][:, layers].long()
    out["replay_takes_recorded"] = torch.equal(
        took, routed.flatten(0, 1)[seen][:, layers].long().sort(-1).values
    )
    out["replay_tokens_checked"] = len(seen) * len(layers)
    if engine.stage.last:
        with torch.no_grad():
            with hf_routing.during(REPLAY):
                hf_logp, _ = response_logprobs(hf, replayed, CPU, routing=hf_routing)
            hf_free, _ = response_logprobs(hf, batch, CPU)
        out["replay_logp_err"] = ((logp - hf_logp) * mask).abs().max().item()
        out["replay_gap_vs_free"] = ((logp - hf_free) * mask).abs().max().item()
    return out


def _spy(engine):
    """Each router's (tokens, experts) routing map of the next forward, and the token
    index the engine laid the batch out with for it."""
    maps, indices = {}, []
    for layer in engine.model.decoder.layers:
        router = getattr(layer.mlp, "router", None)
        if router is not None:
            router.register_forward_hook(
                lambda m, a, out, layer=layer.layer_number - 1: maps.__setitem__(layer, out[1])
            )
    around = engine.routing.around

    def spying(tokens, index):
        indices.append(index)
        return around(tokens, index)

    engine.routing.around = spying
    return maps, indices
