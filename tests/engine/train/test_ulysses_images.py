"""Ulysses with images (engine.train.ulysses, engine.train.packing): on two gloo ranks in
float64 a vision-language batch's log-probs, entropy and the gradients summed over the
group (the vision tower's included) equal one rank's packed forward, with an image's pad
tokens split between the two ranks' slices."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForImageTextToText

from engine.train.forward import response_logprobs
from engine.train.packing import model_call
from engine.train.ulysses import UlyssesGroup, enable
from engine.types import TokenBatch

CPU = torch.device("cpu")
SP = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def batch(vl_prompts):
    """One image, two of other sizes, none. sdpa's bins are as long as the longest row
    (the two-image row, 60 tokens); the text row (25) and a one-image row (24) share one,
    that row's image pads across its middle, where the two ranks' slices meet."""
    tokenizer, samples = vl_prompts
    responses = [[20], [21], list(range(30, 66)), list(range(70, 81))]
    return TokenBatch.from_ragged(
        [s.prompt_ids for s in samples],
        responses,
        tokenizer.pad_token_id,
        images=[s.images for s in samples],
    )


def _straddles(call, image_token_id) -> bool:
    ids = call.inputs["input_ids"]
    mid = ids.shape[1] // SP
    return bool(((ids[:, mid - 1] == image_token_id) & (ids[:, mid] == image_token_id)).any())


def _on_rank(rank, port, model_dir, tokens):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=SP)
    group = UlyssesGroup.create(SP)
    mask = tokens.response_mask_BR
    for attn in ("sdpa", "eager"):
        model = AutoModelForImageTextToText.from_pretrained(
            model_dir, dtype=torch.float64, attn_implementation=attn
        )
        model.gradient_checkpointing_enable({"use_reentrant": False})
        model.train()
        assert _straddles(model_call(model, tokens, CPU, True, None), model.config.image_token_id)
        want = {}
        for sp in (None, group):
            if sp is not None:
                enable(model)
            model.zero_grad(set_to_none=True)
            seen = []
            hook = model.model.language_model.layers[0].register_forward_hook(
                lambda module, args, out, seen=seen: seen.append(args[0].shape)
            )
            logp, ent = response_logprobs(
                model, tokens, CPU, temperature=0.7, with_entropy=True, entropy_grad=True,
                packed=True, ulysses=sp,
            )  # fmt: skip
            ((logp + 0.1 * ent) * mask).sum().backward()
            hook.remove()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            if sp is None:
                want = dict(logp=logp.detach(), ent=ent.detach(), grads=grads, shape=seen[0])
                continue
            bins, length, _ = want["shape"]
            assert seen[0][:2] == (bins, length // SP)  # each rank's language model: half
            torch.testing.assert_close(logp, want["logp"], rtol=0, atol=1e-10)
            torch.testing.assert_close(ent, want["ent"], rtol=0, atol=1e-10)
            assert any(".visual." in f".{n}" for n in grads)
            for g in grads.values():
                dist.all_reduce(g)  # what FSDP's reduce-scatter sums over the group
            assert grads.keys() == want["grads"].keys()
            for name, g in want["grads"].items():
                torch.testing.assert_close(grads[name], g, rtol=1e-9, atol=1e-10, msg=name)
    dist.destroy_process_group()


@pytest.mark.slow  # two processes importing torch and transformers, two models each
def test_ulysses_with_images_equals_one_rank_in_float64(tiny_vl_model_dir, batch):
    mp.spawn(_on_rank, args=(_free_port(), str(tiny_vl_model_dir), batch), nprocs=SP, join=True)
