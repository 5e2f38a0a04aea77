"""Build a tiny Qwen2.5-VL-shaped model and its processor locally, without a model hub.

The model is transformers' own ``Qwen2_5_VLForConditionalGeneration`` with a tiny config
(a 2-block vision tower of width 32 with its 2 x 2 patch merger, a 4-layer text model of
width 128 with multimodal rotary positions; about 1.6M parameters). Its processor's
parts are saved beside it as Qwen's are: the tokenizer (``engine.models.tiny``'s BPE,
trained with the shapes task's text too, plus Qwen's vision special tokens and a ChatML
template that renders an image as ``<|vision_start|><|image_pad|><|vision_end|>``) and
the image processor (Qwen2-VL's: 14-pixel patches, 2 frames, merge 2; images scaled to
between 28 x 28 and 112 x 112 pixels). ``preprocessor_config.json`` names the processor
class, so ``AutoProcessor`` loads the folder where transformers can build a Qwen2.5-VL
processor (it asks torchvision for the video processor; the engine reads the parts
itself, ``engine.models.processor``).

    python -m engine.models.tiny_vl OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from engine.models.tiny import SPECIAL_TOKENS, build_tokenizer

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VISION_PAD = "<|vision_pad|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD)

# ChatML, each message's content a string or a list of parts ({"type": "text", "text"},
# {"type": "image"}), as processors take them; an image renders as Qwen's three tokens,
# whose middle one the processor repeats once per merged patch.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Image processor settings: pixels between one merged patch (28 x 28) and 4 x 4 of them
IMAGE_PROCESSOR = dict(
    min_pixels=28 * 28,
    max_pixels=112 * 112,
    patch_size=14,
    temporal_patch_size=2,
    merge_size=2,
)


def build_vl_tokenizer(vocab_size: int = 2048):
    """The tiny BPE with Qwen's vision tokens (ids right after the three defaults) and
    the shapes task's text in its corpus (so that ``red`` and ``blue`` are one token)."""
    from engine.data import shapes

    return build_tokenizer(
        vocab_size,
        special_tokens=(*SPECIAL_TOKENS, *VISION_TOKENS),
        extra_corpus=shapes.corpus_lines(),
        chat_template=CHAT_TEMPLATE,
    )


def tiny_vl_config(tokenizer: Any, *, hidden_size: int = 128, num_layers: int = 4):
    """A tiny ``Qwen2_5_VLConfig`` whose special ids are ``tokenizer``'s; rotary
    sections (temporal, height, width) of 4, 6 and 6 frequencies (head size 32),
    Qwen's 16, 24, 24 scaled down."""
    from transformers import Qwen2_5_VLConfig

    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in VISION_TOKENS}
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    return Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=4 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
            bos_token_id=None,
            eos_token_id=eos,
            pad_token_id=pad,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=hidden_size,
            window_size=56,  # 2 x 2 merged patches a window; the last block sees all
            fullatt_block_indexes=[1],
            patch_size=IMAGE_PROCESSOR["patch_size"],
            spatial_merge_size=IMAGE_PROCESSOR["merge_size"],
            temporal_patch_size=IMAGE_PROCESSOR["temporal_patch_size"],
        ),
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
    )


def build_tiny_vl_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 2048,
    **sizes: int,
) -> Path:
    """Save a random tiny Qwen2.5-VL (``tiny_vl_config`` with ``sizes``: hidden_size,
    num_layers), its tokenizer and its image processor's config under ``out_dir``;
    return it."""
    from transformers import GenerationConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_vl_tokenizer(vocab_size)
    config = tiny_vl_config(tokenizer, **sizes)
    model = random_model_vl(config, seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    Qwen2VLImageProcessorPil(**IMAGE_PROCESSOR).save_pretrained(out)
    # Qwen's own folders name the processor class here, as AutoProcessor reads it.
    path = out / "preprocessor_config.json"
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "processor_class": "Qwen2_5_VLProcessor"}, indent=2))
    return out


def random_model_vl(config: Any, seed: int = 0):
    """A randomly initialised ``Qwen2_5_VLForConditionalGeneration``: the same weights
    for the same seed."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2_5_VLForConditionalGeneration(config)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engine.models.tiny_vl",
        description="A tiny random Qwen2.5-VL and its processor's parts, built locally.",
    )
    parser.add_argument("out_dir", help="folder to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_tiny_vl_model(args.out_dir, seed=args.seed))


if __name__ == "__main__":
    main()
