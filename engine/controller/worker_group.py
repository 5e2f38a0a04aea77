"""Resource pools and worker groups (HybridFlow's single controller, SPMD workers).

A ``ResourcePool`` reserves devices with one Ray placement group per node (one
bundle per device). A ``WorkerGroup`` starts one ``WorkerHost`` actor per bundle;
the hosts form one torch.distributed process group and hold the roles placed on
that pool (actor, rollout, reference, critic): colocation is a placement
decision, each role stays its own class. Made, a group's processes start (and import
what they need); ``start`` then joins them in their process group and builds their
roles, so that a driver can do other work meanwhile.

The controller calls a role's method through the group in one of two ways:

    group.call_split("actor", "log_probs", tokens)   # rank r gets chunk r; results concatenated
                                                     # (Megatron TP = t: chunk r // t, see below)
    group.call_split("actor", "update", batch, gather=reduce_rank_metrics)
    group.call_all("actor", "save", path)            # every rank gets the same args; list of results
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from engine.controller import dispatch
from engine.errors import EXIT_FAILED, EngineError
from engine.watchdog import NoWatch, Watch

RELEASE_TIMEOUT_S = 10.0  # for the placement groups' release, at shutdown

if TYPE_CHECKING:
    from engine.rollout.bridge import Pushed


@dataclasses.dataclass(frozen=True)
class PoolSpec:
    nnodes: int
    devices_per_node: int
    ray_resource: str | None  # "GPU", "NPU", or None for CPU workers
    cpus_per_worker: int = 1

    @property
    def world_size(self) -> int:
        return self.nnodes * self.devices_per_node


class WorkerFailure(EngineError):
    """A worker raised or died; the run stops instead of waiting on the others."""

    exit_code = EXIT_FAILED  # not a configuration problem

    def __init__(self, rank: int, reason: str, group: str = "", died: bool = False) -> None:
        self.rank = rank
        # engine.exits: a dead process or node is worth a restart; a raised error recurs
        self.reason = "worker_died" if died else "worker_error"
        of = f" of the {group} group" if group else ""
        super().__init__(f"worker rank {rank}{of} failed: {reason}")


def _cause(exc: Exception) -> str:
    """The worker's own error, without Ray's wrapping (the last line of its traceback)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


class ResourcePool:
    """Devices reserved for one worker group, node by node."""

    def __init__(self, spec: PoolSpec, name: str, ready_timeout_s: float = 120.0) -> None:
        self.spec = spec
        bundle: dict[str, float] = {"CPU": spec.cpus_per_worker}
        if spec.ray_resource:
            bundle[spec.ray_resource] = 1
        # STRICT_PACK: all of a node's devices on one node, so ranks 0..k-1 share a host.
        self.groups: list[PlacementGroup] = [
            placement_group(
                [dict(bundle) for _ in range(spec.devices_per_node)],
                strategy="STRICT_PACK",
                name=f"{name}-node{i}",
            )
            for i in range(spec.nnodes)
        ]
        ready, _ = ray.wait(
            [pg.ready() for pg in self.groups],
            timeout=ready_timeout_s,
            num_returns=len(self.groups),
        )
        if len(ready) < len(self.groups):
            available = ray.available_resources()
            self.release()
            raise EngineError(
                f"the Ray cluster cannot place {spec.nnodes} node(s) × {spec.devices_per_node}"
                f" workers of {bundle} within {ready_timeout_s:.0f}s; available: {available}."
                " Check trainer.nnodes / trainer.n_gpus_per_node against the cluster"
            )

    def bundles(self) -> list[tuple[PlacementGroup, int]]:
        """(placement group, bundle index) for each rank, node-major."""
        return [(pg, i) for pg in self.groups for i in range(self.spec.devices_per_node)]

    def release(self, timeout_s: float = RELEASE_TIMEOUT_S) -> None:
        """Give the placement groups back, waiting at most ``timeout_s``: a cluster whose
        raylet is gone (SIGTERM to the whole job at once) never answers the call, and the
        run must still end; Ray frees the groups with the cluster then."""
        groups, self.groups = self.groups, []
        removing = threading.Thread(
            target=lambda: [remove_placement_group(pg) for pg in groups],
            name="engine-release-placement",
            daemon=True,
        )
        removing.start()
        removing.join(timeout_s)
        if removing.is_alive():
            print(
                f"engine: the Ray cluster did not take the placement groups back in"
                f" {timeout_s:g} s (its node is going away); leaving them to it",
                file=sys.stderr,
                flush=True,
            )


@dataclasses.dataclass
class Pending:
    """Calls started on every rank of a group; ``result`` waits and gathers them."""

    group: WorkerGroup
    refs: list[Any]
    output_ranks: list[int]
    gather: Callable[[list[Any]], Any]
    phase: str = ""  # role.method, for the hang watchdog

    def result(self) -> Any:
        results = self.group.get(self.refs, phase=self.phase)
        return self.gather([results[rank] for rank in self.output_ranks])


