"""The versions of the optional heavy backends this engine is written and pinned against.

One table, read by the backends at start (``check_version``), by the image tests
(images/Dockerfile.* must pin a version inside the range) and stated again in
pyproject.toml's extras. A missing package is an error naming the extra to install;
an installed version outside the range is reported with the supported range (a
warning by default: APIs such as vLLM's sleep mode and SGLang's weight update move
between minor versions, so this is the first thing to look at when they fail).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from importlib import metadata

from engine.errors import EngineError


@dataclass(frozen=True)
class Supported:
    distribution: str  # the name pip knows
    extra: str  # rlctl[<extra>]
    minimum: str  # inclusive
    below: str  # exclusive
    pinned: str  # the version the images install

    @property
    def range(self) -> str:
        return f">={self.minimum},<{self.below}"


SUPPORTED = {
    "vllm": Supported("vllm", "vllm", "0.10", "0.12", pinned="0.11.0"),
    "sglang": Supported("sglang", "sglang", "0.5", "0.6", pinned="0.5.3"),
    "megatron": Supported("megatron-core", "megatron", "0.13", "0.15", pinned="0.14.0"),
    # The Ascend plugin follows vLLM's version numbers (vllm-ascend 0.11.x runs on vLLM 0.11).
    "vllm-ascend": Supported("vllm-ascend", "vllm", "0.10", "0.12", pinned="0.11.0rc0"),
}


class BackendVersionError(EngineError):
    pass


def version_tuple(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: ``0.11.0rc1+cu128`` → (0, 11, 0)."""
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break  # 0rc1: the release ends here
    return tuple(parts)


def in_range(version: str, spec: Supported) -> bool:
    v = version_tuple(version)
    return version_tuple(spec.minimum) <= v < version_tuple(spec.below)


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_version(backend: str, *, strict: bool = False, installed: str | None = None) -> str:
    """Check the installed ``backend`` against the supported range; returns its version.

    Missing: a ``BackendVersionError`` naming the extra. Outside the range: a warning
    (``strict``: an error) that states the installed version and the supported range.
    ``installed`` overrides the lookup (tests).
    """
    spec = SUPPORTED[backend]
    version = installed if installed is not None else installed_version(spec.distribution)
    if version is None:
        raise BackendVersionError(
            f"rollout/training backend {backend!r} needs {spec.distribution}{spec.range},"
            f" which is not installed: pip install 'rlctl[{spec.extra}]'"
            f" (or use the image rlctl/engine:<version>-cuda, which ships it)"
        )
    if not in_range(version, spec):
        message = (
            f"{spec.distribution} {version} is installed; this engine supports"
            f" {spec.distribution}{spec.range} (images pin {spec.pinned})."
            f" Install a supported version: pip install '{spec.distribution}{spec.range}'"
        )
        if strict:
            raise BackendVersionError(message)
        warnings.warn(message, stacklevel=2)
    return version
