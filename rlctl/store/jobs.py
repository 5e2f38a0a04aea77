"""The job store: every job rlctl launched, in an embedded SQLite database.

The database is ``<RLCTL_HOME>/jobs.db`` in WAL mode, so several rlctl processes
(``rlctl launch`` while ``rlctl status`` refreshes, two launches at once) read and write
it at the same time. Every write is one short ``BEGIN IMMEDIATE`` transaction (the write
lock is taken up front, so a read-then-write such as a state transition cannot interleave
with another writer), and a writer that finds the lock held waits up to ``BUSY_TIMEOUT_S``
instead of failing. Each call opens and closes its own connection: a ``JobStore`` can be
shared by threads and pickled to subprocesses, and no connection ever crosses either.

Submission protocol ("a crash between submit and record leaves no orphan the user
cannot see"):

1. the launcher records the job first: ``create(...)`` → state ``PENDING``, no handle;
2. it submits to the backend;
3. it stores what the backend returned: ``set_handle(job_id, handle)``, then moves the
   job on with ``transition(...)``.

A crash in step 2 leaves a ``PENDING`` job without a handle, which ``rlctl list`` shows.
``stale_pending(older_than_s)`` finds these, so ``rlctl status`` can mark them
``FAILED`` with ``SUBMISSION_INCOMPLETE`` (pick ``older_than_s`` longer than the longest
submission: a SkyPilot launch blocks while it provisions). ``set_handle`` always records
the handle, even on a job that was stopped or marked stale meanwhile: the handle is what
``rlctl stop`` needs to reach a job that does exist, and the returned job's state tells the
launcher it should cancel what it just submitted.

Transitions (``transition(job_id, state)``), ranked PENDING < PROVISIONING < RUNNING <
terminal:

    from \\ to     PENDING  PROVISIONING  RUNNING  SUCCEEDED  FAILED  CANCELLED
    PENDING        same     yes           yes      yes        yes     yes
    PROVISIONING   -        same          yes      yes        yes     yes
    RUNNING        -        -             same     yes        yes     yes
    SUCCEEDED      -        -             -        -          -       -
    FAILED         -        -             -        -          -       -
    CANCELLED      -        -             -        -          -       -

- ``yes``: applied. Entering RUNNING sets ``started_at`` (once); entering a terminal state
  sets ``ended_at``. ``reason`` is replaced by the one given; ``exit_code`` is set when given.
- ``same`` (a non-terminal state to itself): updates ``reason`` when a different one is
  given (Slurm's "queued: Resources", SkyPilot's "recovering"), otherwise a no-op.
- ``-``: ignored, the job is returned unchanged. A terminal state is final (the first
  writer wins, its reason and exit code are kept), and a job never moves backwards: status
  refreshes that race each other or a ``rlctl stop`` cannot resurrect or regress a job.
  Callers see that a move was ignored by comparing the returned job's state.

The store never holds secrets. Callers pass secret *names* only (the launcher renders
``$HF_TOKEN``, never its value); the store writes exactly what it is given.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError
from rlctl.home import rlctl_home

__all__ = [
    "SCHEMA_VERSION",
    "SUBMISSION_INCOMPLETE",
    "TRANSITIONS",
    "Job",
    "JobState",
    "JobStore",
    "can_transition",
]

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 10.0
SUBMISSION_INCOMPLETE = "submission did not complete"

_ID_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
_ID_SUFFIX_LEN = 6
_ID_NAME_MAX = 40
_ID_ATTEMPTS = 20
_MAX_CANDIDATES = 10


class JobState(str, Enum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
_RANK = {
    JobState.PENDING: 0,
    JobState.PROVISIONING: 1,
    JobState.RUNNING: 2,
    JobState.SUCCEEDED: 3,
    JobState.FAILED: 3,
    JobState.CANCELLED: 3,
}

# The legal moves to a *different* state (the module docstring has the table).
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    src: frozenset(dst for dst in JobState if not src.terminal and _RANK[dst] > _RANK[src])
    for src in JobState
}


def can_transition(src: JobState, dst: JobState) -> bool:
    """Whether ``src -> dst`` changes the job's state (self-moves only update a reason)."""
    return dst in TRANSITIONS[JobState(src)]


@dataclass(frozen=True)
class Job:
    id: str  # "<recipe-name>-<6 base36 chars>", e.g. "quickstart-k3x9a2"
    name: str  # the recipe name
    recipe_path: str
    recipe_yaml: str  # the resolved recipe as launched (secret names only, never values)
    plan_json: str  # the plan, as JSON
    backend: str  # local | slurm | skypilot
    handle: dict[str, Any]  # the backend's handle; {} until the submission is recorded
    state: JobState
    reason: str | None  # why it is in this state
    exit_code: int | None
    log_path: str | None
    created_at: float
    updated_at: float
    started_at: float | None
    ended_at: float | None


