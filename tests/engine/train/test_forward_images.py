"""The training forward with images (engine.train.forward, engine.train.packing): a
padded, trimmed, micro-batched vision-language batch gives each row what the model
gives that row alone, unpadded, computing its own multimodal positions."""

import torch
from transformers import AutoModelForImageTextToText

from engine.controller.dispatch import take
from engine.train.forward import forward_in_micro_batches, response_logprobs
from engine.train.packing import model_call
from engine.types import TokenBatch


def alone(model, prompt, response, images):
    """log π of each response token, the row alone, the model's own positions."""
    ids = torch.tensor([prompt + response])
    kwargs = {}
    if images is not None:
        kwargs = dict(
            pixel_values=images.pixel_values_PD,
            image_grid_thw=images.image_grid_thw_N3,
            mm_token_type_ids=(ids == model.config.image_token_id).int(),
        )
    with torch.no_grad():
        logits = model(input_ids=ids, **kwargs).logits[0]
    steps = logits[len(prompt) - 1 : -1].log_softmax(-1)
    return steps.gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_batched_rows_equal_each_row_alone(tiny_vl_model_dir, vl_prompts):
    tokenizer, samples = vl_prompts
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float32)
    responses = [[20, 21, 22], [23], [24, 25, 26, 27], [28, 29]]
    images = [s.images for s in samples]
    tokens = TokenBatch.from_ragged(
        [s.prompt_ids for s in samples], responses, tokenizer.pad_token_id, images=images
    )
    cpu = torch.device("cpu")
    with torch.no_grad():
        whole, _ = response_logprobs(model, tokens, cpu)
        # micro-batches of 2 rows and of 1: each takes its rows' images and positions
        by_two = forward_in_micro_batches(
            tokens, 2, None, cpu, lambda t: response_logprobs(model, t, cpu)[0]
        )
        by_one = forward_in_micro_batches(
            tokens, 1, None, cpu, lambda t: response_logprobs(model, t, cpu)[0]
        )
    for i, (sample, response) in enumerate(zip(samples, responses, strict=True)):
        expected = alone(model, sample.prompt_ids, response, sample.images)
        for got in (whole, by_two, by_one):
            assert torch.allclose(got[i, : len(response)], expected, atol=1e-5)


def test_a_micro_batch_without_images_passes_no_pixels(tiny_vl_model_dir, vl_prompts):
    _, samples = vl_prompts
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float32)
    tokens = TokenBatch.from_ragged(
        [s.prompt_ids for s in samples], [[5]] * 4, 0, images=[s.images for s in samples]
    )
    text_row = take(tokens, slice(3, 4))
    call = model_call(model, text_row, torch.device("cpu"), packed=False)
    assert "pixel_values" not in call.inputs
    assert call.inputs["position_ids"].shape[0] == 3  # still the (3, B, S) positions
    both = model_call(model, take(tokens, slice(0, 2)), torch.device("cpu"), packed=False)
    assert both.inputs["pixel_values"].shape[0] == 2 * 16  # each row's 16 patches
    assert both.inputs["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
