"""The HF rollout with a vision-language model's images (engine.rollout.hf) against the
training forward (engine.train.forward): the same pixels, the same multimodal positions
with left padding, so the sampler's log-probs are the trainer's; no image pad sampled."""

import pytest
import torch
from transformers import AutoModelForImageTextToText

from engine.rollout.hf import HFRollout
from engine.train.forward import response_logprobs, response_logprobs_at
from engine.types import GenerationRequest, SamplingParams, TokenBatch


@pytest.fixture(scope="module")
def model(tiny_vl_model_dir):
    return AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float32)


def generate(model, tokenizer, samples, logprobs=True, **sampling):
    rollout = HFRollout(model, tokenizer, torch.device("cpu"), logprobs=logprobs)
    request = GenerationRequest(
        [s.prompt_ids for s in samples],
        SamplingParams(max_new_tokens=6, ignore_eos=True, **sampling),
        images=[s.images for s in samples],
    )
    return request, rollout.generate(request)


def test_sampled_logprobs_are_the_training_forwards(model, vl_prompts):
    """Rows of three prompt lengths (so all but one are left-padded), one with two images
    and one with none, generated together: every response token's sampling log-prob
    equals the training forward's on the padded batch, renormalised without the image
    and video pad tokens the rollout never samples."""
    tokenizer, samples = vl_prompts
    assert len({len(s.prompt_ids) for s in samples}) >= 3
    torch.manual_seed(0)
    request, out = generate(model, tokenizer, samples)
    tokens = TokenBatch.from_ragged(
        request.prompt_ids, out.response_ids, tokenizer.pad_token_id, images=request.images
    )
    pads = [model.config.image_token_id, model.config.video_token_id]
    ids_BRK = torch.tensor(pads).expand(*tokens.response_mask_BR.shape, 2)
    with torch.no_grad():
        trained, _, pads_BRK = response_logprobs_at(model, tokens, torch.device("cpu"), ids_BRK)
    # the rollout samples from the distribution without the pad tokens (about 1e-3 here)
    without_pads = trained - torch.log1p(-pads_BRK.exp().sum(-1))
    sampled = torch.tensor(out.logprobs)
    assert torch.allclose(without_pads, sampled, atol=1e-5), (without_pads - sampled).abs().max()
    assert not torch.allclose(trained, sampled, atol=1e-5)


def test_the_images_reach_both_sides(model, vl_prompts):
    """Other pixels, other log-probs: in generation and in the training forward."""
    tokenizer, samples = vl_prompts
    request, out = generate(model, tokenizer, samples[:1], do_sample=False)
    other = samples[1].images  # the same shape (4 pads), other squares
    assert other.pixel_values_PD.shape == samples[0].images.pixel_values_PD.shape
    swapped = [other]
    tokens = [
        TokenBatch.from_ragged(request.prompt_ids, out.response_ids, 0, images=images)
        for images in (request.images, swapped)
    ]
    with torch.no_grad():
        mine, theirs = (response_logprobs(model, t, torch.device("cpu"))[0] for t in tokens)
    assert not torch.allclose(mine, theirs, atol=1e-6)
    assert torch.allclose(mine, torch.tensor(out.logprobs), atol=1e-2)  # less the pads' mass


def test_image_pad_tokens_are_never_sampled(tiny_vl_model_dir, vl_prompts):
    """A pad token in a response would count as an image's in the training forward."""
    tokenizer, samples = vl_prompts
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float32)
    pads = [model.config.image_token_id, model.config.video_token_id]
    with torch.no_grad():  # make them the likeliest tokens by far
        model.lm_head.weight[pads] = (
            50 * model.lm_head.weight[pads] / model.lm_head.weight[pads].norm()
        )
        model.model.language_model.norm.weight.fill_(1.0)
    torch.manual_seed(0)
    _, out = generate(model, tokenizer, samples, logprobs=False)
    assert not any(t in pads for row in out.response_ids for t in row)
