"""The run's progress beside its checkpoints, for ``rlctl status`` when the run's own
folder is out of its reach (a SkyPilot job's head node, gone with its cluster).

When the checkpoints live apart from the run folder (a bucket URL, or a mounted bucket
with ``trainer.run_dir`` on the node's disk), the tracker also writes ``progress.json``
there after every step: the run's total steps and the last ``KEPT`` steps' headline
metrics (score, seconds per step, memory peaks). It is small and written whole each time
(one object PUT; a mounted bucket cannot append to a file). A resumed run keeps the
steps up to its checkpoint, so the score curve outlives a cluster. A write that fails is
said once on stderr and never stops training: the file is a view, not a record.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.config import TrainerConfig

__all__ = ["KEPT", "PROGRESS_FILE", "ProgressMirror", "kept_keys", "mirror_folder"]

PROGRESS_FILE = "progress.json"
KEPT = 40  # steps: rlctl's sparkline shows as many (rlctl/store/progress.py:SPARK_WIDTH)
KEYS = ("critic/score/mean", "timing_s/step")
KEY_PREFIXES = ("memory/",)  # engine/memory_peaks.py: peaks per phase, the device's limit


def mirror_folder(cfg: TrainerConfig) -> str | None:
    """Where ``progress.json`` goes: the checkpoints' folder when it is not the run's
    own (a bucket URL, or ``run_dir`` set apart from it); None otherwise."""
    from engine.storage import is_remote

    checkpoints = cfg.default_local_dir
    if is_remote(checkpoints):
        return checkpoints
    if cfg.run_dir and Path(cfg.run_dir).resolve() != Path(checkpoints).resolve():
        return checkpoints
    return None


def kept_keys(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """The headline metrics of one step: numbers, None where not finite."""
    out: dict[str, float | None] = {}
    for key, value in metrics.items():
        if key in KEYS or key.startswith(KEY_PREFIXES):
            if hasattr(value, "item"):  # a 0-d tensor or a numpy scalar
                value = value.item()
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = float(value) if math.isfinite(value) else None
    return out


class ProgressMirror:
    """The tracker's logger that writes ``progress.json`` into ``folder``'s store."""

    def __init__(self, folder: str, total_steps: int, resumed_from_step: int) -> None:
        from engine.storage import open_store

        self.store = open_store(folder)
        self.total_steps = total_steps
        self.records: list[dict[str, Any]] = []
        self._warned = False
        if resumed_from_step > 0:  # the steps up to the checkpoint, from the last run
            self.records = [
                r
                for r in self._previous()
                if isinstance(r.get("step"), int) and r["step"] <= resumed_from_step
            ][-KEPT:]

    def _previous(self) -> list[dict[str, Any]]:
        try:
            text = self.store.read_text(PROGRESS_FILE)
            records = json.loads(text)["steps"] if text else []
        except Exception:  # unreadable or not ours: start the view anew
            return []
        return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.records = [*self.records, {"step": step, **kept_keys(metrics)}][-KEPT:]
        text = json.dumps({"total_steps": self.total_steps, "steps": self.records})
        try:
            self.store.write_text(PROGRESS_FILE, text)
        except Exception as exc:  # the network, credentials: training goes on
            if not self._warned:
                self._warned = True
                print(
                    f"warning: {PROGRESS_FILE} not written to {self.store.url()}: {exc}"
                    " (rlctl status cannot show this run's progress; training goes on)",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self, failed: bool = False) -> None:
        pass
