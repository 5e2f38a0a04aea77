"""Checkpoints of a run: when to save, where, which one to resume from.

A run directory (``trainer.default_local_dir``, a local path or a bucket URL) holds:

    global_step_<k>/
        actor/  critic/       sharded model + optimizer, scheduler (engine/train/fsdp_checkpoint.py;
                              strategy=megatron: per-rank files + meta.json, engine/train/megatron.py)
        rng/rank_<r>.pt       each worker's random state
        trainer_state.json    the step, the data loader's position, the KL controller
        config.yaml           the resolved engine config of the run
        COMPLETE              written last: only checkpoints with it are ever resumed from

Saving is collective (every worker writes its shards). With a bucket, the files are
staged on local disk and uploaded in the background while training goes on; the
marker is written once every upload has finished, so a checkpoint whose upload was cut
off is never taken as good.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import TrainerConfig
from engine.errors import EngineError

COMPLETE = "COMPLETE"
TRAINER_STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(step: int) -> str:
    return f"global_step_{step}"


def is_remote(root: str) -> bool:
    return root.startswith(("s3://", "gs://"))


@dataclass
class TrainerState:
    """What the controller needs, besides the workers' shards, to continue exactly."""

    step: int
    loader: dict[str, Any]
    kl_ctrl: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "step": self.step,
                "loader": self.loader,
                "kl_ctrl": self.kl_ctrl,
                "extra": self.extra,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> TrainerState:
        data = json.loads(text)
        return cls(data["step"], data["loader"], data["kl_ctrl"], data.get("extra", {}))


class CheckpointManager:
    def __init__(self, cfg: TrainerConfig, staging_root: str | Path | None = None) -> None:
        self.cfg = cfg
        self.root = cfg.default_local_dir
        self.remote = is_remote(self.root)
        if self.remote:
            from engine.storage import open_store

            self.store = open_store(self.root)
            digest = hashlib.sha1(self.root.encode()).hexdigest()[:12]
            base = Path(staging_root or tempfile.gettempdir()) / "rlctl-checkpoints" / digest
            self.local_root = base
        else:
            self.store = None
            self.local_root = Path(self.root)
        self.pending: list[int] = []  # remote checkpoints whose uploads are still running
        self.last_saved_step = 0

    # -- finding ----------------------------------------------------------------

    def complete_steps(self) -> list[int]:
        """Steps of every checkpoint whose marker exists, ascending."""
        if self.store is not None:
            names = self.store.list_dirs("")
            return sorted(
                int(m.group(1))
                for name in names
                if (m := _STEP_DIR.match(name)) and self.store.exists(f"{name}/{COMPLETE}")
            )
        if not self.local_root.is_dir():
            return []
        return sorted(
            int(m.group(1))
            for p in self.local_root.iterdir()
            if (m := _STEP_DIR.match(p.name)) and (p / COMPLETE).is_file()
        )

    def resume_point(self) -> str | None:
        """The checkpoint to resume from (a path or URL), per ``trainer.resume_mode``."""
        mode = self.cfg.resume_mode
        if mode == "disable":
            return None
        if mode == "resume_path":
            path = str(self.cfg.resume_from_path)
            if not _has_marker(path):
                raise EngineError(
                    f"trainer.resume_from_path={path} is not a complete checkpoint (no {COMPLETE}"
                    " marker: it was never finished, or it is not a global_step_<k> directory)"
                )
            return path
        steps = self.complete_steps()
        if not steps:
            return None
        name = step_dir(steps[-1])
        return f"{self.root.rstrip('/')}/{name}" if self.remote else str(self.local_root / name)

    # -- saving -----------------------------------------------------------------

    def save(self, step: int, workers: Any, state: TrainerState, config_yaml: str) -> None:
        name = step_dir(step)
        local = self.local_root / name
        if local.exists():  # left by an attempt that died mid-save: never resumed from
            shutil.rmtree(local)
        local.mkdir(parents=True)
        workers.host_all("save_checkpoint", str(local))
        (local / TRAINER_STATE).write_text(state.to_json())
        (local / "config.yaml").write_text(config_yaml)
        self.last_saved_step = step
        if self.store is None:
            _write_marker(local, step)
            self._prune()
            return
        # Uploads merge into the destination: clear what an earlier, unfinished attempt
        # at this step left there, then each node uploads what its workers wrote and the
        # controller its own two files.
        if name in self.store.list_dirs(""):
            self.store.delete_dir(name)
        workers.host_all("upload_checkpoint", str(local), self.root, name)
        self.store.write_text(f"{name}/{TRAINER_STATE}", state.to_json())
        self.store.write_text(f"{name}/config.yaml", config_yaml)
        self.pending.append(step)

    def finish_uploads(self, workers: Any, block: bool) -> None:
        """Mark uploaded checkpoints complete (cheap to call every step)."""
        if not self.pending:
            return
        if sum(workers.host_all("uploads_pending", block)):
            return
        for step in self.pending:
            self.store.write_text(f"{step_dir(step)}/{COMPLETE}", _marker_text(step))
            shutil.rmtree(self.local_root / step_dir(step), ignore_errors=True)
        self.pending = []
        self._prune()

    def _prune(self) -> None:
        keep = self.cfg.max_actor_ckpt_to_keep
        if keep is None:
            return
        for step in self.complete_steps()[:-keep]:
            if self.store is not None:
                self.store.delete_dir(step_dir(step))
            else:
                shutil.rmtree(self.local_root / step_dir(step), ignore_errors=True)

    def fetch(self, path: str, workers: Any) -> str:
        """A local copy of checkpoint ``path`` on every node (a no-op for local paths)."""
        if not is_remote(path):
            return path
        name = path.rstrip("/").rsplit("/", 1)[-1]
        local = self.local_root / "resume" / name
        workers.host_all("download_checkpoint", path, str(local))
        return str(local)

    def should_save(self, step: int, total_steps: int) -> bool:
        freq = self.cfg.save_freq
        return freq > 0 and (step % freq == 0 or step == total_steps)


def _marker_text(step: int) -> str:
    return json.dumps({"step": step, "time": time.time()})


def _write_marker(local: Path, step: int) -> None:
    tmp = local / f".{COMPLETE}.tmp"
    tmp.write_text(_marker_text(step))
    tmp.rename(local / COMPLETE)  # atomic: the marker exists whole or not at all


def _has_marker(path: str) -> bool:
    if is_remote(path):
        from engine.storage import open_store

        return open_store(path).exists(COMPLETE)
    return (Path(path) / COMPLETE).is_file()


def read_trainer_state(path: str) -> TrainerState:
    if is_remote(path):
        from engine.storage import open_store

        text = open_store(path).read_text(TRAINER_STATE)
        if text is None:
            raise EngineError(f"{path} has no {TRAINER_STATE}")
        return TrainerState.from_json(text)
    return TrainerState.from_json((Path(path) / TRAINER_STATE).read_text())