# Migration i takes the schema from version i to i + 1. Append, never edit.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE jobs (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            name TEXT NOT NULL,
            recipe_path TEXT NOT NULL,
            recipe_yaml TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            backend TEXT NOT NULL,
            handle TEXT,
            state TEXT NOT NULL CHECK (state IN
                ('PENDING', 'PROVISIONING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
            reason TEXT,
            exit_code INTEGER,
            log_path TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            started_at REAL,
            ended_at REAL
        )
        """,
        "CREATE INDEX jobs_state ON jobs (state)",
        "CREATE INDEX jobs_created ON jobs (created_at)",
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)

_COLUMNS = (
    "id, name, recipe_path, recipe_yaml, plan_json, backend, handle, state, reason, "
    "exit_code, log_path, created_at, updated_at, started_at, ended_at"
)
_NEWEST_FIRST = "ORDER BY created_at DESC, seq DESC"


class JobStore:
    """The jobs rlctl launched. Safe to use from several processes and threads at once."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else rlctl_home() / "jobs.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._open_schema()

    def __repr__(self) -> str:
        return f"JobStore({str(self.path)!r})"

    # -- writes -------------------------------------------------------------------------

    def new_id(self, name: str) -> str:
        """A job id for a recipe called ``name`` that no job has yet: drawn before the job
        is made (its paths hold it), recorded with ``create(job_id=...)``."""
        prefix = _id_prefix(name)
        with self._read() as db:
            for _ in range(_ID_ATTEMPTS):
                job_id = f"{prefix}-{_random_suffix()}"
                if db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                    return job_id
        raise RuntimeError(f"could not draw a free job id after {_ID_ATTEMPTS} attempts")

    def create(
        self,
        *,
        name: str,
        recipe_path: str,
        recipe_yaml: str,
        plan_json: str,
        backend: str,
        log_path: str | None = None,
        job_id: str | None = None,
    ) -> Job:
        """Record a new job in state PENDING, before it is submitted: under ``job_id``
        (from ``new_id``), or a new id drawn here."""
        for _ in range(_ID_ATTEMPTS):
            given = job_id or f"{_id_prefix(name)}-{_random_suffix()}"
            try:
                return self._insert(
                    given, name, recipe_path, recipe_yaml, plan_json, backend, log_path
                )
            except sqlite3.IntegrityError as err:
                if "jobs.id" not in str(err):
                    raise
                if job_id is not None:  # another launch drew it meanwhile
                    raise RlctlError(
                        f"job id {job_id} was taken while this job was prepared",
                        hint="launch again: nothing was recorded or submitted",
                    ) from None
                log.debug("job id %s taken, drawing another", given)
        raise RuntimeError(f"could not draw a free job id after {_ID_ATTEMPTS} attempts")

    def _insert(
        self,
        job_id: str,
        name: str,
        recipe_path: str,
        recipe_yaml: str,
        plan_json: str,
        backend: str,
        log_path: str | None,
    ) -> Job:
        now = time.time()
        with self._write() as db:
            db.execute(
                "INSERT INTO jobs (id, name, recipe_path, recipe_yaml, plan_json, "
                "backend, handle, state, log_path, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
                (
                    job_id,
                    name,
                    str(recipe_path),
                    recipe_yaml,
                    plan_json,
                    backend,
                    JobState.PENDING.value,
                    None if log_path is None else str(log_path),
                    now,
                    now,
                ),
            )
            return _fetch(db, job_id)

    def set_handle(self, job_id: str, handle: dict[str, Any]) -> Job:
        """Record the backend's handle (in any state: see the module docstring)."""
        text = json.dumps(handle, sort_keys=True)
        with self._write() as db:
            _fetch(db, job_id)
            db.execute(
                "UPDATE jobs SET handle = ?, updated_at = ? WHERE id = ?",
                (text, time.time(), job_id),
            )
            return _fetch(db, job_id)

    def transition(
        self,
        job_id: str,
        state: JobState | str,
        reason: str | None = None,
        exit_code: int | None = None,
    ) -> Job:
        """Move a job to ``state`` if the table allows it; otherwise return it unchanged."""
        state = JobState(state)
        with self._write() as db:
            job = _fetch(db, job_id)
            now = time.time()
            if job.state == state and not state.terminal:
                if reason is None or reason == job.reason:
                    return job
                db.execute(
                    "UPDATE jobs SET reason = ?, updated_at = ? WHERE id = ?",
                    (reason, now, job_id),
                )
                return _fetch(db, job_id)
            if not can_transition(job.state, state):
                log.debug("job %s: ignoring %s -> %s", job_id, job.state, state)
                return job
            started_at = job.started_at
            if state == JobState.RUNNING and started_at is None:
                started_at = now
            ended_at = now if state.terminal else None
            db.execute(
                "UPDATE jobs SET state = ?, reason = ?, exit_code = COALESCE(?, exit_code), "
                "started_at = ?, ended_at = ?, updated_at = ? WHERE id = ?",
                (state.value, reason, exit_code, started_at, ended_at, now, job_id),
            )
            return _fetch(db, job_id)

    def delete(self, job_id: str) -> None:
        """Forget a job (its directory under RLCTL_HOME is the caller's to remove)."""
        with self._write() as db:
            _fetch(db, job_id)
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    # -- reads --------------------------------------------------------------------------

    def get(self, ref: str) -> Job:
        """The job with id ``ref``, or the only job whose id starts with ``ref``."""
        with self._read() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (ref,)).fetchone()
            if row is not None:
                return _to_job(row)
            rows = (
                db.execute(
                    f"SELECT {_COLUMNS} FROM jobs WHERE substr(id, 1, ?) = ? {_NEWEST_FIRST} "
                    "LIMIT ?",
                    (len(ref), ref, _MAX_CANDIDATES + 1),
                ).fetchall()
                if ref
                else []
            )
            total = (
                len(rows)
                if len(rows) <= _MAX_CANDIDATES
                else db.execute(
                    "SELECT count(*) FROM jobs WHERE substr(id, 1, ?) = ?", (len(ref), ref)
                ).fetchone()[0]
            )
        if len(rows) == 1:
            return _to_job(rows[0])
        if not rows:
            raise RlctlError(f"no job matches {ref!r}", hint="`rlctl list` shows your jobs")
        shown = [_to_job(r) for r in rows[:_MAX_CANDIDATES]]
        lines = [f"  {j.id}  {j.state.value}" for j in shown]
        if total > len(shown):
            lines.append(f"  ... and {total - len(shown)} more")
        raise RlctlError(
            f"{ref!r} matches {total} jobs:\n" + "\n".join(lines),
            hint="give more of the job id; `rlctl list` shows them all",
        )

    def list(
        self,
        *,
        states: Iterable[JobState | str] | None = None,
        backend: str | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs, newest first, optionally only in ``states`` / on ``backend``."""
        where: list[str] = []
        params: list[Any] = []
        if states is not None:
            values = sorted({JobState(s).value for s in states})
            if not values:
                return []
            where.append(f"state IN ({', '.join('?' * len(values))})")
            params.extend(values)
        if backend is not None:
            where.append("backend = ?")
            params.append(backend)
        sql = f"SELECT {_COLUMNS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" {_NEWEST_FIRST}"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        with self._read() as db:
            return [_to_job(r) for r in db.execute(sql, params).fetchall()]

    def stale_pending(self, older_than_s: float) -> list[Job]:
        """PENDING jobs with no handle, untouched for ``older_than_s``: a crashed submission."""
        cutoff = time.time() - older_than_s
        with self._read() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM jobs WHERE state = ? "
                "AND (handle IS NULL OR handle = '{}') AND updated_at <= ? " + _NEWEST_FIRST,
                (JobState.PENDING.value, cutoff),
            ).fetchall()
        return [_to_job(r) for r in rows]

    # -- connections --------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; writes say BEGIN IMMEDIATE.
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        db.execute("PRAGMA synchronous = NORMAL")
        return db

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        db = self._connect()
        try:
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    def _open_schema(self) -> None:
        db = self._connect()
        try:
            _enable_wal(db, self.path)
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                row = db.execute("SELECT max(version) FROM schema_version").fetchone()
                version = row[0] or 0
                if version > SCHEMA_VERSION:
                    raise RlctlError(
                        f"{self.path} was written by a newer rlctl "
                        f"(schema {version}, this rlctl knows {SCHEMA_VERSION})",
                        hint="upgrade rlctl: pip install -U rlctl",
                    )
                for step in range(version, SCHEMA_VERSION):
                    for statement in _MIGRATIONS[step]:
                        db.execute(statement)
                    db.execute("INSERT INTO schema_version (version) VALUES (?)", (step + 1,))
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()


def _enable_wal(db: sqlite3.Connection, path: Path) -> None:
    # WAL is a property of the file, set once by whoever opens it first. Switching takes
    # an exclusive lock that the busy handler does not always wait for, so retry briefly.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            mode = db.execute("PRAGMA journal_mode").fetchone()[0]
            if mode.lower() == "wal":
                return
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() == "wal":
                return
            raise RlctlError(
                f"could not switch {path} to WAL mode (got {mode!r})",
                hint="keep RLCTL_HOME on a local file system (not NFS)",
            )
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _fetch(db: sqlite3.Connection, job_id: str) -> Job:
    row = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise RlctlError(f"no job {job_id!r}", hint="`rlctl list` shows your jobs")
    return _to_job(row)


def _to_job(row: tuple[Any, ...]) -> Job:
    (
        job_id,
        name,
        recipe_path,
        recipe_yaml,
        plan_json,
        backend,
        handle,
        state,
        reason,
        exit_code,
        log_path,
        created_at,
        updated_at,
        started_at,
        ended_at,
    ) = row
    return Job(
        id=job_id,
        name=name,
        recipe_path=recipe_path,
        recipe_yaml=recipe_yaml,
        plan_json=plan_json,
        backend=backend,
        handle=json.loads(handle) if handle else {},
        state=JobState(state),
        reason=reason,
        exit_code=exit_code,
        log_path=log_path,
        created_at=created_at,
        updated_at=updated_at,
        started_at=started_at,
        ended_at=ended_at,
    )


def _id_prefix(name: str) -> str:
    """The readable part of a job id: the recipe name, lower-case, [a-z0-9-] only."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    slug = slug[:_ID_NAME_MAX].rstrip("-")
    return slug or "job"


def _random_suffix() -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_SUFFIX_LEN))
