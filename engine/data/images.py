"""Images in verl's data layout: the image column's cells, and ``<image>`` placeholders.

A row's ``data.image_key`` column (``images`` by default) holds a list of its images,
each as Hugging Face ``datasets`` stores an ``Image`` feature in parquet,
``{"bytes": PNG/JPEG..., "path": ...}`` (the bytes win when both are set), or a local
path (a string, or ``{"image": path}``; ``file://`` allowed). The chat marks where each
goes with ``<image>`` in a message's text, in order: the k-th placeholder is the k-th
image, and every image has one (verl's rule). A message with placeholders becomes a list
of parts, ``{"type": "image"}`` and ``{"type": "text", "text": ...}``, which the
model's chat template renders (Qwen's: ``<|vision_start|><|image_pad|><|vision_end|>``).
URLs are refused: no network is assumed; store the bytes.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from engine.data.errors import DataError

PLACEHOLDER = "<image>"
_SPLIT = re.compile(f"({re.escape(PLACEHOLDER)})")


def open_image(cell: Any, where: str) -> Any:
    """One image cell as an RGB ``PIL.Image``; ``where`` names the row in errors."""
    image = _opened(cell, where)
    try:
        return image.convert("RGB")
    except OSError as exc:
        raise DataError(f"{where}: not a readable image ({exc})") from exc


def image_size(cell: Any, where: str) -> tuple[int, int]:
    """(height, width) in pixels of one image cell (its header read, not its pixels)."""
    width, height = _opened(cell, where).size
    return height, width


def _opened(cell: Any, where: str) -> Any:
    """The cell's image, opened lazily (PIL reads the header now, the pixels when used)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(cell, Image.Image):
        return cell
    source: Any = cell
    if isinstance(cell, dict):
        source = cell.get("bytes") or cell.get("path") or cell.get("image")
    try:
        if isinstance(source, bytes | bytearray):
            return Image.open(io.BytesIO(source))
        if isinstance(source, str | Path):
            return Image.open(_local_path(str(source), where))
    except UnidentifiedImageError as exc:
        raise DataError(f"{where}: not a readable image ({exc})") from exc
    raise DataError(
        f"{where}: an image must be {{'bytes': ...}}, {{'path': ...}} or a path, got"
        f" {type(cell).__name__}"
    )


def _local_path(text: str, where: str) -> Path:
    if "://" in text and not text.startswith("file://"):
        raise DataError(f"{where}: image {text!r} is a URL; store the image's bytes instead")
    path = Path(text.removeprefix("file://"))
    if not path.is_file():
        raise DataError(f"{where}: image file not found: {path}")
    return path


def with_image_parts(chat: list[dict[str, Any]], images: int, where: str) -> list[dict[str, Any]]:
    """``chat`` with each placeholder-bearing message's text split into parts; the
    placeholders must number ``images``."""
    found = 0
    out = []
    for message in chat:
        content = message["content"]
        if not isinstance(content, str) or PLACEHOLDER not in content:
            out.append(message)
            continue
        parts: list[dict[str, Any]] = []
        for piece in _SPLIT.split(content):
            if piece == PLACEHOLDER:
                parts.append({"type": "image"})
                found += 1
            elif piece:
                parts.append({"type": "text", "text": piece})
        out.append({**message, "content": parts})
    if found != images:
        raise DataError(
            f"{where}: {images} image(s) but {found} {PLACEHOLDER} placeholder(s) in the chat;"
            f" put one {PLACEHOLDER} where each image goes, in order"
        )
    return out
