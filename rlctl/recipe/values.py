"""What a recipe's values may hold: texts walked with their field paths, OmegaConf
resolvers (refused: they would run where you launch), names that look like a secret,
container image names (a recipe's or a site profile's ``image:``)."""

from __future__ import annotations

import re
from typing import Any

from rlctl.errors import RlctlError

# An OmegaConf resolver (``${oc.env:NAME}``): the engine config is resolved on the machine
# that launches, so it would read that machine's environment into the job's files.
RESOLVER = re.compile(r"\$\{\s*[\w.-]*\s*:")


def strings_in(value: Any, path: str) -> list[tuple[str, str]]:
    """Every text in a recipe value, with its field path."""
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings_in(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in strings_in(v, f"{path}[{i}]")]
    return []


SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY")


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


# A container image as the runtimes name it (registry/name:tag, name@sha256:..., a
# docker:// URI, an Apptainer .sif path, Pyxis' registry#image): never an option (a
# leading '-'), and no quotes, spaces or shell characters.
_IMAGE = re.compile(r"[A-Za-z0-9/~.][A-Za-z0-9._/:@#+~-]{0,511}")


def check_image(image: str, source: str) -> None:
    """Refuse what cannot be a container image's name; ``source`` names the field."""
    if not _IMAGE.fullmatch(image.removeprefix("docker:")):
        raise RlctlError(
            f"{source}: image {image!r} is not a container image name",
            hint="e.g. registry.example.com/rlctl/engine:0.1.0-cuda, docker://name:tag or"
            " /path/image.sif (letters, digits and . _ / : @ # + ~ -; not starting with '-')",
        )
