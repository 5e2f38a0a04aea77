"""Run untrusted, model-written Python in a sandbox: a separate process with no network,
its own scratch directory, rlimits on CPU, memory, processes, files and output, and a
wall clock.

    result = run_python("print(2 ** 10)", SandboxLimits(wall_seconds=5))
    result.stdout, result.exit_code, result.timed_out, result.isolation

``run_python`` never raises for what the code does (a crash, a timeout, a fork bomb are
all in the result); it raises ``SandboxError`` for bad limits, or where
``require_namespaces`` asks for more than the machine has. ``run_python_async`` is the
same for the agent loop's coroutines. Runs are independent and may run concurrently.

How the isolation is made, and what each machine gets (probed once per process, then
kept): docs/sandbox.md. This module is the parent's side (plan, start, read, clean up);
engine/agents/sandbox_init.py is what runs inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from engine.agents.sandbox_bwrap import applied as bwrap_applied
from engine.agents.sandbox_bwrap import bwrap_argv, find_bwrap
from engine.agents.sandbox_io import Capture, drain_async, drain_sync, kill_group, read_status
from engine.agents.sandbox_limits import SandboxError, SandboxLimits

log = logging.getLogger(__name__)

__all__ = [
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "isolation_mode",
    "isolation_summary",
    "run_python",
    "run_python_async",
]

_INIT_SCRIPT = str(Path(__file__).with_name("sandbox_init.py"))
# The code's interpreter: isolated (no PYTHON* variables, no user site), no site at
# all (nothing of the engine's venv: only the standard library), no bytecode files,
# unbuffered (what was printed before a kill is kept), UTF-8 whatever the locale.
_PYTHON_FLAGS = ["-I", "-S", "-B", "-u", "-X", "utf8"]
# Where the code runs when it has a mount namespace: inside the private /tmp.
_NAMESPACE_WORKDIR = "/tmp/sandbox"
# Directories a mount namespace covers with an empty, read-only tmpfs (the interpreter
# is bound back when it lives under one): other users' files, sockets in /run.
_HIDDEN = ("/home", "/root", "/run")
# Never hidden, even when $HOME is one of them: the system the interpreter needs.
_SYSTEM_DIRS = ("/", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/opt", "/var", "/tmp")
# The parent's own deadline is the wall clock plus this, for setup and teardown on a
# loaded machine; the init inside enforces the wall clock itself.
_BACKSTOP_GRACE = 10.0
# Make the file system read-only mount by mount, as on kernels before mount_setattr
# (5.12): for the tests of that path.
_READONLY_FALLBACK = False

# The isolation modes, strongest first (docs/sandbox.md).
NAMESPACES = "namespaces"  # root: net/pid/mount/ipc namespaces and a fresh uid
USERNS = "userns"  # not root: the same namespaces inside a user namespace
BWRAP = "bwrap"  # not root, user namespaces only for bwrap: the same, made by bubblewrap
UID = "uid"  # root without namespaces: a fresh uid only
NONE = "none"  # neither: rlimits and a scratch directory only
_MISSING = {
    NAMESPACES: "",
    USERNS: "runs as the engine's uid: files it may read and are not hidden stay readable",
    BWRAP: "runs as the engine's uid: files it may read and are not hidden stay readable",
    UID: (
        "NO network isolation; shared /tmp, /var/tmp, /dev/shm (what it leaves there "
        "is removed after); the host's /proc visible; the file system readable as far "
        "as its permissions allow"
    ),
    NONE: (
        "NO network isolation; NO file isolation: the code runs as the engine's uid and "
        "can read and write its files and signal its processes; process limit approximate"
    ),
}


@dataclass(frozen=True)
class SandboxResult:
    """What a run did. ``exit_code`` is None when a signal ended the code (``signal``)
    or the code never started (``error``)."""

    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    cpu_exceeded: bool
    memory_exceeded: bool
    stdout_truncated: bool
    stderr_truncated: bool
    wall_seconds: float
    cpu_seconds: float | None
    # What was applied, e.g. "network namespace, pid namespace, ..., uid 1879048523".
    isolation: str
    # The sandbox itself failed (setup, a missing interpreter): the code did not run.
    error: str | None = None

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not (self.timed_out or self.error)

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"


# ---------------------------------------------------------------- the probe

_probe_lock = threading.Lock()
_probed: tuple[str, tuple[str, ...]] | None = None  # (mode, why stronger modes failed)


def isolation_mode() -> str:
    """The strongest mode this machine allows, found once by running a trivial program
    in each (namespaces, else a fresh uid for root; a user namespace, else nothing,
    otherwise). Root never runs code as root: where the uid cannot work either, runs
    fail with the reason in ``error``."""
    global _probed
    with _probe_lock:
        if _probed is None:
            _probed = _probe()
            mode, failures = _probed
            for why in failures:
                log.info("sandbox: a stronger isolation is unavailable: %s", why)
            if mode in (UID, NONE):
                log.warning("sandbox isolation is %r; missing: %s", mode, _MISSING[mode])
            else:
                log.info("sandbox isolation: %s", mode)
        return _probed[0]


def isolation_summary() -> str:
    """The mode, what it applies and what it lacks, and why a stronger one failed."""
    mode = isolation_mode()
    result = run_python("pass", SandboxLimits(wall_seconds=20))
    lines = [f"mode: {mode}", f"applied: {result.isolation}"]
    lines += [f"unavailable: {why}" for why in (_probed[1] if _probed else ())]
    if result.error:
        lines.append(f"error: {result.error}")
    return "\n".join(lines)


def _probe(root: bool | None = None) -> tuple[str, tuple[str, ...]]:
    if os.geteuid() == 0 if root is None else root:
        candidates = [NAMESPACES, UID]
    else:
        candidates = [USERNS, BWRAP, NONE] if find_bwrap() else [USERNS, NONE]
    failures = []
    for mode in candidates[:-1]:
        result = _run_sync("pass", SandboxLimits(wall_seconds=20), "", mode)
        if result.error is None and result.exit_code == 0:
            return mode, tuple(failures)
        failures.append(f"{mode}: {result.error or result.stderr.strip()[-500:]}")
    return candidates[-1], tuple(failures)


def _mode_for(limits: SandboxLimits) -> str:
    mode = isolation_mode()
    if limits.require_namespaces and mode not in (NAMESPACES, USERNS, BWRAP):
        raise SandboxError(
            "the sandbox needs network, pid and mount namespaces (require_namespaces) and "
            "this machine allows none: run the engine as root, or allow unprivileged user "
            f"namespaces (docs/sandbox.md).\n{isolation_summary()}"
        )
    return mode


# ---------------------------------------------------------------- the calls


def run_python(code: str, limits: SandboxLimits | None = None, stdin: str = "") -> SandboxResult:
    """Run ``code`` with Python in a fresh sandbox and wait for it (at most about
    ``limits.wall_seconds``). Thread-safe."""
    limits = limits or SandboxLimits()
    return _run_sync(code, limits, stdin, _mode_for(limits))


async def run_python_async(
    code: str, limits: SandboxLimits | None = None, stdin: str = ""
) -> SandboxResult:
    """``run_python`` as a coroutine: many may run at once on one event loop. A
    cancelled call kills its sandbox."""
    limits = limits or SandboxLimits()
    if _probed is None:
        # The one-time probe runs a sandbox: not on the event loop.
        await asyncio.to_thread(isolation_mode)
    mode = _mode_for(limits)
    launch = _Launch.prepare(code, limits, stdin, mode)
    out, err = Capture(limits.output_bytes), Capture(limits.output_bytes)
    started = time.monotonic()
    proc = None
    backstop = False
    try:
        proc = await asyncio.create_subprocess_exec(
            *launch.argv,
            **launch.popen_kwargs(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        launch.started()
        assert proc.stdout is not None and proc.stderr is not None
        backstop = await drain_async(
            proc, proc.stdout, proc.stderr, out, err, launch.deadline(started)
        )
        return launch.result(out, err, proc.returncode, time.monotonic() - started, backstop)
    finally:
        if proc is not None and proc.returncode is None:
            # Cancelled: kill it, and reap it while this loop still runs.
            kill_group(proc.pid)
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(proc.wait(), timeout=5)
        launch.cleanup()


def _run_sync(code: str, limits: SandboxLimits, stdin: str, mode: str) -> SandboxResult:
    launch = _Launch.prepare(code, limits, stdin, mode)
    out, err = Capture(limits.output_bytes), Capture(limits.output_bytes)
    started = time.monotonic()
    proc = None
    try:
        proc = subprocess.Popen(
            launch.argv, **launch.popen_kwargs(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        launch.started()
        assert proc.stdout is not None and proc.stderr is not None
        backstop = drain_sync(
            proc, proc.stdout.fileno(), proc.stderr.fileno(), out, err, launch.deadline(started)
        )
        return launch.result(out, err, proc.returncode, time.monotonic() - started, backstop)
    finally:
        if proc is not None:
            if proc.poll() is None:
                # Interrupted (an exception in this thread): the supervisor leads its own
                # process group, and the init and the code die with it (PDEATHSIG).
                kill_group(proc.pid)
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        launch.cleanup()


# ---------------------------------------------------------------- one run


class _Launch:
    """One run's plan, scratch directory and status pipe; ``result`` reads them back,
    ``cleanup`` removes what the run left."""

    def __init__(self, limits: SandboxLimits, mode: str, scratch: Path, uid: int | None) -> None:
        self.limits = limits
        self.mode = mode
        self.scratch = scratch
        self.uid = uid
        self.status_r, self.status_w = os.pipe()
        self.stdin_fd = self.plan_fd = -1
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.cwd = str(scratch)

    @classmethod
    def prepare(cls, code: str, limits: SandboxLimits, stdin: str, mode: str) -> _Launch:
        uid = None
        if mode in (NAMESPACES, UID):
            first, last = limits.uid_range
            uid = first + secrets.randbelow(last - first)
        scratch = Path(tempfile.mkdtemp(prefix="rlctl-sandbox-"))
        launch = cls(limits, mode, scratch, uid)
        try:
            launch._write(code, stdin)
        except BaseException:
            launch.cleanup()
            raise
        return launch

    def _write(self, code: str, stdin: str) -> None:
        limits, uid = self.limits, self.uid
        python = os.path.realpath(limits.python or sys.executable)
        engine_python = os.path.realpath(sys.executable)
        if self.mode in (NAMESPACES, USERNS, BWRAP):
            workdir = _NAMESPACE_WORKDIR
        else:
            workdir = str(self.scratch / "work")
            os.mkdir(workdir, 0o700)
            if uid is not None:
                os.chmod(self.scratch, 0o711)  # the uid may pass through, not list
                os.chown(workdir, uid, uid)
        # What stays visible under a hidden directory: the interpreters (the engine's
        # runs the init, under bwrap inside the namespaces) and the init script itself.
        keep = {str(Path(p).parent.parent) for p in (python, engine_python)}
        keep |= {os.path.realpath(sys.base_prefix), str(Path(_INIT_SCRIPT).parent)}
        hide = _hidden_dirs()
        plan = {
            "mode": self.mode,
            "code": code,
            "workdir": workdir,
            "python": python,
            "python_args": _PYTHON_FLAGS,
            "uid": uid,
            "gid": uid,
            "cpu_seconds": limits.cpu_seconds,
            "wall_seconds": float(limits.wall_seconds),
            "memory_bytes": limits.memory_bytes,
            "max_processes": limits.max_processes,
            "file_bytes": limits.file_bytes,
            "open_files": limits.open_files,
            "scratch_bytes": limits.scratch_bytes,
            "hide": hide,
            "keep": sorted(keep),
            "readonly_fallback": _READONLY_FALLBACK,
            "applied": bwrap_applied(limits.scratch_bytes, hide) if self.mode == BWRAP else [],
        }
        self.plan_fd = self._file("plan.json", json.dumps(plan))
        # stdin from a file: the code reads it at its own pace and then sees EOF, and
        # the parent never blocks writing to a pipe the code does not read.
        self.stdin_fd = self._file("stdin", stdin)
        # The plan travels open, as fds do through bwrap: its path would be hidden there.
        init = [
            engine_python,
            "-I",
            "-S",
            "-B",
            _INIT_SCRIPT,
            str(self.plan_fd),
            str(self.status_w),
        ]
        if self.mode == BWRAP:
            bwrap = find_bwrap()
            if bwrap is None:
                raise SandboxError("bwrap is no longer on the PATH")
            init = bwrap_argv(bwrap, limits.scratch_bytes, hide, sorted(keep)) + init
        self.argv = init
        # Nothing of the engine's environment (tokens, keys, cluster addresses).
        self.env = {
            "PATH": f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
        }

    def _file(self, name: str, text: str) -> int:
        """Write a file of the scratch dir, readable by root only, and open it to pass."""
        path = self.scratch / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return os.open(path, os.O_RDONLY)

    def popen_kwargs(self) -> dict:
        return {
            "stdin": self.stdin_fd,
            "env": self.env,
            "cwd": self.cwd,
            "pass_fds": (self.plan_fd, self.status_w),
            "close_fds": True,
            "start_new_session": True,
        }

    def started(self) -> None:
        # Only the sandbox holds the write end now: EOF once it is gone.
        os.close(self.status_w)
        os.close(self.plan_fd)
        self.status_w = self.plan_fd = -1

    def deadline(self, started: float) -> float:
        return started + self.limits.wall_seconds + _BACKSTOP_GRACE

    def result(
        self, out: Capture, err: Capture, returncode: int | None, wall: float, backstop: bool
    ) -> SandboxResult:
        status = read_status(self.status_r)
        applied = status.get("isolation") or []
        missing = _MISSING[self.mode]
        isolation = (
            f"{self.mode}: " + ", ".join(applied) + (f"; missing: {missing}" if missing else "")
        )
        error = status.get("error")
        if error is None and "isolation" not in status:
            error = f"the sandbox did not start (supervisor exit {returncode})"
        elif error is None and "cpu_seconds" not in status and not backstop:
            error = f"the sandbox ended without a report (supervisor exit {returncode})"
        sig = status.get("signal")
        cpu = status.get("cpu_seconds")
        timed_out = bool(status.get("timed_out")) or backstop
        # SIGXCPU at the soft limit; SIGKILL at the hard one, a second on, when the code
        # caught SIGXCPU (the kernel's accounting is a tick coarse, hence the 0.9).
        cpu_exceeded = sig == signal.SIGXCPU or (
            sig == signal.SIGKILL
            and not timed_out
            and cpu is not None
            and cpu >= self.limits.cpu_seconds * 0.9
        )
        # RLIMIT_AS makes an allocation fail, which Python raises as MemoryError (code
        # that catches it and goes on is not over the limit).
        memory_exceeded = b"MemoryError" in bytes(err.tail[-2048:])
        return SandboxResult(
            stdout=out.text(),
            stderr=err.text(),
            exit_code=status.get("exit"),
            signal=sig,
            timed_out=timed_out,
            cpu_exceeded=cpu_exceeded,
            memory_exceeded=memory_exceeded,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            wall_seconds=round(wall, 3),
            cpu_seconds=cpu,
            isolation=isolation,
            error=error,
        )

    def cleanup(self) -> None:
        for fd in (self.status_r, self.status_w, self.stdin_fd, self.plan_fd):
            if fd >= 0:
                os.close(fd)
        self.status_r = self.status_w = self.stdin_fd = self.plan_fd = -1
        if self.mode == UID and self.uid is not None:
            _remove_uid_leftovers(self.uid)
        _remove_tree(self.scratch)


def _hidden_dirs() -> list[str]:
    hidden = list(_HIDDEN)
    home = os.environ.get("HOME")
    if home:
        home = os.path.realpath(home)
        covered = any(home == h or home.startswith(h + "/") for h in hidden)
        system = any(s == home or s.startswith(home.rstrip("/") + "/") for s in _SYSTEM_DIRS)
        if not covered and not system:
            hidden.append(home)
    return hidden


def _remove_uid_leftovers(uid: int) -> None:
    """Without namespaces, a run's uid is its own: kill any process still running as it
    and remove what it left in the world-writable directories."""
    for _ in range(10):
        pids = [pid for pid in _pids() if uid in _uids(pid)]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    for shared in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            entries = list(os.scandir(shared))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    _remove_tree(Path(entry.path))
                else:
                    os.unlink(entry.path)
            except OSError:
                pass


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _uids(pid: int) -> set[int]:
    """A live process's real, effective, saved and file-system uids, from its status
    (the owner of /proc/PID is root for a process that made itself undumpable); none
    for a zombie, which is dead already."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        if fields.get("State", "").split()[:1] == ["Z"]:
            return set()
        return {int(uid) for uid in fields.get("Uid", "").split()}
    except (OSError, ValueError):
        return set()


def _remove_tree(path: Path) -> None:
    """rmtree, after giving back the permissions the code may have taken from itself
    (chmod 000 on its own directory stops its owner, not root)."""
    if not path.exists():
        return
    if os.geteuid() != 0:
        with contextlib.suppress(OSError):
            os.chmod(path, stat.S_IRWXU)
        for parent, dirs, _ in os.walk(path):
            for name in dirs:
                child = os.path.join(parent, name)
                if not os.path.islink(child):
                    with contextlib.suppress(OSError):
                        os.chmod(child, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    # python -m engine.agents.sandbox: what isolation the sandbox gets on this machine.
    logging.basicConfig(level=logging.INFO)
    print(isolation_summary())
