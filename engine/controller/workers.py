"""What the controller's loop asks of its workers, whatever their grouping: one
``WorkerGroup`` for every role (colocated), or ``SeparateGroups`` routing each role to a
group of its own (``rollout.placement=separate``, a reward model's own pool). The loop
is typed by this, so it reads the same either way."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from engine.controller.worker_group import Pending, WorkerGroup
    from engine.rollout.bridge import Pushed
    from engine.watchdog import Watch


class Workers(Protocol):
    world_size: int  # the training group's ranks

    def group_of(self, role: str) -> WorkerGroup:
        """The group that hosts ``role`` (the only one, colocated)."""
        ...

    def start(self, *args: Any) -> None:
        """Each group joins its process group and builds its roles."""
        ...

    def set_watch(self, watch: Watch) -> None: ...

    def host_all(self, method: str, *args: Any) -> list[Any]: ...

    def call_all(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def call_split(
        self,
        role: str,
        method: str,
        batch: Any,
        *args: Any,
        gather: Callable[[list[Any]], Any] = ...,
    ) -> Any: ...

    def submit_split(
        self,
        role: str,
        method: str,
        batch: Any,
        *args: Any,
        gather: Callable[[list[Any]], Any] = ...,
    ) -> Pending: ...

    def submit_each(self, role: str, method: str, per_rank: list[Any], *args: Any) -> Pending: ...

    def push_weights(self) -> Pushed:
        """The actor's weights into the rollout's own engines (placement=separate)."""
        ...

    def shutdown(self, grace_s: float = 10.0) -> None: ...
