"""The synthetic visual task: which of two coloured squares is larger. Generated, no
download; written in verl's layout for images (a parquet ``images`` column, each image
``{"bytes": PNG, "path": None}`` as Hugging Face ``datasets`` stores an ``Image``
feature, and an ``<image>`` placeholder in the chat where it goes).

Each image is a white square with a red and a blue square on it, of clearly different
sides, at random places that do not overlap; the answer is the larger one's colour
(``"red"`` or ``"blue"``, each half of the rows). The question's text is the same on
every row, so only the image tells the answers apart: a model that does not see it
cannot beat chance (``engine.reward.shapes`` scores a wrong colour -1, so chance is 0).
``blank=True`` writes the same rows with white images, the control for that claim.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

from engine.data.synthetic import write_splits

DATA_SOURCE = "synthetic/shapes"
ABILITY = "vision"
COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220)}
QUESTION = "<image>Which square is larger, red or blue?"
IMAGE_SIZE = 56  # pixels a side: 4 x 4 patches of 14, 4 tokens after the 2 x 2 merge
SIDES = (12, 28)  # smallest and largest square side, in pixels (28: half the image)
MIN_DIFFERENCE = 8  # the two sides differ by at least this many pixels


def draw(sides: dict[str, int], corners: dict[str, tuple[int, int]], size: int = IMAGE_SIZE):
    """A white ``size`` x ``size`` RGB image with a filled square of each colour."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    for colour, side in sides.items():
        x, y = corners[colour]
        pen.rectangle((x, y, x + side - 1, y + side - 1), fill=COLOURS[colour])
    return image


def make_problem(rng: random.Random, answer: str) -> tuple[dict[str, int], dict[str, tuple]]:
    """Sides and top-left corners of the two squares, ``answer``'s the larger: one in
    the left half, the other in the right (which is which drawn), so they never overlap."""
    small = rng.randint(SIDES[0], SIDES[1] - MIN_DIFFERENCE)
    large = rng.randint(small + MIN_DIFFERENCE, SIDES[1])
    other = "blue" if answer == "red" else "red"
    sides = {answer: large, other: small}
    left, right = rng.sample(list(COLOURS), 2)
    half = IMAGE_SIZE // 2
    corners = {}
    for colour, x0 in ((left, 0), (right, half)):
        side = min(sides[colour], half)
        corners[colour] = (x0 + rng.randint(0, half - side), rng.randint(0, IMAGE_SIZE - side))
    return sides, corners


def png_bytes(image: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def make_rows(n: int, *, split: str, seed: int, blank: bool = False) -> list[dict[str, Any]]:
    """``n`` rows in verl's layout, deterministic in (split, seed); answers alternate
    red, blue so that each is half of any even number of rows."""
    from PIL import Image

    rng = random.Random(f"{DATA_SOURCE}:{split}:{seed}")
    white = png_bytes(Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255)))
    rows = []
    for index in range(n):
        answer = ("red", "blue")[index % 2]
        sides, corners = make_problem(rng, answer)
        image = white if blank else png_bytes(draw(sides, corners))
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": QUESTION}],
                "images": [{"bytes": image, "path": None}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index, "sides": sides},
            }
        )
    return rows


def write_shapes_dataset(
    out_dir: str | Path, *, n_train: int = 512, n_val: int = 64, seed: int = 0, blank: bool = False
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` under ``out_dir``; return their paths."""
    return write_splits(
        out_dir, lambda n, split: make_rows(n, split=split, seed=seed, blank=blank), n_train, n_val
    )


def corpus_lines() -> list[str]:
    """The task's text as the chat template lays it out, for a tokenizer's training."""
    question = QUESTION.replace("<image>", "")
    return [f"user\n{question}\nassistant\n{c}" for c in COLOURS for _ in range(200)]
