"""What a run is told at start about a config that runs but may not do what it reads
as: verl's conventions this engine follows (a group estimator with one sample a
prompt), and settings that act on fewer roles or steps than their names suggest.
``engine.main`` prints them, each on a ``note:`` line, after the line about the keys
that change nothing here (``given``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.config.algorithm import group_notes, rollout_correction_notes
from engine.config.async_training import off_policy_notes
from engine.config.train import fused_kernel_notes, logit_option_notes

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

NOTES: tuple[Callable[[EngineConfig], list[str]], ...] = (
    group_notes,
    rollout_correction_notes,
    off_policy_notes,
    fused_kernel_notes,
    logit_option_notes,
)


def notes(cfg: EngineConfig) -> list[str]:
    return [note for rule in NOTES for note in rule(cfg)]
