"""The multimodal rotary positions the engine computes (engine.models.mrope, laid out by
TokenBatch.from_ragged) against the model's own (Qwen2_5_VLModel.get_rope_index): rows
with one image, two images of other shapes, none; left-padded prompts, right-padded
responses."""

import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

from engine.models.mrope import prompt_positions
from engine.models.processor import load_vision_processor
from engine.types import TokenBatch


@pytest.fixture(scope="module")
def parts(tiny_vl_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_vl_model_dir)
    config = AutoConfig.from_pretrained(tiny_vl_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir).eval()
    return tokenizer, config, model, load_vision_processor(tiny_vl_model_dir, tokenizer, config)


def _prompt(parts, text: str, sizes: list[tuple[int, int]]):
    """A chat whose <image> marks are images of these (width, height)."""
    tokenizer, _, _, processor = parts
    pieces = text.split("<image>")
    content = []
    for i, piece in enumerate(pieces):
        if i:
            content.append({"type": "image"})
        if piece:
            content.append({"type": "text", "text": piece})
    chat = [{"role": "user", "content": content}]
    rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    images = [Image.new("RGB", size, (10 * i, 100, 200)) for i, size in enumerate(sizes)]
    counts = processor.tokens_per_image([(h, w) for w, h in sizes])
    ids = tokenizer(processor.expand(rendered, counts))["input_ids"]
    return ids, (processor.image_inputs(ids, images) if images else None)


def test_positions_match_the_models_own_with_padding(parts):
    tokenizer, config, model, _ = parts
    rows = [
        _prompt(parts, "<image>Which square is larger?", [(56, 56)]),
        _prompt(parts, "Left <image> and right <image>: same?", [(28, 28), (84, 56)]),
        _prompt(parts, "No image here, only words.", []),
        _prompt(parts, "<image>", [(112, 56)]),  # ends with the image
    ]
    prompts = [ids for ids, _ in rows]
    images = [inputs for _, inputs in rows]
    responses = [[10, 11, 12], [13], [14, 15, 16, 17, 18], []]
    batch = TokenBatch.from_ragged(prompts, responses, tokenizer.pad_token_id, images=images)
    grids = torch.cat([i.image_grid_thw_N3 for i in images if i is not None])
    ids = batch.input_ids_BS
    theirs, _ = model.model.get_rope_index(
        ids,
        mm_token_type_ids=(ids == config.image_token_id).int(),
        image_grid_thw=grids,
        attention_mask=batch.attention_mask_BS,
    )
    assert batch.vision is not None
    assert torch.equal(batch.vision.position_ids_B3S, theirs.permute(1, 0, 2))
    # The 84 x 56 image is 3 merged patches wide, 2 high: its positions span 3 columns
    # and the text after it resumes 3 (the larger side) after its first position.
    assert grids.tolist()[2] == [1, 4, 6]


def test_text_only_rows_keep_their_plain_positions():
    batch = TokenBatch.from_ragged([[5, 6, 7], [8]], [[9], [10, 11]], 0, images=[None, None])
    real = batch.attention_mask_BS.bool()
    for dim in range(3):  # the same numbers in all three, on every real token
        assert torch.equal(batch.vision.position_ids_B3S[:, dim][real], batch.position_ids_BS[real])


def test_a_miscounted_image_is_refused(parts):
    _, config, _, _ = parts
    pad = config.image_token_id
    with pytest.raises(ValueError, match="needs 4 consecutive pad tokens"):
        prompt_positions([1, pad, pad, 2], torch.tensor([[1, 4, 4]]), pad, 2)
    with pytest.raises(ValueError, match="2 images but pad tokens for 1"):
        prompt_positions([1, pad, 2], torch.tensor([[1, 2, 2], [1, 2, 2]]), pad, 2)
