"""The sandbox's namespaces made by bubblewrap (``bwrap``), for a user who may not make
them itself: where unprivileged user namespaces are allowed only to allow-listed
programs (Ubuntu 23.10 and later allow bwrap). Used only when ``bwrap`` is on the PATH
and the sandbox's own user namespace failed (engine/agents/sandbox.py's probe).

It builds the same view as sandbox_init.py's ``build_filesystem``: the host read-only,
fresh tmpfs for /tmp, /var/tmp and /dev/shm, a minimal /dev, the pid namespace's /proc,
and the hidden directories covered, with the interpreter bound back.
"""

from __future__ import annotations

import os
import shutil

# The notes a bwrap run adds to its result's isolation.
APPLIED = [
    "bubblewrap",
    "user namespace",
    "network namespace",
    "pid namespace",
    "ipc namespace",
    "read-only file system",
]


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def bwrap_argv(bwrap: str, scratch_bytes: int, hide: list[str], keep: list[str]) -> list[str]:
    """bwrap's options, up to and including ``--``: the command follows."""
    # --as-pid-1: the sandbox's init is pid 1 itself, which the code cannot signal.
    argv = [bwrap, "--unshare-all", "--as-pid-1", "--die-with-parent", "--new-session"]
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for private in ("/tmp", "/var/tmp", "/dev/shm"):
        if private == "/dev/shm" or (os.path.isdir(private) and not os.path.islink(private)):
            argv += ["--perms", "1777", "--size", str(scratch_bytes), "--tmpfs", private]
    argv += _bind_back("/tmp", keep)
    for path in hide:
        if os.path.isdir(path) and not os.path.islink(path):
            argv += ["--perms", "0755", "--tmpfs", path]
            argv += _bind_back(path, keep)
            argv += ["--remount-ro", path]
    return [*argv, "--chdir", "/", "--"]


def applied(scratch_bytes: int, hide: list[str]) -> list[str]:
    hidden = [p for p in hide if os.path.isdir(p) and not os.path.islink(p)]
    notes = [*APPLIED, f"private /tmp /var/tmp /dev/shm ({scratch_bytes >> 20} MiB each)"]
    if hidden:
        notes.append("hidden " + " ".join(hidden))
    return [*notes, "private /proc", "minimal /dev"]


def _bind_back(covered: str, keep: list[str]) -> list[str]:
    argv = []
    for kept in keep:
        if kept == covered or kept.startswith(covered.rstrip("/") + "/"):
            argv += ["--ro-bind", kept, kept]
    return argv
