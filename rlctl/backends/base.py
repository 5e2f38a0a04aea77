"""The interface every backend implements: submit, status, logs, stop."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from rlctl.job.prepared import Prepared, Rendered
from rlctl.job.spec import JobPaths, JobSpec
from rlctl.store.jobs import Job, JobState


@dataclass(frozen=True)
class Observed:
    """What a backend sees of a job right now."""

    state: JobState
    reason: str | None = None
    exit_code: int | None = None


class Backend(Protocol):
    name: str

    def paths(self, job_id: str, checkpoints: str | None = None) -> JobPaths:
        """Where the job's files will live where it runs, and where the engine keeps the
        recipe's ``checkpoints`` (a path or a bucket URL) as the nodes reach them."""
        ...

    def render(self, job_id: str, spec: JobSpec) -> Rendered:
        """The files the job runs (name -> content) and the nodes' software (the image
        decided here, once), for ``rlctl plan`` and ``submit``."""
        ...

    def submit(self, job: Job, prepared: Prepared, secrets: Mapping[str, str]) -> dict:
        """Start the prepared job (rendered under ``job.id``) as it is; return the handle
        to store. ``secrets`` are values, passed to the job's environment only (never
        written to a file)."""
        ...

    def status(self, job: Job) -> Observed: ...

    def logs(self, job: Job, follow: bool) -> Iterator[str]: ...

    def stop(self, job: Job, grace_s: float) -> None: ...
