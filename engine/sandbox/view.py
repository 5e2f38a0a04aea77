"""The file system the sandboxed code sees where it has a mount namespace: only what its
interpreter needs, read-only, never the host's whole tree.

- the system's programs and libraries (``/usr``; ``/bin``, ``/sbin``, ``/lib*`` as the
  host has them: links into ``/usr`` on a merged-usr system, else their directories);
- each interpreter's prefix (the code's and, under bubblewrap, the engine's, which runs
  the sandbox's init inside), and every directory outside those that holds a library
  the interpreter loads (found once per interpreter: it is run, made to import all of
  its extension modules, and its mapped files listed), e.g. a pyenv under ``/root`` or a
  conda under ``/opt``: only that prefix, not ``/root`` or ``/opt``;
- ``/etc``'s basics (the dynamic loader's cache, the time zone, nsswitch.conf), and a
  ``passwd``, ``group`` and ``hosts`` written for the run;
- a minimal ``/dev``, the pid namespace's ``/proc``, and the private ``/tmp``
  (``/var/tmp`` and ``/dev/shm`` in it), which inside.py (or bubblewrap) adds.

No project checkout, home directory, ``/opt``, ``/srv``, ``/mnt``, ``/run``, ``/var``,
``/sys``, and no other mount of the host: nothing there can be read, locked (flock) or
listed (``/proc/self/mountinfo`` shows the view's mounts only).
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

# Where the system keeps programs and libraries (links on merged-usr systems).
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# /etc files the standard library and the dynamic loader read, where the host has them.
ETC = ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf")
# Run by an interpreter to list the directories of every file it maps once it has
# imported all of its extension modules (stdlib only; under -I -S).
_MAPS = r"""
import importlib, importlib.machinery, os, sys
for entry in sys.path:
    if not os.path.isdir(entry) or not entry.endswith("lib-dynload"):
        continue
    for name in sorted(os.listdir(entry)):
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if name.endswith(suffix):
                try:
                    importlib.import_module(name[: -len(suffix)])
                except BaseException:
                    pass
dirs = set()
for line in open("/proc/self/maps"):
    parts = line.split(None, 5)
    if len(parts) == 6 and parts[5].startswith("/"):
        dirs.add(os.path.dirname(os.path.realpath(parts[5].strip())))
print("\n".join(sorted(dirs)))
"""


def prefix(python: str) -> str:
    """An interpreter's prefix: the directory above its ``bin``."""
    return str(Path(os.path.realpath(python)).parent.parent)


@functools.lru_cache(maxsize=8)
def loaded_dirs(python: str) -> tuple[str, ...]:
    """The directories of the files ``python`` maps with all its extension modules
    imported; empty when it cannot be run (the run then reports the failure itself)."""
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-B", "-c", _MAPS],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sandbox: cannot list what %s loads: %s", python, exc)
        return ()
    if done.returncode != 0:
        log.warning("sandbox: cannot list what %s loads: %s", python, done.stderr[-500:])
        return ()
    return tuple(d for d in done.stdout.splitlines() if d.startswith("/"))


def build(pythons: list[str], files_dir: Path, uid: int, gid: int, home: str) -> dict:
    """The view as data: ``binds`` (host path, path inside; read-only), ``links``
    (target, path inside) and the run's own ``/etc`` files, written into ``files_dir``
    and bound from there."""
    binds: list[tuple[str, str]] = []
    links: list[tuple[str, str]] = []
    for path in SYSTEM:
        if os.path.islink(path):
            links.append((os.readlink(path), path))
        elif os.path.isdir(path):
            binds.append((path, path))
    wanted = []
    for python in pythons:
        real = os.path.realpath(python)
        wanted += [prefix(real), *loaded_dirs(real)]
    covered = [b for b, _ in binds]
    for path in sorted(set(wanted), key=len):
        real = os.path.realpath(path)
        if real in ("/", "") or not os.path.isdir(real):
            continue
        if any(real == c or real.startswith(c.rstrip("/") + "/") for c in covered):
            continue
        binds.append((real, real))
        covered.append(real)
    for path in ETC:
        if os.path.exists(path):
            binds.append((os.path.realpath(path), path))
    if os.path.isdir("/etc/alternatives"):  # links some system programs go through
        binds.append(("/etc/alternatives", "/etc/alternatives"))
    files_dir.mkdir(mode=0o755)
    own = {
        "passwd": (
            "root:x:0:0:root:/:/usr/sbin/nologin\n"
            f"sandbox:x:{uid}:{gid}:sandbox:{home}:/usr/sbin/nologin\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
        "group": f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    }
    for name, text in own.items():
        path = files_dir / name
        path.write_text(text)
        path.chmod(0o644)
        binds.append((str(path), f"/etc/{name}"))
    return {"binds": binds, "links": links}


def describe(view: dict) -> str:
    inside = sorted({dst for _, dst in view["binds"] if not dst.startswith("/etc/")})
    return "only " + " ".join(inside) + " and /etc basics visible (read-only)"
