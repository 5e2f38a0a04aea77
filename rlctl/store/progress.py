"""Where a run is, at a glance: ``rlctl status JOB``'s progress lines.

Read from the files a job writes where this machine can read them: the local backend's
job directory, or a Slurm job root on a shared file system (Slurm without ``--ssh``).
The engine writes one JSON object per step to ``<run_dir>/metrics.jsonl``
(``engine/tracking.py``) and its console lines (``step k/N | score ...``, ``resumed
from PATH at step k``) to the job's log; its supervisor records every attempt (exit code,
reason, what followed) in the job's ``restarts.json`` (``engine/supervisor.py``).

Reading is cheap and never fails ``status``: only the last ``TAIL_BYTES`` of the metrics
file and ``LOG_TAIL_BYTES`` of the log are read, a torn or corrupt line is skipped, and
anything unreadable becomes a one-line note instead of an error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlctl.store.jobs import Job
from rlctl.store.memory_report import MemoryReport, memory_report

__all__ = [
    "Progress",
    "Restarts",
    "format_duration",
    "format_progress",
    "read_progress",
    "sparkline",
]

METRICS_FILE = "metrics.jsonl"  # engine/tracking.py:METRICS_FILE (the engine is not imported)
SCORE_KEY = "critic/score/mean"
STEP_TIME_KEY = "timing_s/step"
TAIL_BYTES = 64 * 1024  # of metrics.jsonl: a few hundred steps
LOG_TAIL_BYTES = 256 * 1024
RECENT_STEPS = 10  # seconds per step: the median over this many of the last steps
SPARK_WIDTH = 40  # the sparkline shows at most this many of the last steps
SHOWN_ATTEMPTS = 5  # the last attempts status lists, one line each
MESSAGE_WIDTH = 160  # of an attempt's message, on its line
BLOCKS = "▁▂▃▄▅▆▇█"
# a SkyPilot job without a bucket: its run writes progress.json beside checkpoints there
SKY_HINT = " (with a checkpoints: bucket in the recipe, status reads the run's progress there)"

# the engine's console line (engine/tracking.py:console_line) and resume line
# (engine/loop/trainer.py:resume)
_CONSOLE_STEP = re.compile(r"^step (\d+)/(\d+)(?: \||$)", re.MULTILINE)
_RESUMED = re.compile(r"^resumed from .* at step (\d+)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One start of the engine, as its supervisor recorded it."""

    number: int
    running: bool
    exit_code: int | None
    reason: str  # in words (engine.exits)
    message: str
    next: str | None  # restart, requeue, stop; None while it runs
    why: str

    def text(self) -> str:
        """What happened and what followed: ``exit 76, hung: ... (message); why``."""
        if self.running:
            return "running"
        code = "no exit code seen" if self.exit_code is None else f"exit {self.exit_code}"
        message = self.message
        if len(message) > MESSAGE_WIDTH:
            message = message[: MESSAGE_WIDTH - 1] + "…"
        detail = f" ({message})" if message else ""
        why = f"; {self.why}" if self.why and self.exit_code != 0 else ""
        return f"{code}, {self.reason}{detail}{why}"


@dataclasses.dataclass(frozen=True)
class Restarts:
    """The supervisor's record: restarts used of the limit, and the attempts."""

    used: int
    limit: int
    attempts: tuple[Attempt, ...]

    def lines(self) -> list[str]:
        if not self.attempts:
            return []
        last = self.attempts[-1]
        if self.used == 0:  # one attempt: said only when it ended and not in success
            if last.running or last.exit_code == 0:
                return []
            return [f"ended: {last.text()}"]
        shown = self.attempts[-SHOWN_ATTEMPTS:]
        head = f"restarts: {self.used} of {self.limit} (trainer.max_restarts)"
        if len(shown) < len(self.attempts):
            head += f", the last {len(shown)} attempts:"
        return [head, *(f"  {a.number}. {a.text()}" for a in shown)]

    def to_json(self) -> dict[str, Any]:
        return {
            "used": self.used,
            "max_restarts": self.limit,
            "attempts": [dataclasses.asdict(a) for a in self.attempts],
        }


