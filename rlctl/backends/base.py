"""The interface every backend implements: submit, status, logs, stop."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from rlctl.jobs import Job, JobState
from rlctl.spec import JobPaths, JobSpec


@dataclass(frozen=True)
class Observed:
    """What a backend sees of a job right now."""

    state: JobState
    reason: str | None = None
    exit_code: int | None = None


class Backend(Protocol):
    name: str

    def paths(self, job_id: str) -> JobPaths:
        """Where the job's files will live where it runs."""
        ...

    def describe_software(self, spec: JobSpec) -> list[str]:
        """The image the nodes run and what the setup installs, one line each
        (``rlctl plan``)."""
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
