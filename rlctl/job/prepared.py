"""A job made once, from its recipe to what its backend runs: what ``rlctl plan`` shows and
``launch`` submits, carried whole from ``api.prepare`` to the backend's ``submit``.

    job id (drawn first) ──► recipe ──► plan ──► JobSpec ──► the backend's Rendered job
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlctl.job.spec import JobSpec

if TYPE_CHECKING:
    from rlctl.planner.model import Plan
    from rlctl.recipe.load import Recipe


@dataclass(frozen=True)
class Rendered:
    """What a backend makes of a spec: the files the job runs (name -> text) and what the
    nodes' software will be, one line each (``rlctl plan``). A backend with more to carry
    to its ``submit`` (SkyPilot's task) returns a subclass."""

    files: dict[str, str]
    software: tuple[str, ...]


@dataclass(frozen=True)
class Prepared:
    """A recipe resolved for a backend under the job's id: every part made once."""

    job_id: str
    recipe: Recipe
    plan: Plan  # an SFTPlan for ``algorithm: sft``
    spec: JobSpec
    rendered: Rendered

    @property
    def files(self) -> dict[str, str]:
        return self.rendered.files

    @property
    def software(self) -> tuple[str, ...]:
        return self.rendered.software
