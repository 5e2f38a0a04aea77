"""The tiny Qwen2.5-VL built locally (engine.models.tiny_vl): transformers' own classes
load it offline, its tokenizer knows Qwen's vision tokens, its template places images,
and it runs forward and generates with an image."""

import importlib.util

import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

from engine.models.processor import load_vision_processor
from engine.models.tiny_vl import IMAGE_PAD, VISION_TOKENS, build_tiny_vl_model, build_vl_tokenizer

CHAT = [
    {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": "Which square is larger?"}],
    }
]


def test_loads_with_auto_classes(tiny_vl_model_dir):
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_vl_model_dir)
    config = model.config
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert config.model_type == "qwen2_5_vl"
    for name, key in (
        ("<|vision_start|>", "vision_start_token_id"),
        ("<|vision_end|>", "vision_end_token_id"),
        (IMAGE_PAD, "image_token_id"),
        ("<|video_pad|>", "video_token_id"),
    ):
        assert tokenizer.convert_tokens_to_ids(name) == getattr(config, key)
    assert len(tokenizer) == config.text_config.vocab_size
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert set(model._no_split_modules) == {"Qwen2_5_VLDecoderLayer", "Qwen2_5_VLVisionBlock"}
    assert 1_000_000 < model.num_parameters() < 2_500_000
    # the answers of the shapes task are one token each
    assert [len(tokenizer(w, add_special_tokens=False)["input_ids"]) for w in ("red", "blue")] == [
        1,
        1,
    ]


def test_ids_survive_reload_and_template_places_images(tiny_vl_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_vl_model_dir)
    fresh = build_vl_tokenizer()
    text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Which square is"
        " larger?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer(text)["input_ids"] == fresh(text)["input_ids"]
    assert [
        t for t in tokenizer(text)["input_ids"] if t == tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    ]
    # a plain string renders as the text model's ChatML
    plain = [{"role": "user", "content": "Add 3 and 4."}]
    assert tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>user\nAdd 3 and 4.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert all(
        tokenizer.convert_tokens_to_ids(t) < 8 for t in VISION_TOKENS
    )  # after the 3 defaults


def test_forward_and_generate_with_an_image(tiny_vl_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_vl_model_dir)
    config = AutoConfig.from_pretrained(tiny_vl_model_dir)
    processor = load_vision_processor(tiny_vl_model_dir, tokenizer, config)
    image = Image.new("RGB", (56, 56), (200, 30, 30))
    text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    (count,) = processor.tokens_per_image([(56, 56)])
    assert count == 4  # 4 x 4 patches of 14 pixels, merged 2 x 2
    ids = tokenizer(processor.expand(text, [count]))["input_ids"]
    inputs = processor.image_inputs(ids, [image])
    assert inputs.image_grid_thw_N3.tolist() == [[1, 4, 4]]
    assert inputs.pixel_values_PD.shape == (16, 3 * 2 * 14 * 14)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir).eval()
    ids_1S = torch.tensor([ids])
    kwargs = dict(
        pixel_values=inputs.pixel_values_PD,
        image_grid_thw=inputs.image_grid_thw_N3,
        mm_token_type_ids=(ids_1S == config.image_token_id).int(),
    )
    with torch.no_grad():
        logits = model(input_ids=ids_1S, **kwargs).logits
        out = model.generate(input_ids=ids_1S, max_new_tokens=3, do_sample=False, **kwargs)
    assert logits.shape == (1, len(ids), config.text_config.vocab_size)
    assert out.shape == (1, len(ids) + 3)


def test_same_seed_same_weights(tmp_path):
    a = AutoModelForImageTextToText.from_pretrained(build_tiny_vl_model(tmp_path / "a", seed=3))
    b = AutoModelForImageTextToText.from_pretrained(build_tiny_vl_model(tmp_path / "b", seed=3))
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None,
    reason="transformers builds a Qwen2.5-VL AutoProcessor only with torchvision",
)
def test_auto_processor_loads_the_folder(tiny_vl_model_dir):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_vl_model_dir)
    image = Image.new("RGB", (56, 56), (200, 30, 30))
    text = processor.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    out = processor(text=[text], images=[image], return_tensors="pt")
    tokenizer = AutoTokenizer.from_pretrained(tiny_vl_model_dir)
    mine = load_vision_processor(
        tiny_vl_model_dir, tokenizer, AutoConfig.from_pretrained(tiny_vl_model_dir)
    )
    ids = tokenizer(mine.expand(text, mine.tokens_per_image([(56, 56)])))["input_ids"]
    assert out["input_ids"][0].tolist() == ids
    assert (
        out["image_grid_thw"].tolist() == mine.image_inputs(ids, [image]).image_grid_thw_N3.tolist()
    )
