"""A cgroup for one sandboxed run: what the kernel counts, bounded for the run as a whole.

RLIMITs bind each process, and only what it maps: SysV shared memory, memfd files,
tmpfs pages, pipe and socket buffers and kernel objects (inodes, page tables) escape
them, and a run may fork. A memory cgroup counts all of those, for every process of the
run together; the pids controller counts its tasks. The run's cgroup is made by the
parent (engine/sandbox/run.py) under the engine's own cgroup, joined by the
sandbox's supervisor before it starts anything (``cgroup.procs`` passed open), read for
the kernel's verdict (``oom_kill``) when the run ends, emptied and removed.

Found once per process, in this order:

- cgroup v2, where the engine's cgroup has the ``memory`` and ``pids`` controllers for
  its children (its ``cgroup.subtree_control``, enabled here if the kernel allows it:
  the root cgroup, or one delegated to the engine, e.g. by systemd's ``Delegate=yes``);
- cgroup v1's ``memory`` and ``pids`` hierarchies, writable (root, or delegated);
- none: the runs have their RLIMITs and the IPC namespace's caps only, and their
  ``isolation`` says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import signal
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

_PREFIX = "rlctl-sandbox-"


@dataclass(frozen=True)
class Hierarchy:
    """Where runs' cgroups are made: one v2 directory, or v1's memory and pids ones."""

    version: int
    memory: str  # the parent directory (v2: the one directory)
    pids: str

    def describe(self) -> str:
        return "cgroup v2" if self.version == 2 else "cgroup v1"


class RunCgroup:
    """One run's cgroup: ``fds()`` to join it, ``oom_kills()`` its verdict, ``remove()``."""

    def __init__(self, hierarchy: Hierarchy, memory_bytes: int, tasks: int) -> None:
        self.hierarchy = hierarchy
        name = f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.dirs = [os.path.join(hierarchy.memory, name)]
        if hierarchy.version == 1:
            self.dirs.append(os.path.join(hierarchy.pids, name))
        self.memory_bytes = memory_bytes
        self.tasks = tasks
        self._fds: list[int] = []
        made = []
        try:
            for d in self.dirs:
                os.mkdir(d)
                made.append(d)
            self._limit()
            for d in self.dirs:
                self._fds.append(os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY))
        except OSError:
            self.close_fds()
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
            raise

    def _limit(self) -> None:
        memory, pids = self.dirs[0], self.dirs[-1]
        if self.hierarchy.version == 2:
            _write(memory, "memory.max", self.memory_bytes)
            _write(memory, "memory.swap.max", 0, optional=True)
        else:
            _write(memory, "memory.limit_in_bytes", self.memory_bytes)
            # Memory and swap together (only where swap is accounted).
            _write(memory, "memory.memsw.limit_in_bytes", self.memory_bytes, optional=True)
        _write(pids, "pids.max", self.tasks)

    def fds(self) -> list[int]:
        """``cgroup.procs`` of each directory, open for writing: a process writes ``0``
        to each to join the run's cgroup (its children follow)."""
        return list(self._fds)

    def close_fds(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def describe(self) -> str:
        mib = self.memory_bytes >> 20
        return f"{self.hierarchy.describe()}: memory {mib} MiB for the run, {self.tasks} tasks"

    def oom_kills(self) -> int:
        """How many of the run's processes the kernel killed for its memory limit."""
        if self.hierarchy.version == 2:
            events = _read(self.dirs[0], "memory.events")
        else:
            events = _read(self.dirs[0], "memory.oom_control")
        found = re.search(r"^oom_kill (\d+)$", events, re.MULTILINE)
        return int(found.group(1)) if found else 0

    def processes(self) -> list[int]:
        found: set[int] = set()
        for d in self.dirs:
            found |= {int(p) for p in _read(d, "cgroup.procs").split()}
        return sorted(found)

    def remove(self) -> None:
        """Kill whatever of the run is left and remove its directories (the kernel frees
        the last tasks a moment after the kill: retried for up to a few seconds)."""
        self.close_fds()
        if self.hierarchy.version == 2:
            with contextlib.suppress(OSError):
                _write(self.dirs[0], "cgroup.kill", 1)
        for attempt in range(300):
            for pid in self.processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            left = []
            for d in self.dirs:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(d)
            self.dirs = left or self.dirs
            if not left:
                self.dirs = []
                return
            time.sleep(0.01 if attempt < 100 else 0.05)
        log.warning("sandbox: could not remove the cgroups %s", self.dirs)


def _write(directory: str, name: str, value: int, optional: bool = False) -> None:
    path = os.path.join(directory, name)
    if optional and not os.path.exists(path):
        return
    with open(path, "w") as f:
        f.write(str(value))


def _read(directory: str, name: str) -> str:
    try:
        with open(os.path.join(directory, name)) as f:
            return f.read()
    except OSError:
        return ""


# ---------------------------------------------------------------- finding the hierarchy

_lock = threading.Lock()
_found: tuple[Hierarchy | None, str] | None = None


def hierarchy() -> tuple[Hierarchy | None, str]:
    """The hierarchy runs' cgroups are made in, or None and why there is none; found
    once per process."""
    global _found
    with _lock:
        if _found is None:
            _found = _find()
            if _found[0] is None:
                log.info("sandbox: no cgroup for the runs: %s", _found[1])
        return _found


def _find() -> tuple[Hierarchy | None, str]:
    mounts = _cgroup_mounts()
    own = _own_cgroups()
    why = []
    if "" in own and mounts.get("cgroup2"):
        found = _v2(os.path.join(mounts["cgroup2"], own[""].lstrip("/")))
        if isinstance(found, Hierarchy):
            return found, ""
        why.append(found)
    else:
        why.append("cgroup v2: not mounted")
    dirs = {}
    for controller in ("memory", "pids"):
        mount, path = mounts.get(controller), own.get(controller)
        if mount is None or path is None:
            why.append(f"cgroup v1: no {controller} hierarchy")
            break
        dirs[controller] = os.path.join(mount, path.lstrip("/"))
    else:
        problem = _usable(dirs["memory"]) or _usable(dirs["pids"])
        if problem is None:
            return Hierarchy(1, dirs["memory"], dirs["pids"]), ""
        why.append(f"cgroup v1: {problem}")
    return None, "; ".join(why)


def _v2(directory: str) -> Hierarchy | str:
    controllers = set(_read(directory, "cgroup.controllers").split())
    if not {"memory", "pids"} <= controllers:
        return f"cgroup v2: {directory} has no memory and pids controllers to give"
    enabled = set(_read(directory, "cgroup.subtree_control").split())
    if not {"memory", "pids"} <= enabled:
        try:
            _write_text(directory, "cgroup.subtree_control", "+memory +pids")
        except OSError as exc:
            return (
                f"cgroup v2: cannot enable memory and pids for the children of {directory}"
                f" ({exc.strerror}: a cgroup with processes of its own cannot, unless it is"
                " the root; run the engine in a delegated cgroup, e.g. systemd-run --user"
                " --scope -p Delegate=yes)"
            )
    problem = _usable(directory)
    return Hierarchy(2, directory, directory) if problem is None else f"cgroup v2: {problem}"


def _write_text(directory: str, name: str, text: str) -> None:
    with open(os.path.join(directory, name), "w") as f:
        f.write(text)


def _usable(directory: str) -> str | None:
    """None when a child cgroup can be made here, else why not."""
    probe = os.path.join(directory, f"{_PREFIX}probe-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return f"cannot make a cgroup in {directory} ({exc.strerror})"
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return None


def _cgroup_mounts() -> dict[str, str]:
    """Mount points: ``cgroup2`` for the unified hierarchy, a v1 controller's name for
    its hierarchy (where the mount shows its own root)."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        root, point = fields[3], fields[4].replace("\\040", " ")
        if rest[0] == "cgroup2" and root == "/":
            found.setdefault("cgroup2", point)
        elif rest[0] == "cgroup" and root == "/":
            for option in rest[2].split(","):
                found.setdefault(option, point)
    return found


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per v1 controller, and under ``""`` its v2 one."""
    own: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return own
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own
