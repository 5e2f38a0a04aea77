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
engine/sandbox/inside.py is what runs inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from engine.sandbox import view as sandbox_view
from engine.sandbox.bwrap import applied as bwrap_applied
from engine.sandbox.bwrap import bwrap_argv, find_bwrap
from engine.sandbox.bwrap import missing as bwrap_missing
from engine.sandbox.cgroup import RunCgroup
from engine.sandbox.cgroup import hierarchy as cgroup_hierarchy
from engine.sandbox.leftovers import remove_tree, remove_uid_leftovers
from engine.sandbox.limits import SandboxError, SandboxLimits
from engine.sandbox.streams import Capture, drain_async, drain_sync, kill_group, read_status

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

_INIT_SCRIPT = str(Path(__file__).with_name("inside.py"))
# The code's interpreter: isolated (no PYTHON* variables, no user site), no site at
# all (nothing of the engine's venv: only the standard library), no bytecode files,
# unbuffered (what was printed before a kill is kept), UTF-8 whatever the locale.
_PYTHON_FLAGS = ["-I", "-S", "-B", "-u", "-X", "utf8"]
# Where the code runs when it has a mount namespace: inside the private /tmp.
_NAMESPACE_WORKDIR = "/tmp/sandbox"
# What a cgroup grants each of the sandbox's own processes (the supervisor and the
# init, Python with a few modules: about 10 MiB each), beside the code's memory.
_WATCHER_BYTES = 24 << 20
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
    USERNS: "runs as the engine's uid (in user namespaces of its own)",
    BWRAP: "runs as the engine's uid (in a user namespace of its own)",
    UID: (
        "NO network isolation; NO IPC namespace (SysV objects it leaves are removed"
        " after); shared /tmp, /var/tmp, /dev/shm and world-writable directories (what"
        " it leaves there is removed after); the host's /dev (its ptys) and /proc; the"
        " file system readable (and lockable) as far as its permissions allow; its keys"
        " invalidated after, not held apart"
    ),
    NONE: (
        "NO network isolation; NO file isolation: the code runs as the engine's uid and"
        " can read and write its files and signal (or, where kernel.yama.ptrace_scope is"
        " 0, trace) its processes; NO IPC namespace; the host's /dev and /proc; process"
        " limit approximate"
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
    """One run's plan, scratch directory, cgroup and status socket; ``result`` reads
    them back, ``cleanup`` removes what the run left."""

    def __init__(self, limits: SandboxLimits, mode: str, scratch: Path, uid: int | None) -> None:
        self.limits = limits
        self.mode = mode
        self.scratch = scratch
        self.uid = uid
        # A socket, not a pipe: no process can open it again through /proc/PID/fd.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.status_r, self.status_w = ours.detach(), theirs.detach()
        self.stdin_fd = self.plan_fd = self.script_fd = -1
        self.cgroup: RunCgroup | None = None
        self.no_cgroup = ""  # why there is none
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.cwd = str(scratch)
        self.python = ""

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
        limits, uid, mode = self.limits, self.uid, self.mode
        python = os.path.realpath(limits.python or sys.executable)
        engine_python = os.path.realpath(sys.executable)
        self.python = python
        namespaced = mode in (NAMESPACES, USERNS, BWRAP)
        if namespaced:
            workdir = _NAMESPACE_WORKDIR
        else:
            workdir = str(self.scratch / "work")
            os.mkdir(workdir, 0o700)
            if uid is not None:
                os.chmod(self.scratch, 0o711)  # the uid may pass through, not list
                os.chown(workdir, uid, uid)
        view: dict = {"binds": [], "links": []}
        view_note = ""
        if namespaced:
            # What the code sees of the file system (the engine's interpreter runs the
            # init inside under bwrap).
            pythons = [python, engine_python] if mode == BWRAP else [python]
            shown_uid = uid if uid is not None else os.getuid()
            shown_gid = uid if uid is not None else os.getgid()
            view = sandbox_view.build(pythons, self.scratch / "etc", shown_uid, shown_gid, workdir)
            view_note = sandbox_view.describe(view)
            os.mkdir(self.scratch / "root", 0o700)
        self._make_cgroup()
        plan = {
            "mode": mode,
            "code": code,
            "workdir": workdir,
            "python": python,
            "python_args": _PYTHON_FLAGS,
            "uid": uid,
            "gid": uid,
            "host_uid": os.getuid(),
            "host_gid": os.getgid(),
            "cpu_seconds": limits.cpu_seconds,
            "wall_seconds": float(limits.wall_seconds),
            "memory_bytes": limits.memory_bytes,
            # RLIMIT_AS only where no cgroup bounds the run's memory as a whole.
            "address_space": None if self.cgroup else limits.memory_bytes,
            "max_processes": limits.max_processes,
            "file_bytes": limits.file_bytes,
            "open_files": limits.open_files,
            "scratch_bytes": limits.scratch_bytes,
            "scratch_files": limits.scratch_files,
            "cgroup_fds": self.cgroup.fds() if self.cgroup else [],
            "view": view,
            "view_root": str(self.scratch / "root"),
            "view_note": view_note,
            "readonly_fallback": _READONLY_FALLBACK,
            "applied": [],
        }
        bwrap = find_bwrap() if mode == BWRAP else None
        if mode == BWRAP:
            if bwrap is None:
                raise SandboxError("bwrap is no longer on the PATH")
            plan["applied"] = bwrap_applied(bwrap, limits.scratch_bytes, view_note)
        self.plan_fd = self._file("plan.json", json.dumps(plan))
        # stdin from a file: the code reads it at its own pace and then sees EOF, and
        # the parent never blocks writing to a pipe the code does not read.
        self.stdin_fd = self._file("stdin", stdin)
        # The init's script, the plan and the status travel open, as fds do through
        # bwrap: none of their paths is visible inside.
        self.script_fd = os.open(_INIT_SCRIPT, os.O_RDONLY)
        init = [engine_python, "-I", "-S", "-B", f"/proc/self/fd/{self.script_fd}"]
        init += [str(self.plan_fd), str(self.status_w)]
        if bwrap is not None:
            init = bwrap_argv(bwrap, limits.scratch_bytes, view) + init
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

    def _make_cgroup(self) -> None:
        """The run's cgroup, where this machine lets one be made (engine/sandbox/cgroup.py):
        all its memory (the code's, its scratch files', the watchers') and its tasks."""
        found, why = cgroup_hierarchy()
        if found is None:
            self.no_cgroup = why
            return
        limits = self.limits
        watchers = 1 if self.mode == BWRAP else 2  # the supervisor and the init
        memory = limits.memory_bytes + limits.scratch_bytes + watchers * _WATCHER_BYTES
        try:
            self.cgroup = RunCgroup(found, memory, limits.max_processes + watchers)
        except OSError as exc:
            self.no_cgroup = f"cannot make the run's cgroup ({exc})"

    def _file(self, name: str, text: str) -> int:
        """Write a file of the scratch dir, readable by root only, open it to pass, and
        remove it (only the open file remains, which the code never gets)."""
        path = self.scratch / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        opened = os.open(path, os.O_RDONLY)
        path.unlink()
        return opened

    def popen_kwargs(self) -> dict:
        fds = [self.plan_fd, self.status_w, self.script_fd]
        fds += self.cgroup.fds() if self.cgroup else []
        return {
            "stdin": self.stdin_fd,
            "env": self.env,
            "cwd": self.cwd,
            "pass_fds": tuple(fds),
            "close_fds": True,
            "start_new_session": True,
        }

    def started(self) -> None:
        # Only the sandbox holds the other end now: EOF once it is gone.
        for fd in (self.status_w, self.plan_fd, self.script_fd):
            os.close(fd)
        self.status_w = self.plan_fd = self.script_fd = -1
        if self.cgroup:
            self.cgroup.close_fds()

    def deadline(self, started: float) -> float:
        return started + self.limits.wall_seconds + _BACKSTOP_GRACE

    def isolation(self, applied: list[str]) -> str:
        """What the run got, and what its mode and this machine leave out."""
        applied = list(applied)
        missing = [_MISSING[self.mode]] if _MISSING[self.mode] else []
        if self.mode == BWRAP:
            bwrap = find_bwrap()
            missing += bwrap_missing(bwrap) if bwrap else []
        if self.cgroup is not None:
            applied.append(self.cgroup.describe())
        else:
            missing.append(
                "NO cgroup: memory bounded per process (RLIMIT_AS), not for the run"
                " (memfd files, pipe buffers and kernel memory of all its processes"
                f" together are not bounded): {self.no_cgroup}"
            )
        text = f"{self.mode}: " + ", ".join(applied)
        return text + ("; missing: " + "; ".join(missing) if missing else "")

    def result(
        self, out: Capture, err: Capture, returncode: int | None, wall: float, backstop: bool
    ) -> SandboxResult:
        status = read_status(self.status_r)
        # The kernel's verdict, read here: it killed a process of the run for memory.
        memory_exceeded = self.cgroup is not None and self.cgroup.oom_kills() > 0
        error = status.get("error")
        if error is None and "isolation" not in status:
            error = f"the sandbox did not start (supervisor exit {returncode})"
        elif error is None and "cpu_seconds" not in status and not backstop:
            if memory_exceeded:  # the kernel chose a watcher: the run ended all the same
                status.update(exit=None, signal=signal.SIGKILL)
            else:
                error = f"the sandbox ended without a report (supervisor exit {returncode})"
        sig = status.get("signal")
        cpu = status.get("cpu_seconds")
        timed_out = bool(status.get("timed_out")) or backstop
        # SIGXCPU at the soft limit; SIGKILL at the hard one, a second on, when the code
        # caught SIGXCPU (the kernel's accounting is a tick coarse, hence the 0.9).
        cpu_exceeded = sig == signal.SIGXCPU or (
            sig == signal.SIGKILL
            and not timed_out
            and not memory_exceeded
            and cpu is not None
            and cpu >= self.limits.cpu_seconds * 0.9
        )
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
            isolation=self.isolation(status.get("isolation") or []),
            error=error,
        )

    def cleanup(self) -> None:
        for fd in (self.status_r, self.status_w, self.stdin_fd, self.plan_fd, self.script_fd):
            if fd >= 0:
                os.close(fd)
        self.status_r = self.status_w = self.stdin_fd = self.plan_fd = self.script_fd = -1
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.mode == UID and self.uid is not None:
            remove_uid_leftovers(self.uid, self.python or sys.executable)
        remove_tree(self.scratch)


if __name__ == "__main__":
    # python -m engine.sandbox.run: what isolation the sandbox gets on this machine.
    logging.basicConfig(level=logging.INFO)
    print(isolation_summary())
