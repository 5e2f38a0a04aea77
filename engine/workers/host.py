"""The process on one device: joins the process group and hosts the roles placed there.

A host holds no algorithm logic. It owns what every role on its device shares:
the torch.distributed process group, the device, and the tokenizer. Roles are
built in order, so a colocated rollout can generate with the actor's own module.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.device import DeviceSpec, local_rank_from_env, resolve_device, set_device
from engine.memory_peaks import PhasePeaks
from engine.startup import gc_paused
from engine.watchdog import StackFile, hang_forever_for_test, hang_point_for_test

# The role classes, in the order they are built on a host (sft: engine.sft's runs).
ROLE_ORDER = ("actor", "rollout", "ref", "teacher", "critic", "rm", "sft")
# The roles with state that changes during training (and so goes into checkpoints).
TRAINED_ROLES = ("actor", "critic", "sft")


def _role_class(role: str) -> type:
    # Imported lazily: a host builds only the roles placed on it.
    if role == "actor":
        from engine.workers.actor import ActorWorker

        return ActorWorker
    if role == "rollout":
        from engine.workers.rollout import rollout_role

        return rollout_role
    if role == "ref":
        from engine.workers.reference import ReferenceWorker

        return ReferenceWorker
    if role == "teacher":
        from engine.workers.teacher import TeacherWorker

        return TeacherWorker
    if role == "critic":
        from engine.workers.critic import CriticWorker

        return CriticWorker
    if role == "rm":
        from engine.workers.reward_model import reward_model_role

        return reward_model_role
    if role == "sft":
        from engine.workers.sft import SFTWorker

        return SFTWorker
    raise ValueError(f"unknown role {role!r}; valid: {', '.join(ROLE_ORDER)}")


class WorkerHost:
    def __init__(
        self,
        rank: int,
        world_size: int,
        local_rank: int,
        cfg: EngineConfig,
        roles: list[str],
        cpus_per_worker: int = 1,
        group: str = "",
    ) -> None:
        self.rank = rank
        # "rollout" for the rollout's own group (placement=separate): its own world and
        # its own random-state files
        self.group = group
        self.world_size = world_size
        self.cfg = cfg
        self.device: DeviceSpec = resolve_device(cfg.trainer.device)
        self.local_rank = (
            local_rank_from_env(self.device) if self.device.type != "cpu" else local_rank
        )
        torch.set_num_threads(max(1, cpus_per_worker))
        self.role_names = [r for r in ROLE_ORDER if r in roles]
        with gc_paused():  # what building the roles imports, now: the process is new
            from transformers import AutoTokenizer  # noqa: F401

            for name in self.role_names:
                _role_class(name)
        self.roles: dict[str, Any] = {}
        self._uploader: Any = None  # engine.storage.BackgroundUploader, made on first use
        # when this process was up, and when its roles were built (engine.startup)
        self._startup_times = {"workers": time.time()}
        # SIGUSR1 writes every thread's stack here, even with the main thread stuck
        # (engine.watchdog: the driver's hang watchdog reads it)
        self._stacks = StackFile()
        self._hang_at = hang_point_for_test(group, rank)  # None outside tests
        self._peaks = PhasePeaks(self.device.type)  # memory per role.method (memory_peaks)
        self._calls: dict[str, int] = {}

    def rendezvous_address(self) -> tuple[str, int]:
        ip = _node_ip()
        with socket.socket() as s:
            s.bind(("", 0))
            return ip, s.getsockname()[1]

    def init_distributed(
        self, master_addr: str, master_port: int, cfg: EngineConfig | None = None
    ) -> None:
        """Join the process group, then build the roles; ``cfg``: the run's config when
        it is known only now (the host was made while the driver read the data, which
        sets the schedule's length), else the one the host was made with."""
        self.cfg = cfg or self.cfg
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(self.local_rank),
        )
        set_device(self.device, self.local_rank)
        dist.init_process_group(
            backend=self.device.backend,
            rank=self.rank,
            world_size=self.world_size,
            # a collective stuck past this raises (gloo) or aborts (NCCL); the watchdog,
            # bounded by hang_timeout_floor_s and below this, reports first
            timeout=timedelta(seconds=self.cfg.trainer.collective_timeout_s),
        )
        self._build_roles()

    def _build_roles(self) -> None:
        from transformers import AutoTokenizer

        model = self.cfg.actor_rollout_ref.model
        tokenizer = AutoTokenizer.from_pretrained(
            model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code
        )
        # The same seed on every rank while models are built (a new value head must
        # start identical on all shards), then one per rank so samples differ.
        torch.manual_seed(self.cfg.trainer.seed)
        for name in self.role_names:
            self.roles[name] = _role_class(name)(
                cfg=self.cfg, device=self.device, tokenizer=tokenizer, colocated=self.roles
            )
        torch.manual_seed(self.cfg.trainer.seed * 100_003 + self.rank)
        self._startup_times["models"] = time.time()

    def startup_times(self) -> dict[str, float]:
        """``time.time()`` when this host was made ("workers") and when its roles were
        built ("models")."""
        return dict(self._startup_times)

    def reset(self, cfg: EngineConfig) -> None:
        """Another run in this process and process group: the roles closed, then built
        again from ``cfg`` as at the start (fresh models, optimizers and seeds). For
        runs that place the same roles the same way (tests/e2e keeps one group across
        the algorithm variants); what ``__init__`` set from the old config stays."""
        self._close_roles()
        self.cfg = cfg
        self._build_roles()

    # Checkpoints: the trained roles save their shards; the host saves what the roles
    # share, the random state (rollout sampling draws from it).

    def save_checkpoint(self, path: str) -> None:
        for name in TRAINED_ROLES:
            if name in self.roles:
                self.roles[name].save(os.path.join(path, name))
        rng_dir = Path(path) / "rng"
        rng_dir.mkdir(parents=True, exist_ok=True)
        torch.save(_rng_state(self.device), rng_dir / self._rng_file)
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        for name in TRAINED_ROLES:
            if name in self.roles:
                self.roles[name].load(os.path.join(path, name))
        rng_file = Path(path) / "rng" / self._rng_file
        if rng_file.exists():  # absent after a change of world size: keep fresh seeds
            _set_rng_state(self.device, torch.load(rng_file, weights_only=False))

    @property
    def _rng_file(self) -> str:
        return f"{self.group}_rank_{self.rank}.pt" if self.group else f"rank_{self.rank}.pt"

    # With a bucket, one host per node (local rank 0) moves the node's files.

    def upload_checkpoint(self, local_dir: str, root: str, name: str) -> None:
        # The rollout's own group holds no trained state; its random state stays on
        # local disk (a resume from a bucket on other nodes draws fresh seeds for it).
        if self.local_rank != 0 or self.group:
            return
        if self._uploader is None:
            from engine.storage import BackgroundUploader, open_store

            self._uploader = BackgroundUploader(open_store(root))
        self._uploader.submit(Path(local_dir), name)

    def uploads_pending(self, block: bool) -> int:
        if self._uploader is None:
            return 0
        if block:
            self._uploader.wait()
        return self._uploader.pending()

    def download_checkpoint(self, url: str, local_dir: str) -> None:
        if self.local_rank != 0 or self.group:
            return
        from engine.storage import open_store

        open_store(url).download_dir("", Path(local_dir))

    def pid(self) -> int:
        return os.getpid()

    def whereabouts(self) -> dict[str, Any]:
        """This process, its Ray node and its stack file (the run's workers.json)."""
        import ray

        return {
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "stack_file": self._stacks.path,
        }

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._hang_at is not None:  # tests only (engine.watchdog.TEST_HANG_ENV)
            self._hang_if_asked(f"{role}.{method}")
        with self._peaks.phase(f"{role}.{method}"):
            return getattr(self.roles[role], method)(*args, **kwargs)

    def memory_peaks(self) -> dict[str, Any]:
        """This process's peak memory per phase since the last ask, its limit, its node
        (engine.memory_peaks)."""
        return self._peaks.take()

    def _hang_if_asked(self, phase: str) -> None:
        self._calls[phase] = self._calls.get(phase, 0) + 1
        if (phase, self._calls[phase]) == self._hang_at:
            hang_forever_for_test()

    def close(self) -> None:
        """Before the process is ended: each role releases what would outlive it, then
        the process group goes (here, not only in ``__del__``: Ray ends the process with
        SIGTERM, whose handler, landing in a slow ``__del__``, printed a traceback)."""
        self._close_roles()
        self._leave_process_group()
        self._stacks.close()

    def _close_roles(self) -> None:
        for role in self.roles.values():
            close = getattr(role, "close", None)
            if callable(close):
                close()
        self.roles = {}

    def __del__(self) -> None:
        self._leave_process_group()

    @staticmethod
    def _leave_process_group() -> None:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _rng_state(device: DeviceSpec) -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(device: DeviceSpec, state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()
