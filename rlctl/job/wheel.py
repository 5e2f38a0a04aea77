"""A wheel of the rlctl that is running, to install on a job's nodes.

A job runs exactly the rlctl version it was launched from: the launcher ships a wheel of
itself with the job (SkyPilot file mounts, the Slurm job's directory) and the node's
setup installs it (``rlctl/node/jobenv.py``). The wheel is made from what this process
imports (the ``rlctl`` and ``engine`` packages, wherever they are: a checkout, an
editable install, site-packages), the installed distribution's metadata and the bundled
templates and recipes, so a change in a checkout reaches the job without a release.

It is written by hand to the wheel format (PEP 427: a zip with ``.dist-info/`` metadata,
``RECORD`` hashes, data files under ``.data/data/``), needs no build backend and takes
well under a second. Deterministic: the same files give the same bytes (fixed
timestamps, sorted entries), so the wheel is rebuilt at every launch and stays the same
while the code does.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from rlctl import __version__
from rlctl.bundled import bundled_dir

DIST = "rlctl"
PACKAGES = ("rlctl", "engine")
DATA = ("templates", "recipes")  # pyproject's data-files: <prefix>/share/rlctl/<name>
WHEEL_NAME = f"{DIST}-{__version__}-py3-none-any.whl"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold


def local_wheel(job_id: str, create: bool = False) -> Path:
    """Where a job's wheel is built on the launching machine: its job directory (made,
    private, with ``create``)."""
    from rlctl.home import job_dir

    return job_dir(job_id, create=create) / WHEEL_NAME


def build_wheel(out_dir: Path) -> Path:
    """Write ``rlctl-<version>-py3-none-any.whl`` into ``out_dir`` and return its path.
    Written to a temporary name and renamed, so a concurrent launch never reads half a
    wheel."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / WHEEL_NAME
    record: list[str] = []
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".wheel-", suffix=".tmp")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, data in sorted(_entries()):
                _write(zf, name, data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                record.append(f"{name},sha256={digest.decode()},{len(data)}")
            record_name = f"{_dist_info()}/RECORD"
            record.append(f"{record_name},,")
            _write(zf, record_name, ("\n".join(record) + "\n").encode())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def wheel_files(wheel: Path) -> dict[str, bytes]:
    """A wheel's entries (without RECORD), for comparing two wheels."""
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist() if not n.endswith(".dist-info/RECORD")}


def _dist_info() -> str:
    return f"{DIST}-{__version__}.dist-info"


def _entries() -> Iterator[tuple[str, bytes]]:
    for package in PACKAGES:
        root = Path(__import__(package).__file__).resolve().parent
        for path in _files(root):
            yield f"{package}/{path.relative_to(root).as_posix()}", path.read_bytes()
    data_prefix = f"{DIST}-{__version__}.data/data/share/rlctl"
    for name in DATA:
        root = bundled_dir(name)
        for path in _files(root):
            yield f"{data_prefix}/{name}/{path.relative_to(root).as_posix()}", path.read_bytes()
    yield from _metadata()


def _files(root: Path) -> list[Path]:
    """The files a wheel carries from ``root``: no bytecode caches, no editor droppings."""
    return [
        p
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    ]


def _metadata() -> Iterator[tuple[str, bytes]]:
    """The installed distribution's METADATA and entry points (an editable install has
    the same ones a wheel would), and a WHEEL file for a pure-Python wheel."""
    # An installed dist-info first: a checkout's build leaves a stale rlctl.egg-info in
    # the working directory, which comes first on sys.path.
    found = list(importlib.metadata.distributions(name=DIST))
    found.sort(key=lambda d: d.read_text("METADATA") is None)
    if not found:
        raise RuntimeError(f"{DIST} is not installed: pip install -e . in a checkout")
    dist = found[0]
    if dist.version != __version__:
        raise RuntimeError(
            f"the installed {DIST} metadata says {dist.version}, the code {__version__}:"
            " reinstall rlctl (pip install -e . in a checkout)"
        )
    info = _dist_info()
    metadata = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    yield f"{info}/METADATA", metadata.encode()
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        yield f"{info}/entry_points.txt", entry_points.encode()
    yield f"{info}/top_level.txt", ("\n".join(PACKAGES) + "\n").encode()
    wheel = "Wheel-Version: 1.0\nGenerator: rlctl\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    yield f"{info}/WHEEL", wheel.encode()


def _write(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
