"""Roles on worker groups of their own: the rollout (``rollout.placement=separate``) and
the reward model (``reward_model.enable_resource_pool``).

Colocated, one ``WorkerGroup`` hosts every role. Separate, the actor, reference and
critic keep the training group and the rollout gets a group of its own devices (and
torch.distributed world), so that generation can run while the actor trains
(``async_training``); the reward model may get one too. ``SeparateGroups`` answers the
controller's calls as one group does, routing each by its role (a role without a group
of its own goes to the training group), and moves the actor's weights to the rollout's
engines over a bridge of their own (``engine.rollout.bridge``) when the controller says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from engine.controller import dispatch
from engine.controller.worker_group import Pending, WorkerGroup
from engine.rollout.bridge import SENDER, BridgeAddress, Pushed
from engine.watchdog import NoWatch, Watch

ROLLOUT = "rollout"


class SeparateGroups:
    def __init__(self, train: WorkerGroup, own: dict[str, WorkerGroup]) -> None:
        """``own``: role -> the group of its own (each labelled by its role)."""
        self.train, self.own = train, dict(own)
        self.rollout = self.own.get(ROLLOUT)  # None when the rollout is colocated
        self.world_size = train.world_size
        self._bridge: BridgeAddress | None = None
        self.watch: Watch = NoWatch()

    def set_watch(self, watch: Watch) -> None:
        """The run's hang watchdog, for every group's waits and for those on all at once."""
        self.watch = watch
        for group in self.groups:
            group.set_watch(watch)

    @property
    def groups(self) -> list[WorkerGroup]:
        """The training group, then the others in the order given."""
        return [self.train, *self.own.values()]

    def start(self, *args: Any) -> None:
        """Each group joins its own process group and builds its roles, in order."""
        for group in self.groups:
            group.start(*args)

    def group_of(self, role: str) -> WorkerGroup:
        return self.own.get(role, self.train)

    def call_split(
        self,
        role: str,
        method: str,
        batch: Any,
        *args: Any,
        gather: Callable[[list[Any]], Any] = dispatch.concat,
    ) -> Any:
        return self.group_of(role).call_split(role, method, batch, *args, gather=gather)

    def submit_split(
        self,
        role: str,
        method: str,
        batch: Any,
        *args: Any,
        gather: Callable[[list[Any]], Any] = dispatch.concat,
    ) -> Pending:
        return self.group_of(role).submit_split(role, method, batch, *args, gather=gather)

    def submit_each(self, role: str, method: str, per_rank: list[Any], *args: Any) -> Pending:
        return self.group_of(role).submit_each(role, method, per_rank, *args)

    def call_all(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.group_of(role).call_all(role, method, *args, **kwargs)

    def host_all(self, method: str, *args: Any) -> list[Any]:
        """Every host of every group, at once (each group's hosts meet in their own
        collectives: a checkpoint's barrier); in the order of ``groups``."""
        return self._get_all(
            [(g, [getattr(w, method).remote(*args) for w in g.workers]) for g in self.groups],
            phase=f"host.{method}",
        )

    def push_weights(self) -> Pushed:
        """The actor's current weights into every rollout engine: the actor's ranks
        gather them tensor by tensor, its first rank sends them bucket by bucket, each
        rollout rank receives and loads them as they come; what the sender sent."""
        assert self.rollout is not None, "push_weights needs the rollout's own group"
        if self._bridge is None:
            asked = [self.train.workers[0].rendezvous_address.remote()]
            host, port = self.train.get(asked, phase="host.rendezvous")[0]
            self._bridge = BridgeAddress(host, port, 1 + self.rollout.world_size)
        send = [w.call.remote("actor", "send_weights", self._bridge) for w in self.train.workers]
        load = [
            w.call.remote(ROLLOUT, "receive_weights", self._bridge) for w in self.rollout.workers
        ]
        sync = [(self.train, send), (self.rollout, load)]
        return self._get_all(sync, phase="weight_sync")[SENDER]

    def _get_all(self, calls: list[tuple[WorkerGroup, list[Any]]], phase: str) -> list[Any]:
        """Every group's results, waiting on all at once: a rank that fails in one is
        noticed (named by its group) while the other groups' ranks still wait on it.
        Watched as one wait under ``phase`` (engine.watchdog)."""
        pending = {ref: (group, refs) for group, refs in calls for ref in refs}
        ranks = [(group.label, rank) for group, refs in calls for rank in range(len(refs))]
        with self.watch.waiting(phase, ranks) as wait:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=wait.poll_s)
                wait.check()
                if not done:
                    continue
                group, refs = pending.pop(done[0])
                rank = refs.index(done[0])
                group.check_result(done[0], rank)
                wait.done((group.label, rank))
        return [result for _, refs in calls for result in ray.get(refs)]

    def shutdown(self, grace_s: float = 10.0) -> None:
        for group in reversed(self.groups):
            group.shutdown(grace_s)
