"""Where a secret's value may have been written: the files under some directories, and the
Ray temp dirs a run left (tests/security/test_secrets.py, tests/slurm/test_secrets_e2e.py).

Other tests run beside these (scripts/test.sh uses two workers): their Ray dirs are read
too, harmlessly, and a file or directory that goes away during the scan is passed over."""

from __future__ import annotations

import os
from pathlib import Path


def files_holding(roots: list[Path], values: tuple[str, ...]) -> list[str]:
    """Every regular file under ``roots`` (or a root that is a file) holding one of
    ``values``, as ``"path: <value's first 6 characters>..."``."""
    found = []
    for root in roots:
        for path in [root] if root.is_file() else _files_under(root):
            if path.is_symlink():
                continue
            try:
                data = path.read_bytes()
            except OSError:  # a socket, or gone meanwhile
                continue
            found += [f"{path}: {v[:6]}..." for v in values if v.encode() in data]
    return found


def ray_dirs_since(started: float, *patterns: str) -> list[Path]:
    """Ray's temp dirs (the engine's /tmp/rayXXXX, Ray's default /tmp/ray, and /tmp's
    entries matching ``patterns``) and ~/.ray, changed since ``started``."""
    candidates = [p for pattern in ("ray*", *patterns) for p in Path("/tmp").glob(pattern)]
    found = []
    for d in [*candidates, Path.home() / ".ray"]:
        try:
            if d.is_dir() and d.stat().st_mtime >= started - 1:
                found.append(d)
        except OSError:  # removed since the listing
            continue
    return found


def _files_under(root: Path):
    # os.walk passes over a directory removed while it walks (rglob may raise)
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if path.is_file():
                yield path
