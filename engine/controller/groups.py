"""The rollout on a worker group of its own (``actor_rollout_ref.rollout.placement=separate``).

Colocated, one ``WorkerGroup`` hosts every role. Separate, the actor, reference and
critic keep the training group and the rollout gets a group of its own devices (and
torch.distributed world), so that generation can run while the actor trains
(``async_training``). ``SeparateGroups`` answers the controller's calls as one group
does, routing each by its role, and moves the actor's weights to the rollout's engines
over a bridge of their own (``engine.rollout.bridge``) when the controller says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from engine.controller import dispatch
from engine.controller.worker_group import Pending, WorkerGroup
from engine.rollout.bridge import SENDER, BridgeAddress, Pushed

ROLLOUT = "rollout"


class SeparateGroups:
    def __init__(self, train: WorkerGroup, rollout: WorkerGroup) -> None:
        self.train, self.rollout = train, rollout
        self.world_size = train.world_size
        self._bridge: BridgeAddress | None = None

    def group_of(self, role: str) -> WorkerGroup:
        return self.rollout if role == ROLLOUT else self.train

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
        """Every host of both groups, at once (each group's hosts meet in their own
        collectives: a checkpoint's barrier); the training group's results first."""
        train = [getattr(w, method).remote(*args) for w in self.train.workers]
        rollout = [getattr(w, method).remote(*args) for w in self.rollout.workers]
        return self._get_both(train, rollout)

    def push_weights(self) -> Pushed:
        """The actor's current weights into every rollout engine: the actor's ranks
        gather them tensor by tensor, its first rank sends them bucket by bucket, each
        rollout rank receives and loads them as they come; what the sender sent."""
        if self._bridge is None:
            host, port = ray.get(self.train.workers[0].rendezvous_address.remote())
            self._bridge = BridgeAddress(host, port, 1 + self.rollout.world_size)
        send = [w.call.remote("actor", "send_weights", self._bridge) for w in self.train.workers]
        load = [
            w.call.remote(ROLLOUT, "receive_weights", self._bridge) for w in self.rollout.workers
        ]
        return self._get_both(send, load)[SENDER]

    def _get_both(self, train: list[Any], rollout: list[Any]) -> list[Any]:
        """Both groups' results, waiting on all at once: a rank that fails in either is
        noticed while the other group's ranks still wait on it (in the bridge)."""
        pending = {ref: group for group, refs in ((self.train, train), (self.rollout, rollout))
                   for ref in refs}  # fmt: skip
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            group = pending.pop(done[0])
            refs = train if group is self.train else rollout
            group.get([done[0]], first_rank=refs.index(done[0]))
        return ray.get(train) + ray.get(rollout)

    def shutdown(self, grace_s: float = 10.0) -> None:
        for group in (self.rollout, self.train):
            group.shutdown(grace_s)
