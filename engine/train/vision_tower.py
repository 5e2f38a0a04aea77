"""A vision-language model's vision tower runs in every training forward, images or not.

Under FSDP each of the tower's blocks is a unit of its own, and a unit's forward gathers
its shards from every rank: a rank whose micro-batch has no image would skip the tower
while the others gather its blocks, and the ranks' collectives would pair up wrongly
(gloo aborts with "a collective mismatch", NCCL hangs or mixes tensors). So a
micro-batch of a vision-language batch without images (text rows, in a dataset that
mixes them) runs the tower on one blank image of the smallest grid the merge allows and
adds its features to the embeddings times 0: the same collectives as a rank with
images, the same results, and a zero gradient through the tower.

The model call carries ``NO_IMAGES`` (``engine.train.packing``); a pre-hook on the
language model, where the model has embedded the tokens and its root's weights are
gathered, runs the tower. Qwen2-VL's layout: the module with ``language_model`` and
``get_image_features``.
"""

from __future__ import annotations

import torch
from torch import nn

NO_IMAGES = "rlctl_no_images"  # the model call's keyword: no image in this micro-batch
_HOOKED = "_rlctl_tower_hook"


def keep_tower_running(model: nn.Module) -> None:
    """Install the hook on ``model`` (a vision-language model; idempotent)."""
    if getattr(model, _HOOKED, False):
        return
    # the model's own (Qwen2-VL's layout), under whatever wraps it
    inner = next(
        m
        for m in model.modules()
        if hasattr(m, "get_image_features") and hasattr(m, "language_model")
    )
    language = inner.language_model
    vision_config = inner.config.vision_config

    def run_tower(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if not kwargs.pop(NO_IMAGES, False):
            return None
        embeds = kwargs["inputs_embeds"]
        pixels, grid = blank_image(vision_config, embeds.device)
        features = inner.get_image_features(pixels.to(embeds.dtype), grid).pooler_output
        if not isinstance(features, torch.Tensor):
            features = torch.cat(list(features))
        kwargs["inputs_embeds"] = embeds + 0.0 * features.sum().to(embeds.dtype)
        return args, kwargs

    language.register_forward_pre_hook(run_tower, with_kwargs=True)
    setattr(model, _HOOKED, True)


def blank_image(vision_config, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One blank image's patches and grid: (1, 2·merge, 2·merge) patches, the smallest
    that every window and merge of the tower divides."""
    merge = int(vision_config.spatial_merge_size)
    side = 2 * merge
    patch = int(vision_config.patch_size)
    depth = int(vision_config.in_channels) * int(vision_config.temporal_patch_size) * patch**2
    pixels = torch.zeros((side * side, depth), device=device)
    grid = torch.tensor([[1, side, side]], device=device)
    return pixels, grid