@dataclasses.dataclass(frozen=True)
class Progress:
    """What the run's files say; ``note`` when they say nothing (and why)."""

    note: str | None = None  # "no metrics yet ...", "not readable from here ..."
    metrics_path: str | None = None
    step: int | None = None  # the last step recorded
    total_steps: int | None = None  # N: engine.yaml's trainer.total_training_steps, or the log
    score: float | None = None  # the last step's critic/score/mean
    step_s: float | None = None  # median timing_s/step over the last RECENT_STEPS steps
    eta_s: float | None = None  # (N - step) x step_s, while the job runs
    resumes: int | None = None  # "resumed from" lines in the log (None: no log read)
    resumes_partial: bool = False  # the log is longer than its read tail: "at least"
    last_resume_step: int | None = None
    scores: tuple[tuple[int, float], ...] = ()  # (step, score) of the last SPARK_WIDTH steps
    restarts: Restarts | None = None  # the supervisor's record; None: none readable
    memory: MemoryReport | None = None  # peaks per role against the plan; None: none logged

    @property
    def readable(self) -> bool:
        return self.step is not None

    def to_json(self) -> dict[str, Any]:
        values = [s for _, s in self.scores]
        return {
            "readable": self.readable,
            "note": self.note,
            "metrics_path": self.metrics_path,
            "step": self.step,
            "total_steps": self.total_steps,
            "score": self.score,
            "seconds_per_step": self.step_s,
            "eta_s": self.eta_s,
            "resumes": self.resumes,
            "resumes_at_least": self.resumes_partial,
            "last_resume_step": self.last_resume_step,
            "scores": [[step, score] for step, score in self.scores],
            "sparkline": sparkline(values),
            "score_min": min(values) if values else None,
            "score_max": max(values) if values else None,
            "restarts": self.restarts.to_json() if self.restarts else None,
            "memory": self.memory.to_json() if self.memory else None,
        }


def read_progress(job: Job, bucket: bool = True) -> Progress:
    """The job's progress from its files, or a ``Progress`` with only a ``note`` (and a
    managed SkyPilot job's restarts, read from its bucket unless ``bucket`` is False)."""
    root = _readable_root(job)
    if isinstance(root, Progress):
        return _from_bucket(job, root) if bucket and job.handle else root
    try:
        log = Path(job.handle.get("log") or root / "job.log")
        return _read(root, log, job.state.terminal, _plan(job))
    except Exception as exc:  # whatever a file holds, status must still print
        return Progress(note=f"could not read the run's progress: {exc}")


def _readable_root(job: Job) -> Path | Progress:
    """The job's directory on this machine, or why there is none."""
    if not job.handle:
        return Progress(note="not submitted: no run to read")
    if job.backend == "skypilot":
        hint = "" if job.handle.get("progress") else SKY_HINT
        return Progress(note=f"not readable from here: the metrics are on the cloud's nodes{hint}")
    if job.handle.get("ssh"):
        return Progress(
            note=f"not readable from here: the job root is on {job.handle['ssh']} (over ssh)"
        )
    if "root" not in job.handle:
        return Progress(note="not readable from here: the job records no directory")
    return Path(job.handle["root"])


def _plan(job: Job) -> Mapping[str, Any]:
    """The plan the job was launched with, as the store keeps it ({} when unreadable)."""
    try:
        plan = json.loads(job.plan_json)
    except (TypeError, ValueError):
        return {}
    return plan if isinstance(plan, dict) else {}


def _read(root: Path, log: Path, finished: bool, plan: Mapping[str, Any]) -> Progress:
    engine = _engine_yaml(root / "engine.yaml")
    metrics = _run_dir(root, engine) / METRICS_FILE
    log_text, log_whole = _tail(log, LOG_TAIL_BYTES) if log.is_file() else ("", True)
    resumed = [int(k) for k in _RESUMED.findall(log_text)]
    read = Progress(  # what is known before the metrics
        metrics_path=str(metrics),
        resumes=len(resumed) if log.is_file() else None,
        resumes_partial=not log_whole,
        last_resume_step=resumed[-1] if resumed else None,
        restarts=_restarts(root, finished),
    )
    records = _records(metrics) if metrics.is_file() else []
    if not records:
        return dataclasses.replace(read, note=f"no metrics yet ({metrics})")
    return _summary(read, records, _total_steps(engine, log_text), finished, plan)


