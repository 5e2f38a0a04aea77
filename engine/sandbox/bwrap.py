"""The sandbox's namespaces made by bubblewrap (``bwrap``), for a user who may not make
them itself: where unprivileged user namespaces are allowed only to allow-listed
programs (Ubuntu 23.10 and later allow bwrap). Used only when ``bwrap`` is on the PATH
and the sandbox's own user namespace failed (engine/sandbox/run.py's probe).

It builds the view inside.py's ``build_view`` does (view.py): a new root
of the system's directories, the interpreters' prefixes and libraries and ``/etc``'s
basics, read-only; fresh tmpfs for /tmp, /var/tmp and /dev/shm; a minimal /dev with its
own devpts; the pid namespace's /proc; and, where bubblewrap has it (0.8), no user
namespace below the sandbox's. What it cannot do, the run's ``isolation`` says: cap the
IPC namespace, or bound the files of a tmpfs (``nr_inodes``).
"""

from __future__ import annotations

import functools
import shutil
import subprocess

# The notes a bwrap run adds to its result's isolation.
APPLIED = [
    "bubblewrap",
    "user namespace",
    "network namespace",
    "pid namespace",
    "ipc namespace",
]


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=4)
def _disables_userns(bwrap: str) -> bool:
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--disable-userns" in text


def bwrap_argv(bwrap: str, scratch_bytes: int, view: dict) -> list[str]:
    """bwrap's options, up to and including ``--``: the command follows."""
    # --as-pid-1: the sandbox's init is pid 1 itself, which the code cannot signal.
    argv = [bwrap, "--unshare-all", "--unshare-user", "--as-pid-1", "--die-with-parent"]
    argv += ["--new-session"]
    if _disables_userns(bwrap):
        argv += ["--disable-userns"]
    for source, target in view["binds"]:
        argv += ["--ro-bind", source, target]
    for target, path in view["links"]:
        argv += ["--symlink", target, path]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for private in ("/tmp", "/var/tmp", "/dev/shm"):
        argv += ["--perms", "1777", "--size", str(scratch_bytes), "--tmpfs", private]
    return [*argv, "--remount-ro", "/", "--chdir", "/", "--"]


def applied(bwrap: str, scratch_bytes: int, view_note: str) -> list[str]:
    notes = [*APPLIED, view_note]
    notes.append(f"private /tmp /var/tmp /dev/shm ({scratch_bytes >> 20} MiB each)")
    notes += ["private /proc", "minimal /dev, private devpts"]
    if _disables_userns(bwrap):
        notes.append("no nested user namespaces")
    return notes


def missing(bwrap: str) -> list[str]:
    gaps = ["IPC namespace NOT capped", "tmpfs files NOT bounded (bubblewrap sets no nr_inodes)"]
    gaps.append("ptys bounded by open files only (its devpts has no max of its own)")
    if not _disables_userns(bwrap):
        gaps.append("nested user namespaces allowed (bubblewrap before 0.8)")
    return gaps