class WorkerGroup:
    def __init__(
        self,
        pool: ResourcePool,
        host_cls: type,
        host_kwargs: dict[str, Any],
        layouts: dict[str, dispatch.ModelParallelLayout] | None = None,
        label: str = "",
    ) -> None:
        self.pool = pool
        self.label = label  # in failures: "rollout" for the rollout's own group
        self.world_size = pool.spec.world_size
        # Roles whose model is split over ranks (Megatron TP/PP): the ranks of one model
        # replica work on the same rows.
        self.layouts = dict(layouts or {})
        # what every wait on the ranks registers with (engine.watchdog): none until a
        # run's loop sets its watchdog
        self.watch: Watch = NoWatch()
        remote_cls = ray.remote(host_cls)
        spec = pool.spec
        self.workers = []
        for rank, (pg, index) in enumerate(pool.bundles()):
            options: dict[str, Any] = {
                "num_cpus": spec.cpus_per_worker,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=index
                ),
                "name": None,
            }
            if spec.ray_resource == "GPU":
                options["num_gpus"] = 1
            elif spec.ray_resource:
                options["resources"] = {spec.ray_resource: 1}
            self.workers.append(
                remote_cls.options(**options).remote(
                    rank=rank,
                    world_size=self.world_size,
                    local_rank=index,
                    **host_kwargs,
                )
            )

    def start(self, *args: Any) -> None:
        """Rank 0 picks the rendezvous address; then every rank joins at once and builds
        its roles (``args`` go to each host's ``init_distributed``)."""
        first = self.get([self.workers[0].rendezvous_address.remote()], phase="host.rendezvous")
        master_addr, master_port = first[0]
        joins = [w.init_distributed.remote(master_addr, master_port, *args) for w in self.workers]
        self.get(joins, phase="host.init_distributed")

    def set_watch(self, watch: Watch) -> None:
        """The run's hang watchdog (``engine.watchdog.NoWatch()``: none)."""
        self.watch = watch

    def get(self, refs: list[Any], first_rank: int = 0, phase: str = "") -> list[Any]:
        """Results of one call per rank, in rank order.

        Results are taken as they arrive, so a rank that dies is noticed at once even
        while the others block in a collective waiting for it; the error names the
        rank. The caller then shuts the group down, which ends the blocked ranks.
        The wait is watched under ``phase`` (role.method): with the watchdog on, it looks
        up once a second and raises ``engine.watchdog.Hung`` once the run is declared hung.
        """
        rank_of = {ref: first_rank + i for i, ref in enumerate(refs)}
        pending = list(refs)
        with self.watch.waiting(phase, [(self.label, r) for r in rank_of.values()]) as wait:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=wait.poll_s)
                wait.check()
                if not done:
                    continue
                self.check_result(done[0], rank_of[done[0]])
                wait.done((self.label, rank_of[done[0]]))
        return ray.get(refs)

    def check_result(self, ref: Any, rank: int) -> None:
        """A finished call of ``rank``: its error as a ``WorkerFailure`` naming the rank."""
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise WorkerFailure(
                rank, f"its process died ({_cause(exc)})", self.label, died=True
            ) from exc
        except ray.exceptions.RayTaskError as exc:
            raise WorkerFailure(rank, _cause(exc), self.label) from exc

    def group_of(self, role: str) -> WorkerGroup:
        """This group hosts every role (engine.controller.workers.Workers)."""
        return self

    def push_weights(self) -> Pushed:
        """Colocated, each rollout worker syncs from the actor beside it: nothing to push."""
        raise EngineError(
            "push_weights needs the rollout on workers of its own (rollout.placement=separate)"
        )

    def host_all(self, method: str, *args: Any) -> list[Any]:
        """Every host runs one of its own methods (checkpointing, pid)."""
        refs = [getattr(w, method).remote(*args) for w in self.workers]
        return self.get(refs, phase=f"host.{method}")

    def call_all(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Every rank runs role.method(*args); the results in rank order."""
        refs = [w.call.remote(role, method, *args, **kwargs) for w in self.workers]
        return self.get(refs, phase=f"{role}.{method}")

    def call_split(
        self,
        role: str,
        method: str,
        batch: Any,
        *args: Any,
        gather: Callable[[list[Any]], Any] = dispatch.concat,
    ) -> Any:
        """Rank r runs role.method(chunk r of batch, *args); ``gather`` combines the
        results (default: concatenate batches in rank order).

        For a role whose model is split (``dispatch.ModelParallelLayout``) the batch is
        split over its data-parallel replicas, every rank of a replica gets the replica's
        chunk, and one rank per replica is gathered."""
        return self.submit_split(role, method, batch, *args, gather=gather).result()

    def submit_split(
        self,
        role: str,
        method: str,
        batch: Any,
        *args: Any,
        gather: Callable[[list[Any]], Any] = dispatch.concat,
    ) -> Pending:
        """``call_split`` started, not waited for: the controller goes on (another
        group's work) and takes the result later with ``.result()``."""
        layout = self.layouts.get(role, dispatch.ModelParallelLayout())
        world = self.world_size
        shards = dispatch.split(batch, layout.data_parallel(world))
        refs = [
            w.call.remote(role, method, shards[layout.shard(rank, world)], *args)
            for rank, w in enumerate(self.workers)
        ]
        return Pending(self, refs, layout.output_ranks(world), gather, f"{role}.{method}")

    def submit_each(self, role: str, method: str, per_rank: list[Any], *args: Any) -> Pending:
        """Rank r runs role.method(per_rank[r], *args), not waited for; ``.result()`` is
        the list of results in rank order (the fully asynchronous rollout feeds each
        rank samples of its own, engine.loop.rollouter)."""
        if len(per_rank) != self.world_size:
            raise ValueError(f"{len(per_rank)} inputs for {self.world_size} ranks")
        refs = [
            w.call.remote(role, method, part, *args)
            for part, w in zip(per_rank, self.workers, strict=True)
        ]
        return Pending(self, refs, list(range(self.world_size)), list, f"{role}.{method}")

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Give each worker ``grace_s`` to release what outlives its process (a CPU
        vLLM engine's shared-memory segments), then end it."""
        if self.workers:
            closing = [worker.close.remote() for worker in self.workers]
            ray.wait(closing, num_returns=len(closing), timeout=grace_s)
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        self.pool.release()
