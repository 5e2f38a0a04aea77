"""A vision-language prompt as vLLM takes it (``multi_modal_data``), built so that the
sampler's tokens are the trainer's.

The engine's prompt ids come with each image's pad token already repeated once per
merged patch (``engine.models.processor``), and its pixels made by the engine's image
processor. vLLM's Qwen2-VL input processor does both itself: given a token prompt and
``multi_modal_data={"image": [...]}`` it runs the model's image processor on the images
and replaces each image's one pad token with as many as that image's patches (it
expands every pad it finds, so an already expanded prompt would be expanded again).
vLLM's own image input takes raw images or precomputed embeddings, not pixel values.

So each request carries the prompt with each image's run of pad tokens collapsed to
one, and the images themselves (``ImageInputs.sources``, RGB PIL images); the expanded
prompt vLLM reports back is checked against the engine's own, token for token, so a
disagreement between the two image processors (other ``min_pixels``/``max_pixels``)
stops the run instead of training on other tokens than were sampled. The images' pixel
values on the two sides come from the same resize rule, transformers' for Qwen2-VL;
vLLM's model module imports transformers' torchvision image processor, which is why a
build without torchvision (vLLM's CPU build here) cannot load these models at all.

Written against vLLM 0.32's ``TokensPrompt`` (``vllm.inputs.llm``) and its Qwen2-VL
processor; run only where vLLM is a GPU build (docs/vision.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError
from engine.types import ImageInputs

# vLLM clamps a logit bias to ±100: e^-100 of the probability, never sampled in practice
NEVER = -100.0


@dataclass(frozen=True)
class VisionTokens:
    """What locating a prompt's images takes (the pad token, the patch merge), and the
    pad tokens a response must never hold (the forward would count one as an image's)."""

    image_token_id: int
    merge_size: int
    video_token_id: int | None = None

    @classmethod
    def of_config(cls, hf_config: Any) -> VisionTokens | None:
        """The model's, or None for a text model."""
        vision = getattr(hf_config, "vision_config", None)
        if vision is None:
            return None
        video = getattr(hf_config, "video_token_id", None)
        return cls(
            int(hf_config.image_token_id),
            int(vision.spatial_merge_size),
            None if video is None else int(video),
        )

    def logit_bias(self) -> dict[int, float]:
        """SamplingParams' ``logit_bias`` that keeps the pad tokens out of responses."""
        ids = (self.image_token_id, self.video_token_id)
        return {i: NEVER for i in ids if i is not None}


def vision_tokens(model_path: str, trust_remote_code: bool = False) -> VisionTokens | None:
    """The model's ``VisionTokens`` from its config.json, None for a text model."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    return VisionTokens.of_config(config)


def collapse_image_pads(ids: Sequence[int], images: ImageInputs, tokens: VisionTokens) -> list[int]:
    """``ids`` with each image's ``t·h·w / merge²`` pad tokens (its grid's) made one, as
    the chat template renders an image before a processor expands it."""
    counts = [
        int(t * h * w) // tokens.merge_size**2 for t, h, w in images.image_grid_thw_N3.tolist()
    ]
    out: list[int] = []
    at = image = 0
    while at < len(ids):
        if ids[at] != tokens.image_token_id:
            out.append(ids[at])
            at += 1
            continue
        if image == len(counts):
            raise EngineError(f"more image pad tokens than the prompt's {len(counts)} images")
        run = ids[at : at + counts[image]]
        if len(run) != counts[image] or any(t != tokens.image_token_id for t in run):
            raise EngineError(f"image {image} needs {counts[image]} consecutive pad tokens at {at}")
        out.append(tokens.image_token_id)
        at += counts[image]
        image += 1
    if image != len(counts):
        raise EngineError(f"{len(counts)} images but pad tokens for {image}")
    return out


def vllm_prompt(
    ids: Sequence[int], images: ImageInputs | None, tokens: VisionTokens | None
) -> dict[str, Any]:
    """One request's prompt (a ``vllm.inputs.TokensPrompt``: a typed dict)."""
    if images is None:
        return {"prompt_token_ids": list(ids)}
    if tokens is None:
        raise EngineError("a prompt with images for a model without a vision tower")
    if len(images.sources) != len(images.image_grid_thw_N3):
        raise EngineError(
            f"{len(images.image_grid_thw_N3)} images but {len(images.sources)} kept for vLLM"
            " (ImageInputs.sources): the prompts were read without them"
        )
    return {
        "prompt_token_ids": collapse_image_pads(ids, images, tokens),
        "multi_modal_data": {"image": list(images.sources)},
    }


def check_expanded(row: int, engine_ids: Sequence[int], vllm_ids: Sequence[int] | None) -> None:
    """vLLM's expanded prompt against the engine's: the trainer scores the engine's."""
    if vllm_ids is None or list(vllm_ids) == list(engine_ids):
        return
    raise EngineError(
        f"row {row}: vLLM expanded the prompt's images into {len(vllm_ids)} tokens, the"
        f" engine's processor into {len(engine_ids)}: the two image processors disagree, and"
        " the trainer would score other tokens than were sampled. data.mm_processor_kwargs"
        " reaches both; check that the model's preprocessor_config.json is the one vLLM reads"
    )
