"""MoE routing replay on a Hugging Face Qwen3-MoE (engine.models.router_tap,
engine.train.routing_replay), on the CPU: the routing recorded in one layout
(packed bins) is replayed in another (padded micro-batches) after the router weights
moved far enough that free routing differs; the replayed forward takes exactly the
recorded experts, with the weights of the current logits over them, and trains the
router through them, recomputed alike under gradient checkpointing."""

import dataclasses

import pytest
import torch

from engine.config.routing_replay import RECORD, REPLAY
from engine.controller.dispatch import take
from engine.models.router_tap import RouterTap, find_routers
from engine.models.tiny import random_model, tiny_config
from engine.train.forward import response_logprobs
from engine.train.packing import model_call
from engine.train.routing_replay import RoutingReplay, lay_out, put_back
from engine.train.ulysses import UlyssesGroup
from engine.types import TokenBatch

CPU = torch.device("cpu")
LAYERS, EXPERTS, TOP_K = 3, 8, 2


def ragged(prompt_lens, response_lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in prompt_lens]
    responses = [torch.randint(3, 250, (n,), generator=g).tolist() for n in response_lens]
    return TokenBatch.from_ragged(prompts, responses, 0)


BATCH = ([9, 4, 6, 12], [3, 11, 1, 7])


def _model(**kw):
    cfg = tiny_config(
        "qwen3_moe", vocab_size=256, hidden_size=64, num_layers=LAYERS, num_experts=EXPERTS, **kw
    )
    return random_model(cfg, seed=1)


@pytest.fixture(scope="module")
def tapped():
    model = _model()
    tap = RouterTap(model).install()
    return model, RoutingReplay(tap, tap.num_layers)


def _routed_by_hook(model, routing, tokens, packed):
    """(B, S, L, K) of the experts the routers returned in one forward (their outputs'
    indices, after any replay), put back by the call's token index."""
    taken, hooks = {}, []
    for layer, router in find_routers(model).items():
        hooks.append(
            router.register_forward_hook(
                lambda m, a, out, layer=layer: taken.__setitem__(layer, out[2].detach())
            )
        )
    try:
        response_logprobs(model, tokens, CPU, packed=packed, routing=routing)
    finally:
        for h in hooks:
            h.remove()
    index = model_call(model, tokens, CPU, packed).token_index
    return put_back(taken, index, *tokens.input_ids_BS.shape, LAYERS, TOP_K)


def test_replay_takes_the_recorded_experts_after_the_router_moved(tapped):
    model, routing = tapped
    tokens = ragged(*BATCH)
    real = tokens.attention_mask_BS.bool()
    with torch.no_grad(), routing.during(RECORD) as recorded:
        response_logprobs(model, tokens, CPU, packed=True, routing=routing)
    routed = recorded.routed_experts_BSLK
    assert routed.shape == (*tokens.input_ids_BS.shape, LAYERS, TOP_K)
    assert (routed[real] >= 0).all() and (routed[~real] == -1).all()
    # The router moves: free routing now differs for some tokens (the test can fail).
    with torch.no_grad():
        for router in find_routers(model).values():
            router.weight.add_(torch.randn_like(router.weight))
    free = _routed_by_hook(model, routing, tokens, packed=False)
    moved = (free[real].sort(-1).values != routed[real].sort(-1).values).any(-1)
    assert moved.any()
    # Replayed, in padded micro-batches of two rows: exactly the recorded experts.
    replayed = dataclasses.replace(tokens, routed_experts_BSLK=routed)
    with routing.during(REPLAY):
        parts = [
            _routed_by_hook(model, routing, take(replayed, slice(i, i + 2)), False) for i in (0, 2)
        ]
    took = torch.cat(parts)
    assert torch.equal(took[real], routed[real].long())


