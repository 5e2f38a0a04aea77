"""The actor's weights version, held once on the controller: what the overlap modes,
the generator and the rollouter ask when they need to know how new the weights are.

The version counts the actor's updates (and carries across a resume); a rollout on
workers of its own (``rollout.placement=separate``) holds the version last pushed to
it, and is pushed the one it lacks before it generates. Colocated, each rollout worker
syncs from the actor beside it, so it always serves the current version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.rollout.bridge import Pushed

if TYPE_CHECKING:
    from engine.controller.workers import Workers


class WeightsVersion:
    def __init__(self, separate: bool) -> None:
        self.separate = separate  # the rollout has workers (and weights) of its own
        self.version = 0  # the actor's updates
        self.pushed: int | None = None  # the version a separate rollout holds
        self.sent = Pushed()  # what the pushes since the last step's metrics carried

    def updated(self) -> None:
        """The actor took one more optimizer step."""
        self.version += 1

    def restore(self, version: int) -> None:
        """The version a checkpoint saved; a separate rollout is pushed it before it
        generates again."""
        self.version = version
        self.pushed = None

    def push(self, workers: Workers) -> None:
        """A separate rollout gets the actor's weights when they changed."""
        if self.separate and self.pushed != self.version:
            self.sent += workers.push_weights()
            self.pushed = self.version

    @property
    def served(self) -> int:
        """The version the rollout generates with."""
        return self.version if self.pushed is None else self.pushed

    def take_sent(self) -> Pushed:
        """What the pushes carried since the last call."""
        sent, self.sent = self.sent, Pushed()
        return sent
