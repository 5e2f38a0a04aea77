"""What a run may leave behind where it has no namespaces (the ``uid`` mode: root, a
fresh uid per run), found by that uid and removed after the run:

- processes still running as the uid (killed);
- SysV shared memory segments, message queues and semaphore sets it owns or made
  (no IPC namespace would free them: they would hold memory until reboot);
- its keys: the uid's user and user-session keyrings and its persistent keyring,
  invalidated from a process of that uid (no user namespace would free them);
- files and directories it owns in any directory it could write: every world-writable
  directory a fresh uid can reach, found once per engine process (a walk of the file
  system that does not descend where other users may not pass), and the usual ones
  (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``, ``/dev/mqueue``) at every run.
  A world-writable directory made after that walk is not searched.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

USUAL = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/dev/mqueue")
# Never walked: kernel file systems (a device directory is searched only when listed).
_NOT_WALKED = ("/proc", "/sys", "/dev")
_WALK_LIMIT = 500_000  # directories looked at, at most
IPC_RMID = 0
_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
# Run as the run's uid: its user, user-session and persistent keyrings, invalidated
# (the kernel's garbage collector frees an invalidated key at once).
_KEYS = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
nr = int(sys.argv[1])
ids = [libc.syscall(nr, 0, spec, 0) for spec in (-4, -5)]
ids.append(libc.syscall(nr, 22, -1, -2))
for key in ids:
    if key > 0:
        libc.syscall(nr, 21, key)
"""


def remove_uid_leftovers(uid: int, python: str) -> None:
    """Everything of the uid's (the module's docstring), as root."""
    kill_uid(uid)
    remove_ipc(uid)
    invalidate_keys(uid, python)
    for directory in (*USUAL, *world_writable_dirs()):
        remove_owned(directory, uid)


def kill_uid(uid: int) -> None:
    for _ in range(10):
        pids = [pid for pid in _pids() if uid in _uids(pid)]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def remove_ipc(uid: int) -> list[str]:
    """Remove the SysV objects the uid owns or made; what was removed."""
    libc = ctypes.CDLL(None, use_errno=True)
    removed = []
    for kind, column, remove in (
        ("shm", "shmid", lambda i: libc.shmctl(i, IPC_RMID, None)),
        ("msg", "msqid", lambda i: libc.msgctl(i, IPC_RMID, None)),
        ("sem", "semid", lambda i: libc.semctl(i, 0, IPC_RMID)),
    ):
        try:
            lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        names = lines[0].split()
        for line in lines[1:]:
            row = dict(zip(names, line.split(), strict=False))
            try:
                owners = {int(row["uid"]), int(row["cuid"])}
                ident = int(row[column])
            except (KeyError, ValueError):
                continue
            if uid in owners and remove(ident) == 0:
                removed.append(f"{kind} {ident}")
    return removed


def invalidate_keys(uid: int, python: str) -> None:
    if _KEYCTL is None:
        return
    try:
        subprocess.run(
            [python, "-I", "-S", "-c", _KEYS, str(_KEYCTL)],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sandbox: cannot invalidate the keys of uid %d: %s", uid, exc)


def remove_owned(directory: str, uid: int) -> None:
    """Remove what ``uid`` owns directly in ``directory`` (its directories whole)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            if entry.is_dir(follow_symlinks=False):
                remove_tree(Path(entry.path))
            else:
                os.unlink(entry.path)
        except OSError:
            pass


@functools.lru_cache(maxsize=1)
def world_writable_dirs() -> tuple[str, ...]:
    """Every directory another user may create files in and reach: world-writable, and
    every directory above it searchable by others. Walked once per process."""
    found = []
    stack = ["/"]
    seen = 0
    while stack and seen < _WALK_LIMIT:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False) or entry.path in _NOT_WALKED:
                    continue
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            seen += 1
            if not mode & stat.S_IXOTH:  # others cannot pass: nothing below is theirs
                continue
            if mode & stat.S_IWOTH:
                found.append(entry.path)
            stack.append(entry.path)
    if stack:
        log.warning("sandbox: stopped looking for world-writable directories at %d", seen)
    return tuple(found)


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


def remove_tree(path: Path) -> None:
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