def _summary(
    read: Progress,
    records: list[dict[str, Any]],
    total: int | None,
    finished: bool,
    plan: Mapping[str, Any],
) -> Progress:
    """``read`` with what the last steps' records say (oldest first, at least one)."""
    step = records[-1]["step"]
    times = [t for r in records[-RECENT_STEPS:] if (t := _number(r.get(STEP_TIME_KEY))) is not None]
    step_s = statistics.median(times) if times else None
    eta = None
    if not finished and total is not None and step_s is not None:
        eta = max(total - step, 0) * step_s
    scored = [(r["step"], _number(r.get(SCORE_KEY))) for r in records]
    scores = tuple((k, v) for k, v in scored if v is not None)[-SPARK_WIDTH:]
    from engine.schema import NEAR_LIMIT

    return dataclasses.replace(
        read,
        step=step,
        total_steps=total,
        score=_number(records[-1].get(SCORE_KEY)),
        step_s=step_s,
        eta_s=eta,
        scores=scores,
        memory=memory_report(records, plan, NEAR_LIMIT),
    )


def _from_bucket(job: Job, unread: Progress) -> Progress:
    """A SkyPilot job's progress from the files its run keeps beside the checkpoints in
    their bucket (engine.progress_file; the supervisor's record when the bucket is
    mounted); ``unread`` (why the run's folder is out of reach) when there are none."""
    assert job.handle is not None
    finished = job.state.terminal
    read, problems = unread, []
    if url := job.handle.get("restarts"):
        restarts, problem = _bucket_restarts(url, finished)
        read = dataclasses.replace(read, restarts=restarts)
        problems += [problem] if problem else []
    if url := job.handle.get("progress"):
        records, total, problem = _bucket_records(url)
        problems += [problem] if problem else []
        if records:
            read = _summary(read, records, total, finished, _plan(job))
            read = dataclasses.replace(read, note=None, metrics_path=url)
        elif problem is None:
            read = dataclasses.replace(read, note=f"no metrics yet ({url})")
    if problems:
        read = dataclasses.replace(read, note="; ".join(filter(None, [read.note, *problems])))
    return read


def _bucket_records(url: str) -> tuple[list[dict[str, Any]], int | None, str | None]:
    """The steps in a run's ``progress.json`` (engine.progress_file), its total steps,
    and why it could not be read (None: it was, or there is none yet)."""
    from engine.schema import open_store

    folder, _, name = url.rpartition("/")
    try:
        text = open_store(folder).read_text(name)
        data = json.loads(text) if text else {}
    except Exception as exc:  # credentials, the network: status must still print
        return [], None, f"the progress not read from {url}: {exc}"
    steps = data.get("steps") if isinstance(data, dict) else None
    records = [r for r in steps or [] if isinstance(r, dict) and _is_step(r.get("step"))]
    total = data.get("total_steps") if isinstance(data, dict) else None
    return records, total if _is_step(total) and total > 0 else None, None


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _restarts(root: Path, finished: bool) -> Restarts | None:
    """The supervisor's ``restarts.json`` in the job's directory (written whole, so
    never torn), in words; None without one."""
    from engine.schema import RESTARTS_FILE, read_restarts

    record = read_restarts(root / RESTARTS_FILE)
    return None if record is None else _in_words(record, finished)


def _bucket_restarts(url: str, finished: bool) -> tuple[Restarts | None, str | None]:
    """A SkyPilot managed job's record, read from its bucket (``url``: the file's), or
    why it could not be read."""
    from engine.schema import Restarts as Record
    from engine.schema import open_store

    folder, _, name = url.rpartition("/")
    try:
        text = open_store(folder).read_text(name)
        record = Record.from_json(json.loads(text)) if text else None
    except Exception as exc:  # credentials, the network: status must still print
        return None, f"the restarts not read from {url}: {exc}"
    return (None if record is None else _in_words(record, finished)), None


def _in_words(record: Any, finished: bool) -> Restarts:
    """The engine's record in words. An attempt still open in a job that is over ended
    unrecorded (its supervisor was killed: ``rlctl stop`` past its grace)."""
    from engine.schema import reason_words

    attempts = tuple(
        Attempt(
            number=a.number,
            running=a.running and not finished,
            exit_code=a.exit_code,
            reason=reason_words(a.reason) if a.reason else "its end was not recorded",
            message=a.message,
            next=a.next,
            why=a.why,
        )
        for a in record.attempts
    )
    return Restarts(record.used, record.max_restarts, attempts)


