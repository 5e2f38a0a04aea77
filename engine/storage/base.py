"""What every store shares: the error, the protocol, file and URL helpers."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Protocol

from engine.errors import EngineError

REMOTE_SCHEMES = ("s3", "gs")
MiB = 1024 * 1024

# Values of these variables are replaced by *** in every StorageError message.
_SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "CLOUDSDK_AUTH_ACCESS_TOKEN",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
)
AWS_CREDENTIALS_HINT = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary"
    " keys), or AWS_PROFILE with ~/.aws/credentials, or run where an instance role applies"
)
GCS_CREDENTIALS_HINT = (
    "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run"
    " `gcloud auth application-default login`, or run where a service account is attached"
)


class StorageError(EngineError):
    """A store could not be opened or read or written; the message says what to check."""

    def __init__(self, message: str) -> None:
        super().__init__(_redact(message))


def _redact(text: str) -> str:
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


class Store(Protocol):
    """One API over a directory or a bucket prefix. Paths are relative to ``root``."""

    root: str

    def url(self, path: str = "") -> str:
        """``root/path`` for messages."""
        ...

    def upload_dir(self, local_dir: Path, dest: str) -> None:
        """Copy every file under ``local_dir`` to ``dest``, merging; blocks until done."""
        ...

    def download_dir(self, src: str, local_dir: Path) -> None:
        """Copy every file under ``src`` into ``local_dir``; an empty ``src`` is an error."""
        ...

    def write_text(self, dest: str, text: str) -> None: ...

    def read_text(self, src: str) -> str | None:
        """The file's text, or None if it does not exist."""
        ...

    def exists(self, path: str) -> bool:
        """A file, or a directory with at least one file in it."""
        ...

    def list_dirs(self, prefix: str = "") -> list[str]:
        """Names of the immediate subdirectories of ``prefix``, sorted."""
        ...

    def delete_dir(self, path: str) -> None:
        """Delete everything under ``path``; nothing to delete is not an error."""
        ...


def clean_path(path: str) -> str:
    """A relative, '/'-separated path without empty or '.' parts; '..' is refused."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StorageError(f"storage path {path!r} must not contain '..'")
    return "/".join(parts)


def local_files(local_dir: Path) -> list[tuple[Path, str]]:
    """(file, its path relative to local_dir with '/') for every file below local_dir."""
    if not local_dir.is_dir():
        raise StorageError(f"cannot upload {local_dir}: it is not a directory")
    files = []
    for dirpath, _dirnames, filenames in os.walk(local_dir):
        for name in filenames:
            path = Path(dirpath) / name
            files.append((path, path.relative_to(local_dir).as_posix()))
    return sorted(files, key=lambda f: f[1])


def run_parallel(fn: Callable[[Any], None], items: list[Any], max_workers: int) -> None:
    """fn(item) for every item on a thread pool; the first error cancels the rest, raised."""
    if not items:
        return
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            for future in as_completed(futures):
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def tmp_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")


def copy_file_atomic(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(dest)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def split_bucket_url(url: str) -> tuple[str, str, str]:
    """``s3://bucket/a/b/`` -> ("s3", "bucket", "a/b")."""
    scheme, sep, rest = url.partition("://")
    bucket, _, prefix = rest.partition("/")
    if not sep or scheme not in REMOTE_SCHEMES or not bucket:
        raise StorageError(f"storage URL {url!r} must look like {scheme or 's3'}://bucket/prefix")
    return scheme, bucket, clean_path(prefix)


def missing_extra(url: str, package: str, extra: str) -> StorageError:
    return StorageError(
        f"{url} needs the {package} package, which is not installed: pip install 'rlctl[{extra}]'"
    )


class BucketPaths:
    """Keys under a bucket prefix, shared by the bucket stores: ``root`` is the store's
    URL (``s3://bucket/prefix``), ``prefix`` the key prefix within the bucket."""

    root: str
    prefix: str

    def url(self, path: str = "") -> str:
        rel = clean_path(path)
        return f"{self.root}/{rel}" if rel else self.root

    def _key(self, path: str) -> str:
        return "/".join(p for p in (self.prefix, clean_path(path)) if p)

    def _dir_prefix(self, path: str) -> str:
        key = self._key(path)
        return f"{key}/" if key else ""
