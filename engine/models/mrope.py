"""Qwen2-VL's multimodal rotary positions (M-RoPE), computed per prompt on the driver.

Every token has three positions: temporal, height and width. A text token has the same
number in all three, one more than the token before it. An image's merged patches (its
``t·h·w / merge²`` pad tokens, in row-major order) start at the number ``s`` the next
text token would have had and count (0, row, column) from there; the text after the
image resumes at ``s + max(h, w) / merge``. Padding is position 0, as
``get_rope_index`` leaves it. The rule is that of transformers'
``Qwen2_5_VLModel.get_rope_index`` for images (tests/engine/models/test_mrope.py holds
this to it with left padding); videos are not handled here.

A response continues the prompt as text does: its j-th token is at ``max + 1 + j``,
``max`` the prompt's largest position (what the model's cached ``rope_deltas`` give
its generated tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def prompt_positions(
    ids: Sequence[int], image_grid_thw_N3: torch.Tensor, image_token_id: int, merge_size: int
) -> torch.Tensor:
    """(3, len(ids)) positions of one prompt whose image pad tokens are its images', in
    order, each ``t·h·w / merge²`` of them (``image_grid_thw_N3``: in patches)."""
    ids_L = torch.as_tensor(list(ids), dtype=torch.long)
    out = torch.empty((3, len(ids_L)), dtype=torch.long)
    grids = [tuple(int(x) for x in row) for row in image_grid_thw_N3.tolist()]
    is_image = (ids_L == image_token_id).tolist()
    at = nxt = image = 0
    while at < len(ids_L):
        if not is_image[at]:
            stop = at
            while stop < len(ids_L) and not is_image[stop]:
                stop += 1
            out[:, at:stop] = torch.arange(nxt, nxt + stop - at)
            nxt += stop - at
            at = stop
            continue
        if image >= len(grids):
            raise ValueError(f"more image pad tokens than the {len(grids)} images' grids take")
        t, h, w = grids[image]
        h, w = h // merge_size, w // merge_size
        count = t * h * w
        if at + count > len(ids_L) or not all(is_image[at : at + count]):
            raise ValueError(f"image {image} needs {count} consecutive pad tokens at {at}")
        tt, hh, ww = torch.meshgrid(
            torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"
        )
        out[:, at : at + count] = torch.stack([tt, hh, ww]).reshape(3, -1) + nxt
        nxt += max(h, w)
        at += count
        image += 1
    if image != len(grids):
        raise ValueError(f"{len(grids)} images but pad tokens for {image}")
    return out
