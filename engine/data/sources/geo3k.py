"""Geometry3K (hiyouga/geometry3k): geometry problems with a diagram each, the dataset of
verl's vision-language examples. Its rows keep the image column as verl's does
(``images``: ``{"bytes", "path"}`` per image) and the problem's ``<image>`` placeholder;
the prompt asks for reasoning in ``<think>`` tags and the answer in ``\\boxed{}``, as
verl's preprocessing does, and ``engine.reward.geo3k`` scores it.
"""

from __future__ import annotations

import io
from typing import Any

from engine.data.sources import Source

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = (
    "You FIRST think about the reasoning process as an internal monologue and then provide"
    " the final answer. The reasoning process MUST BE enclosed within <think> </think> tags."
    " The final answer MUST BE put in \\boxed{}."
)


def image_cell(image: Any) -> dict[str, Any]:
    """One image as verl's layout stores it: the hub's ``{"bytes", "path"}`` as it is, a
    decoded ``PIL.Image`` (a hub load that decoded it) as its PNG bytes."""
    if isinstance(image, dict):
        return {"bytes": image.get("bytes"), "path": image.get("path")}
    out = io.BytesIO()
    image.save(out, format="PNG")
    return {"bytes": out.getvalue(), "path": None}


def make_row(raw: dict[str, Any], split: str, index: int) -> dict[str, Any] | None:
    problem, answer = str(raw["problem"]), str(raw["answer"]).strip()
    images = [image_cell(image) for image in raw["images"] or []]
    if not answer or problem.count("<image>") != len(images):
        return None  # no answer, or placeholders that do not match the images
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
        "images": images,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": problem},
    }


SOURCE = Source(
    hub_id=DATA_SOURCE,
    hub_config=None,
    splits={"train": "train", "val": "test"},
    columns=("images", "problem", "answer"),
    local_subdirs=("data",),
    make_row=make_row,
)
