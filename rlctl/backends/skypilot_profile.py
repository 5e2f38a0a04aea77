"""Per-infra settings for the SkyPilot backend: ``<RLCTL_HOME>/skypilot.yaml``.

By default every node runs rlctl's engine image (``image_id: docker:<image>``), which
carries Python, the engine and its dependencies. Some infras cannot run it, or have the
software already: a Slurm cluster without Pyxis (SkyPilot refuses docker images there),
machines with a shared environment. For those, name the infra and say what the nodes
run instead::

    slurm/my-cluster:            # --cloud slurm/my-cluster (and its partitions)
      image: none                # the nodes' own software, no container
      prelude:                   # shell lines run first, in setup and run, on every node
        - source /shared/envs/rl/bin/activate
    k8s:                         # any Kubernetes context
      image: registry.example.com/rlctl/engine:0.1.0-cuda

The most specific entry whose infra is a prefix of ``--cloud`` applies (``slurm/a`` over
``slurm``); a launch without ``--cloud`` uses none. The prelude is the site's own shell,
written by the person who owns this file, and goes into the scripts as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rlctl.backends.skypilot_infra import parse_infra
from rlctl.errors import RlctlError, closest_or_all
from rlctl.home import read_site_file, rlctl_home
from rlctl.recipe.values import check_image

PROFILE_FILE = "skypilot.yaml"
NO_IMAGE = "none"


@dataclass(frozen=True)
class NodeSoftware:
    """What the nodes of one infra run the job with."""

    image: str | None = None  # None: the accelerator's rlctl image; "none": no container
    prelude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.image is not None:
            check_image(self.image, "skypilot profile")
        for line in self.prelude:
            if "\n" in line:
                raise RlctlError("skypilot profile: a prelude entry holds a newline: one line each")

    def image_id(self, default_image: str) -> str | None:
        """SkyPilot's ``image_id``, or None to run on the nodes' own software."""
        image = self.image or default_image
        if image == NO_IMAGE:
            return None
        return image if image.startswith("docker:") else f"docker:{image}"


def load_profile(path: Path | None = None) -> dict[str, NodeSoftware]:
    """The profile's entries by infra (``slurm/my-cluster``); empty if there is no file."""
    path = path or rlctl_home(create=False) / PROFILE_FILE
    shape = "a mapping of infra (slurm/NAME, k8s, gcp, ...) to settings"
    raw = read_site_file(PROFILE_FILE, shape, path) or {}

    for infra in raw:
        try:
            parse_infra(str(infra))
        except RlctlError as exc:
            raise RlctlError(f"{path}: infra {infra!r}: {exc}", hint=exc.hint) from None
    return {str(infra): entry(value, f"{path}: {infra}") for infra, value in raw.items()}


def entry(raw: Any, source: str) -> NodeSoftware:
    if not isinstance(raw, Mapping):
        raise RlctlError(f"{source}: settings are a mapping (image:, prelude:)")
    known = [f.name for f in fields(NodeSoftware)]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise RlctlError(f"{source}: unknown field {key!r}", hint=closest_or_all(key, known))
        if key == "prelude":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise RlctlError(f"{source}: prelude must be a list of shell lines")
            values[key] = tuple(items)
        elif value is not None:
            values[key] = str(value)
    try:
        return NodeSoftware(**values)
    except RlctlError as exc:  # say which file and entry
        raise RlctlError(f"{source}: {exc.message}", hint=exc.hint) from None


def for_infra(profile: Mapping[str, NodeSoftware], infra: str | None) -> NodeSoftware:
    """The most specific entry whose infra is a prefix of ``infra`` (by path segment);
    defaults when none is."""

    if not infra:
        return NodeSoftware()
    want = infra.split("/")
    best: tuple[int, NodeSoftware] = (0, NodeSoftware())
    for key, settings in profile.items():
        have = (parse_infra(key).value or "").split("/")
        if want[: len(have)] == have and len(have) > best[0]:
            best = (len(have), settings)
    return best[1]
