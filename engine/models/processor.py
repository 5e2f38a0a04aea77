"""A vision-language model's processor, as the driver uses it: a chat with images into
prompt ids (each image's pad token repeated once per merged patch) and the images'
pixel values with their grid.

The parts are the model's own: its tokenizer (whose chat template renders an image part
as ``<|vision_start|><|image_pad|><|vision_end|>``) and its image processor, read from
the folder's ``preprocessor_config.json``. The image processor runs on transformers'
PIL backend (``Qwen2VLImageProcessorPil``): transformers 5 builds its ``AutoProcessor``
and ``AutoImageProcessor`` only with torchvision installed (for the video processor
and the default backend), and the engine's CPU environment has none; the PIL backend
makes the same pixels on every machine. The pad tokens are expanded as Qwen2-VL's
processor does (``t·h·w / merge²`` per image), the one model family whose forward the
engine handles (``engine.models.mrope``); others are refused when loaded.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.models.mrope import prompt_positions
from engine.types import ImageInputs

# model_type of the configs whose images this module lays out (Qwen2-VL's rules)
QWEN2_VL_TYPES = ("qwen2_vl", "qwen2_5_vl")
# The processor's own files beside a vision-language model's weights: the image (and
# video) processor's settings, and the processor's config and chat template where the
# model has them. The tokenizer's files are the tokenizer's to save.
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
    "chat_template.json",
)


@dataclass
class VisionProcessor:
    tokenizer: Any
    image_processor: Any
    image_token_id: int
    merge_size: int
    # data.mm_processor_kwargs: the image processor's settings for these prompts
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def image_token(self) -> str:
        return self.tokenizer.convert_ids_to_tokens(self.image_token_id)

    def tokens_per_image(self, sizes: Sequence[tuple[int, int]]) -> list[int]:
        """Pad tokens of images of these (height, width) sizes, from the sizes alone
        (the image processor's resize rule; no pixels are processed)."""
        merge = self.merge_size**2
        return [
            self.image_processor.get_number_of_image_patches(h, w, dict(self.kwargs)) // merge
            for h, w in sizes
        ]

    def expand(self, text: str, counts: Sequence[int]) -> str:
        """``text`` (a rendered chat) with its k-th image token repeated ``counts[k]``
        times."""
        token = self.image_token
        pieces = text.split(token)
        if len(pieces) - 1 != len(counts):
            raise ValueError(
                f"the chat template rendered {len(pieces) - 1} {token} for {len(counts)} images"
            )
        out = [pieces[0]]
        for count, piece in zip(counts, pieces[1:], strict=True):
            out += [token * count, piece]
        return "".join(out)

    def image_inputs(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> ImageInputs:
        """The images (RGB ``PIL.Image``) of a prompt whose pad tokens are expanded:
        their pixel values and grids, the prompt's rotary positions, and the images
        themselves (a vLLM rollout's processor makes its own pixels from them)."""
        out = self.image_processor(images=list(images), return_tensors="pt", **self.kwargs)
        grid = out["image_grid_thw"].long()
        return ImageInputs(
            pixel_values_PD=out["pixel_values"].float(),
            image_grid_thw_N3=grid,
            positions_3P=prompt_positions(prompt_ids, grid, self.image_token_id, self.merge_size),
            sources=tuple(images),
        )


def load_vision_processor(
    path: str | Path, tokenizer: Any, hf_config: Any, kwargs: dict[str, Any] | None = None
) -> VisionProcessor:
    """The processor of the vision-language model whose config is ``hf_config``, its
    image processor read from ``path`` (a folder or a hub name in the local cache)."""
    model_type = getattr(hf_config, "model_type", "?")
    if model_type not in QWEN2_VL_TYPES:
        raise EngineError(
            f"vision-language model type {model_type!r} is not supported yet; the engine lays"
            f" out images for {', '.join(QWEN2_VL_TYPES)} (docs/vision.md)"
        )
    image_processor = _pil_image_processor(path)
    merge = int(image_processor.merge_size)
    if merge != hf_config.vision_config.spatial_merge_size:
        raise EngineError(
            f"{path}: the image processor merges {merge} x {merge} patches, the model"
            f" {hf_config.vision_config.spatial_merge_size}; they must agree"
        )
    return VisionProcessor(
        tokenizer=tokenizer,
        image_processor=image_processor,
        image_token_id=int(hf_config.image_token_id),
        merge_size=merge,
        kwargs=dict(kwargs or {}),
    )


def _pil_image_processor(path: str | Path) -> Any:
    """The image processor named in ``path``'s preprocessor config, on the PIL backend."""
    import transformers
    from transformers.utils import cached_file

    try:
        config_file = cached_file(str(path), "preprocessor_config.json")
    except OSError as exc:
        raise EngineError(
            f"{path}: no preprocessor_config.json (the image processor's settings), which a"
            " vision-language model needs beside its weights"
        ) from exc
    name = json.loads(Path(config_file).read_text()).get("image_processor_type", "")
    name = name.removesuffix("Fast")
    cls = getattr(transformers, name if name.endswith("Pil") else f"{name}Pil", None)
    if cls is None:
        raise EngineError(f"{path}: image processor {name!r} has no PIL backend in transformers")
    return cls.from_pretrained(str(path))


def copy_processor_files(hf_config: Any, dest: str | Path) -> list[str]:
    """The processor's files (``PROCESSOR_FILES``) of the model ``hf_config`` was loaded
    from (its folder, or its hub name in the local cache), copied into ``dest``, so that
    a checkpoint's ``hf/`` and the folder exported from it load with their processor;
    the names copied. Nothing for a text model; a file ``dest`` already has is kept."""
    from engine.models.hf_config import is_vision_language

    source = getattr(hf_config, "_name_or_path", "")
    if not (is_vision_language(hf_config) and source):
        return []
    from transformers.utils import cached_file

    dest = Path(dest)
    copied = []
    for name in PROCESSOR_FILES:
        found = cached_file(
            source,
            name,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
        if found is None or (dest / name).exists():
            continue
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found, dest / name)
        copied.append(name)
    return copied
