"""How a run ended, and whether starting it again may help: the exit record.

The engine's command (``engine.main``) ends with an exit code (``engine.errors``); under
the supervisor (``engine.supervisor``) it also writes, as it exits, a small JSON record
naming the reason: ``{"exit_code": 1, "reason": "worker_died", "message": "..."}``, to the
path in ``ENGINE_EXIT_RECORD``. The code alone cannot tell a dead worker (a restart
resumes and goes on) from a bug in the loop (it would fail again), nor the NaN stop from a
configuration error: the record can. Each reason says once whether it is worth a restart
(``REASONS``); a code without a record (the engine killed outright) is read by its code.

Worth a restart: a preemption (75: the engine saved and stopped on SIGTERM), a hang (76:
the watchdog ended it) and a dead worker process or Ray node (1): each is a fault of the
machines or of one moment, and the run resumes exactly from its last complete checkpoint.
Never: a configuration or usage error (2), the NaN stop (the same data and weights diverge
again), a worker that raised (its error would recur), an error of the engine itself, a
process killed by a signal the engine did not handle (the OOM killer's SIGKILL recurs).

Torch-free and Ray-free: the supervisor and rlctl (through ``engine.schema``) read it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.errors import EXIT_FAILED, EXIT_HUNG, EXIT_PREEMPTED, EXIT_USER_ERROR

EXIT_RECORD_ENV = "ENGINE_EXIT_RECORD"
MESSAGE_CHARS = 600  # of the error's message, in the record: enough for its first lines


@dataclasses.dataclass(frozen=True)
class Reason:
    name: str
    retry: bool  # worth starting the run again (from its last complete checkpoint)
    words: str  # for a person: rlctl status, the supervisor's lines


REASONS = {
    r.name: r
    for r in (
        Reason("finished", False, "finished"),
        Reason("preempted", True, "preempted: stopped on SIGTERM after saving"),
        Reason("hung", True, "hung: see the log for every worker's stacks"),
        Reason("worker_died", True, "a worker's process or its node died"),
        Reason("worker_error", False, "a worker raised an error (the log has it)"),
        Reason("config", False, "configuration or usage error: fix it and launch again"),
        Reason("nan_updates", False, "stopped: the actor's updates kept being NaN/inf"),
        Reason("error", False, "failed: an error in the engine (the log has its traceback)"),
        Reason("interrupted", False, "interrupted (SIGINT)"),
        Reason("killed", False, "killed by a signal it could not handle"),
    )
}

# A code without a record: what the code alone says (1 could be any failure).
_BY_CODE = {
    0: "finished",
    EXIT_FAILED: "error",
    EXIT_USER_ERROR: "config",
    EXIT_PREEMPTED: "preempted",
    EXIT_HUNG: "hung",
}

# The codes that more than one reason shares, for when only the code is known.
_CODE_WORDS = {
    EXIT_FAILED: "failed: a worker died or raised, or the engine failed (the log says which)",
    EXIT_USER_ERROR: "configuration or usage error, or the NaN stop (the log says which)",
}

# Ray's exceptions for a process or node that is gone (matched by name: Ray is not
# imported here); ActorDiedError and the like subclass RayActorError.
_RAY_DEATHS = ("RayActorError", "NodeDiedError", "OwnerDiedError", "ObjectLostError")


@dataclasses.dataclass(frozen=True)
class ExitRecord:
    exit_code: int
    reason: str
    message: str = ""

    @property
    def retry(self) -> bool:
        return REASONS[self.reason].retry

    @property
    def words(self) -> str:
        return REASONS[self.reason].words


def reason_words(name: str | None) -> str:
    """A reason in words; an unknown one (a newer engine's) as itself."""
    reason = REASONS.get(name or "")
    return reason.words if reason else (name or "unknown")


def signal_name(number: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(number).name
    return f"signal {number}"


def by_code(code: int) -> ExitRecord:
    """What an exit code says without a record. Negative (Python's killed-by-signal) and
    128+N (a shell's) are signals."""
    if code in _BY_CODE:
        return ExitRecord(code, _BY_CODE[code])
    number = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if number is not None:
        name = signal_name(number)
        if number == signal.SIGINT:
            return ExitRecord(code, "interrupted", name)
        hint = ": out of memory, or killed by hand" if number == signal.SIGKILL else ""
        return ExitRecord(code, "killed", f"{name}{hint}")
    return ExitRecord(code, "error", f"exit code {code}")


def exit_words(code: int | None) -> str:
    """An exit code in words: ``76`` -> "hung: see the log for every worker's stacks"."""
    if code is None:
        return "no exit code"
    if code in _CODE_WORDS:
        return _CODE_WORDS[code]
    record = by_code(code)
    if record.reason == "error":  # a code the engine does not use: a wrapper's
        return "failed"
    return f"{record.words} ({record.message})" if record.message else record.words


def classify(code: int, record: ExitRecord | None) -> ExitRecord:
    """The attempt's outcome: the engine's record when it wrote one for this code, else
    what the code says."""
    if record is not None and record.exit_code == code and record.reason in REASONS:
        return record
    return by_code(code)


def record_of(exc: BaseException) -> ExitRecord:
    """The record of a run that raised ``exc`` out of the engine's command."""
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return by_code(code)
    if isinstance(exc, KeyboardInterrupt):
        return ExitRecord(128 + signal.SIGINT, "interrupted", "KeyboardInterrupt")
    message = _message(exc)
    reason = getattr(exc, "reason", None)
    if reason in REASONS:  # the engine's own errors name theirs
        return ExitRecord(int(getattr(exc, "exit_code", EXIT_FAILED)), reason, message)
    if _ray_death(exc):
        return ExitRecord(EXIT_FAILED, "worker_died", message)
    return ExitRecord(EXIT_FAILED, "error", message)


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if not hasattr(exc, "reason"):
        text = f"{type(exc).__name__}: {text}"
    return text[:MESSAGE_CHARS]


def _ray_death(exc: BaseException) -> bool:
    """``exc`` or what caused it is Ray's word for a process or node that is gone."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(cls.__name__ in _RAY_DEATHS for cls in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


# -- the record on disk ---------------------------------------------------------------


def write_json_atomically(path: Path, data: Any) -> None:
    """``data`` as ``path``, whole or not at all: written beside it, flushed, renamed
    over it (a reader sees the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_exit_record(path: Path, record: ExitRecord) -> None:
    write_json_atomically(path, dataclasses.asdict(record))


def read_exit_record(path: Path) -> ExitRecord | None:
    """The record at ``path``; None when there is none or it is not one."""
    try:
        data = json.loads(path.read_text())
        return ExitRecord(int(data["exit_code"]), str(data["reason"]), str(data["message"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def exit_recorded() -> Iterator[None]:
    """The engine's command inside: its record written to ``ENGINE_EXIT_RECORD`` (when
    set) as it ends, however it ends."""
    path = os.environ.get(EXIT_RECORD_ENV)
    if not path:
        yield
        return
    try:
        yield
    except BaseException as exc:
        with contextlib.suppress(OSError):  # the exit's own error matters more
            write_exit_record(Path(path), record_of(exc))
        raise
    with contextlib.suppress(OSError):
        write_exit_record(Path(path), ExitRecord(0, "finished"))
