"""A local directory as a store: files copied under a temporary name, then renamed."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.storage.base import StorageError, clean_path, copy_file_atomic, local_files, tmp_sibling

# ----------------------------------------------------------------------------- local


class LocalStore:
    """A directory on this machine (or a shared filesystem)."""

    def __init__(self, root: str | Path) -> None:
        self.root = str(root)
        self._root = Path(root).expanduser()

    def url(self, path: str = "") -> str:
        return str(self._path(path))

    def _path(self, path: str) -> Path:
        rel = clean_path(path)
        return self._root / rel if rel else self._root

    def upload_dir(self, local_dir: Path, dest: str) -> None:
        target = self._path(dest)
        files = local_files(Path(local_dir))
        if target.exists() and target.samefile(local_dir):
            return  # already in place: the run directory is its own staging directory
        with self._errors("upload to", dest):
            for path, rel in files:
                copy_file_atomic(path, target / rel)

    def download_dir(self, src: str, local_dir: Path) -> None:
        source = self._path(src)
        if not source.is_dir() or not any(p.is_file() for p in source.rglob("*")):
            raise StorageError(f"nothing to download at {self.url(src)}")
        with self._errors("download from", src):
            for path, rel in local_files(source):
                copy_file_atomic(path, Path(local_dir) / rel)

    def write_text(self, dest: str, text: str) -> None:
        path = self._path(dest)
        with self._errors("write", dest):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = tmp_sibling(path)
            try:
                tmp.write_text(text)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)

    def read_text(self, src: str) -> str | None:
        path = self._path(src)
        if not path.is_file():
            return None
        with self._errors("read", src):
            return path.read_text()

    def exists(self, path: str) -> bool:
        return self._path(path).exists()

    def list_dirs(self, prefix: str = "") -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))

    def delete_dir(self, path: str) -> None:
        if not clean_path(path):
            raise StorageError(f"refusing to delete the whole store {self.url()}")
        target = self._path(path)
        if not target.exists():
            return
        with self._errors("delete", path):
            shutil.rmtree(target)

    @contextmanager
    def _errors(self, action: str, path: str) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            raise StorageError(
                f"cannot {action} {self.url(path)}: {e.strerror or e} (check that the"
                " directory is writable and the disk is not full)"
            ) from e
