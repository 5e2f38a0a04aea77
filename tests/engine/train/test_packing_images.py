"""Packed sequences with images (engine.train.packing, ``model.use_remove_padding``):
rows with and without images, and with one or two images, packed end to end give the
log-probs the padded rows give; the text positions over the 3-D ones are what keeps
each packed row from attending to the rows before it."""

import pytest
import torch
from transformers import AutoModelForImageTextToText

from engine.train.forward import response_logprobs
from engine.train.packing import model_call
from engine.types import TokenBatch

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def batch(tiny_vl_model_dir, vl_prompts):
    """The four prompts (one image each, two images, none) twice, with responses of
    other lengths, one of them long: bins as wide as it hold several rows and several
    rows' images."""
    tokenizer, samples = vl_prompts
    samples = samples + samples[::-1]
    responses = [[20 + i] * (1 + i % 4) for i in range(len(samples))]
    responses[2] = list(range(20, 60))
    tokens = TokenBatch.from_ragged(
        [s.prompt_ids for s in samples],
        responses,
        tokenizer.pad_token_id,
        images=[s.images for s in samples],
    )
    return tokens, responses


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_padded(tiny_vl_model_dir, batch, attn):
    tokens, responses = batch
    model = AutoModelForImageTextToText.from_pretrained(
        tiny_vl_model_dir, dtype=torch.float32, attn_implementation=attn
    )
    call = model_call(model, tokens, CPU, packed=True)
    bins, width = call.inputs["input_ids"].shape
    assert call.inputs["position_ids"].shape == (4, bins, width)
    assert bins < len(tokens)  # some bin holds more than one row
    images_per_bin = (call.inputs["input_ids"] == model.config.image_token_id).sum(1)
    assert (images_per_bin > 4).any()  # ... and more than one row's image pad tokens
    with torch.no_grad():
        padded, _ = response_logprobs(model, tokens, CPU)
        packed, _ = response_logprobs(model, tokens, CPU, packed=True)
    mask = tokens.response_mask_BR.bool()
    assert mask.sum() == sum(len(r) for r in responses)
    assert torch.allclose(packed[mask], padded[mask], atol=1e-5)
    assert (packed[~mask] == 0).all()


def test_without_text_positions_rows_see_each_other(tiny_vl_model_dir, batch):
    """With only the 3-D positions, (3, K, L), transformers builds one causal mask over
    the whole bin: the later rows of a bin attend to the earlier ones and their log-probs
    move. This is why the call carries (4, K, L)."""
    tokens, _ = batch
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float32)
    call = model_call(model, tokens, CPU, packed=True)
    with torch.no_grad():
        right = model(**call.inputs, **call.kwargs).logits
        inputs = {**call.inputs, "position_ids": call.inputs["position_ids"][1:]}
        wrong = model(**inputs, **call.kwargs).logits
    assert not torch.allclose(right, wrong, atol=1e-3)


def test_packed_images_follow_their_rows(tiny_vl_model_dir, batch):
    """The pixels go in the order of the pad tokens in the bins, whatever order the
    bins put the rows in: each image's patch count matches the pad tokens it fills."""
    tokens, _ = batch
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float32)
    call = model_call(model, tokens, CPU, packed=True)
    merge = model.config.vision_config.spatial_merge_size
    ids = call.inputs["input_ids"].flatten()
    runs = []  # lengths of the runs of image pad tokens, in order
    for is_pad, group in _runs((ids == model.config.image_token_id).tolist()):
        if is_pad:
            runs.append(group)
    grids = call.inputs["image_grid_thw"]
    assert runs == [int(g.prod()) // merge**2 for g in grids]
    assert call.inputs["pixel_values"].shape[0] == int(grids.prod(1).sum())


def _runs(flags):
    out, count = [], 0
    for i, flag in enumerate(flags):
        count += 1
        if i + 1 == len(flags) or flags[i + 1] != flag:
            out.append((flag, count))
            count = 0
    return out
