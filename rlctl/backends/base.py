"""The interface every backend implements: submit, status, logs, stop."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from rlctl.errors import RlctlError
from rlctl.jobs import Job, JobState
from rlctl.spec import JobPaths, JobSpec


@dataclass(frozen=True)
class Observed:
    """What a backend sees of a job right now."""

    state: JobState
    reason: str | None = None
    exit_code: int | None = None


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


class Backend(Protocol):
    name: str

    def paths(self, job_id: str) -> JobPaths:
        """Where the job's files will live where it runs."""
        ...

    def render(self, job_id: str, spec: JobSpec) -> dict[str, str]:
        """The files the job runs (name -> content), for ``rlctl plan`` and ``submit``."""
        ...

    def submit(self, job: Job, spec: JobSpec, secrets: Mapping[str, str]) -> dict:
        """Start the job; return the handle to store. ``secrets`` are values, passed to
        the job's environment only (never written to a file)."""
        ...

    def status(self, job: Job) -> Observed: ...

    def logs(self, job: Job, follow: bool) -> Iterator[str]: ...

    def stop(self, job: Job, grace_s: float) -> None: ...