def test_replayed_weights_come_from_the_current_logits_and_train_the_router(tapped):
    model, routing = tapped
    tokens = ragged(*BATCH, seed=1)
    with torch.no_grad(), routing.during(RECORD) as recorded:
        response_logprobs(model, tokens, CPU, packed=True, routing=routing)
    with torch.no_grad():
        for router in find_routers(model).values():
            router.weight.mul_(-1.0)
    replayed = dataclasses.replace(tokens, routed_experts_BSLK=recorded.routed_experts_BSLK)
    outputs, hook = (
        [],
        find_routers(model)[1].register_forward_hook(lambda m, a, out: outputs.append(out)),
    )
    model.zero_grad()
    with routing.during(REPLAY):
        logp, _ = response_logprobs(model, replayed, CPU, packed=True, routing=routing)
    hook.remove()
    (logits, weights, indices) = outputs[0]
    # Qwen3-MoE's own rule on the replayed experts: softmax over all, renormalised over k
    want = torch.softmax(logits, -1).gather(-1, indices)
    torch.testing.assert_close(weights, want / want.sum(-1, keepdim=True))
    (logp * replayed.response_mask_BR).sum().backward()
    assert find_routers(model)[1].weight.grad.abs().sum() > 0


def test_gradient_checkpointing_recomputes_the_replayed_routing():
    """The backward's recomputed layers route as the forward did (the targets stay)."""
    grads = []
    tokens = ragged(*BATCH, seed=2)
    for checkpointing in (False, True):
        model = _model()
        tap = RouterTap(model).install()
        routing = RoutingReplay(tap, tap.num_layers)
        with torch.no_grad(), routing.during(RECORD) as recorded:
            response_logprobs(model, tokens, CPU, packed=True, routing=routing)
        with torch.no_grad():
            for router in find_routers(model).values():
                router.weight.mul_(-1.0)
        if checkpointing:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        model.train()
        replayed = dataclasses.replace(tokens, routed_experts_BSLK=recorded.routed_experts_BSLK)
        with routing.during(REPLAY):
            logp, _ = response_logprobs(model, replayed, CPU, packed=True, routing=routing)
            (logp * replayed.response_mask_BR).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], msg=name)


def test_layouts_put_back_what_they_take():
    """The token index of padded, packed and Ulysses-sliced calls maps each token the
    model sees to its place in the batch: laid out and put back, the routing returns."""
    tokens = ragged([3, 5, 2], [4, 1, 6])
    g = torch.Generator().manual_seed(0)
    routed = torch.randint(0, EXPERTS, (*tokens.input_ids_BS.shape, LAYERS, TOP_K), generator=g)
    routed[~tokens.attention_mask_BS.bool()] = -1
    routed = routed.to(torch.int16)
    model = torch.nn.Linear(1, 1)  # no logits_to_keep; only the layouts are used
    calls = [model_call(model, tokens, CPU, packed) for packed in (False, True)]
    halves = [UlyssesGroup(size=2, rank=r, group=None).split(calls[1]) for r in (0, 1)]
    for call in calls:
        index = call.token_index
        laid = lay_out(routed, index)
        taken = {layer: laid[:, layer] for layer in range(LAYERS)}
        assert torch.equal(
            put_back(taken, index, *tokens.input_ids_BS.shape, LAYERS, TOP_K), routed
        )
    # Packed: each real token once, no padding (the bins' tails are -1).
    packed = calls[1].token_index
    real = torch.nonzero(tokens.attention_mask_BS.flatten()).flatten()
    assert torch.equal(packed[packed >= 0].sort().values, real)
    # The two Ulysses halves hold the packed call's tokens between them, once each.
    joined = torch.cat([h.token_index for h in halves], dim=1)
    assert torch.equal(joined.sort(dim=1).values, calls[1].token_index.sort(dim=1).values)


def test_ragged_routing_sits_under_its_tokens():
    """``TokenBatch.from_ragged``: a row's routing from its first prompt token, one row
    short (the last token never ran forward) or cut at its tokens; -1 around it."""
    prompts, responses = [[5, 6], [7, 8, 9]], [[10, 11, 12], [13]]
    rows = [torch.full((4, 2, 1), 1), torch.full((9, 2, 1), 2)]  # 4 of 5 tokens; 9 > 4
    tokens = TokenBatch.from_ragged(prompts, responses, 0, routed_experts=rows)
    got = tokens.routed_experts_BSLK[..., 0, 0].tolist()
    assert got == [[-1, 1, 1, 1, 1, -1], [2, 2, 2, 2, -1, -1]]
    assert tokens.without_routing().routed_experts_BSLK is None