def _tail(path: Path, max_bytes: int) -> tuple[str, bool]:
    """The whole lines in the last ``max_bytes`` of ``path``, and whether that is all of it."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        start = max(0, size - max_bytes)
        f.seek(start)
        data = f.read(max_bytes)
    if start > 0:  # began mid-line: drop the piece
        data = data.partition(b"\n")[2]
    return data.decode("utf-8", errors="replace"), start == 0


def _records(path: Path) -> list[dict[str, Any]]:
    """The metrics file's last records, in order; torn or corrupt lines skipped."""
    text, _ = _tail(path, TAIL_BYTES)
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            records.append(record)
    return records


def _engine_yaml(path: Path) -> Mapping[str, Any]:
    """The job's engine config as rlctl wrote it ({} when missing or unreadable)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _trainer(engine: Mapping[str, Any]) -> Mapping[str, Any]:
    trainer = engine.get("trainer")
    return trainer if isinstance(trainer, dict) else {}


def _run_dir(root: Path, engine: Mapping[str, Any]) -> Path:
    """Where the engine writes metrics, as engine/runtime.py:run_dir decides, seen from
    the job's directory (the job runs there: local cwd, Slurm --chdir)."""
    trainer = _trainer(engine)
    if isinstance(trainer.get("run_dir"), str) and trainer["run_dir"]:
        return root / trainer["run_dir"]  # rlctl sets it when checkpoints are apart
    local_dir = trainer.get("default_local_dir")
    if not isinstance(local_dir, str) or not local_dir:
        return root / "run"  # rlctl/job/spec.py:JobPaths.run_dir, the default
    if "://" in local_dir:  # a bucket holds only checkpoints
        return (
            root / "runs" / str(trainer.get("project_name")) / str(trainer.get("experiment_name"))
        )
    return root / local_dir  # an absolute path stays itself


def _total_steps(engine: Mapping[str, Any], log_text: str) -> int | None:
    """N: the config's trainer.total_training_steps when set, else the engine's last
    ``step k/N`` console line (N then comes from the data and the epochs)."""
    pinned = _trainer(engine).get("total_training_steps")
    if isinstance(pinned, int) and not isinstance(pinned, bool) and pinned > 0:
        return pinned
    lines = _CONSOLE_STEP.findall(log_text)
    return int(lines[-1][1]) if lines else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# -- formatting ------------------------------------------------------------------------


def sparkline(values: list[float]) -> str:
    """One block character per value, ``▁`` at the minimum to ``█`` at the maximum."""
    if not values:
        return ""
    low, high = min(values), max(values)
    if high == low:
        return BLOCKS[len(BLOCKS) // 2 - 1] * len(values)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((v - low) / (high - low) * top)] for v in values)


def format_duration(seconds: float) -> str:
    """``45s``, ``3m07s``, ``2h05m``, ``1d03h``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_progress(p: Progress) -> list[str]:
    """The lines ``rlctl status JOB`` prints under the job's row."""
    restarts = p.restarts.lines() if p.restarts else []
    if not p.readable:
        return [f"progress: {p.note}", *restarts]
    parts = [f"step {p.step}/{p.total_steps}" if p.total_steps else f"step {p.step}"]
    if p.score is not None:
        parts.append(f"score {p.score:.4g}")
    if p.step_s is not None:
        parts.append(f"{p.step_s:.3g} s/step")
    if p.eta_s is not None:
        parts.append(f"{format_duration(p.eta_s)} left")
    if p.resumes:
        at_least = "≥" if p.resumes_partial else ""
        parts.append(f"resumed {at_least}{p.resumes}x (last at step {p.last_resume_step})")
    lines = ["progress: " + " · ".join(parts)]
    if p.scores:
        values = [s for _, s in p.scores]
        first, last = p.scores[0][0], p.scores[-1][0]
        lines.append(
            f"score:    {sparkline(values)}  min {min(values):.4g} max {max(values):.4g}"
            f" (steps {first}-{last})"
        )
    return lines + (p.memory.lines() if p.memory else []) + restarts
