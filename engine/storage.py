"""Where checkpoints live: a local directory or a bucket (S3, S3-compatible, GCS).

``open_store(root)`` gives one API over all three; paths passed to a store are relative
to its root and ``/``-separated (``"global_step_10/actor"``). Uploads merge into the
destination (a file of the same name is replaced, others are kept), so several nodes can
each upload their own shards of one checkpoint to the same place. Each file lands whole
or not at all (an object PUT, or a local copy under a temporary name then a rename); a
directory is never atomic, which is why the trainer writes a ``COMPLETE`` marker last.

``BackgroundUploader`` runs uploads on a thread, in submission order, so training goes
on while a checkpoint is on its way.

Backends are imported where used: ``pip install 'rlctl[aws]'`` for S3 (boto3), and
``pip install 'rlctl[gcs]'`` for GCS (google-cloud-storage). Credentials come from each
SDK's usual chain (environment, config files, instance roles); S3-compatible stores
(Cloudflare R2, MinIO, ...) are reached through ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``. Error messages name the URL and what to check, never a secret.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from engine.errors import EngineError

log = logging.getLogger(__name__)

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
_AWS_CREDENTIALS_HINT = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary"
    " keys), or AWS_PROFILE with ~/.aws/credentials, or run where an instance role applies"
)
_GCS_CREDENTIALS_HINT = (
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


def is_remote(path: str) -> bool:
    """True for a bucket URL (``s3://...``, ``gs://...``), False for a local path."""
    return path.startswith(tuple(f"{s}://" for s in REMOTE_SCHEMES))


def open_store(root: str) -> Store:
    """The store for ``root``: a local path, ``s3://bucket/prefix`` or ``gs://bucket/prefix``."""
    if root.startswith("s3://"):
        return S3Store(root)
    if root.startswith("gs://"):
        return GCSStore(root)
    if root.startswith("file://"):
        return LocalStore(root[len("file://") :])
    if "://" in root:
        raise StorageError(
            f"unsupported storage URL {root!r}: use a local path, s3://bucket/prefix (AWS S3,"
            " or an S3-compatible store such as Cloudflare R2 or MinIO with AWS_ENDPOINT_URL"
            " set to its endpoint), or gs://bucket/prefix"
        )
    return LocalStore(root)


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


def _clean(path: str) -> str:
    """A relative, '/'-separated path without empty or '.' parts; '..' is refused."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StorageError(f"storage path {path!r} must not contain '..'")
    return "/".join(parts)


def _local_files(local_dir: Path) -> list[tuple[Path, str]]:
    """(file, its path relative to local_dir with '/') for every file below local_dir."""
    if not local_dir.is_dir():
        raise StorageError(f"cannot upload {local_dir}: it is not a directory")
    files = []
    for dirpath, _dirnames, filenames in os.walk(local_dir):
        for name in filenames:
            path = Path(dirpath) / name
            files.append((path, path.relative_to(local_dir).as_posix()))
    return sorted(files, key=lambda f: f[1])


def _run_parallel(fn: Callable[[Any], None], items: list[Any], max_workers: int) -> None:
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


def _tmp_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")


def _copy_file_atomic(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(dest)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _split_bucket_url(url: str) -> tuple[str, str, str]:
    """``s3://bucket/a/b/`` -> ("s3", "bucket", "a/b")."""
    scheme, sep, rest = url.partition("://")
    bucket, _, prefix = rest.partition("/")
    if not sep or scheme not in REMOTE_SCHEMES or not bucket:
        raise StorageError(f"storage URL {url!r} must look like {scheme or 's3'}://bucket/prefix")
    return scheme, bucket, _clean(prefix)


def _missing_extra(url: str, package: str, extra: str) -> StorageError:
    return StorageError(
        f"{url} needs the {package} package, which is not installed: pip install 'rlctl[{extra}]'"
    )


# ----------------------------------------------------------------------------- local


class LocalStore:
    """A directory on this machine (or a shared filesystem)."""

    def __init__(self, root: str | Path) -> None:
        self.root = str(root)
        self._root = Path(root).expanduser()

    def url(self, path: str = "") -> str:
        return str(self._path(path))

    def _path(self, path: str) -> Path:
        rel = _clean(path)
        return self._root / rel if rel else self._root

    def upload_dir(self, local_dir: Path, dest: str) -> None:
        target = self._path(dest)
        files = _local_files(Path(local_dir))
        if target.exists() and target.samefile(local_dir):
            return  # already in place: the run directory is its own staging directory
        with self._errors("upload to", dest):
            for path, rel in files:
                _copy_file_atomic(path, target / rel)

    def download_dir(self, src: str, local_dir: Path) -> None:
        source = self._path(src)
        if not source.is_dir() or not any(p.is_file() for p in source.rglob("*")):
            raise StorageError(f"nothing to download at {self.url(src)}")
        with self._errors("download from", src):
            for path, rel in _local_files(source):
                _copy_file_atomic(path, Path(local_dir) / rel)

    def write_text(self, dest: str, text: str) -> None:
        path = self._path(dest)
        with self._errors("write", dest):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = _tmp_sibling(path)
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
        if not _clean(path):
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


# ----------------------------------------------------------------------------- S3


class S3Store:
    """An S3 bucket prefix, or one on an S3-compatible store (R2, MinIO, ...).

    The endpoint comes from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (botocore
    reads them), the region from ``AWS_REGION``/``AWS_DEFAULT_REGION``, credentials from
    boto3's chain. Retries are botocore's "standard" mode, 5 attempts, unless
    ``AWS_RETRY_MODE``/``AWS_MAX_ATTEMPTS`` say otherwise. Files above
    ``multipart_threshold`` go up in parts; up to ``max_workers`` requests run at once.
    """

    def __init__(
        self,
        root: str,
        *,
        multipart_threshold: int = 64 * MiB,
        multipart_chunksize: int = 64 * MiB,
        max_workers: int = 8,
    ) -> None:
        _, self.bucket, self.prefix = _split_bucket_url(root)
        self.root = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        try:
            import boto3
            from botocore.config import Config
            from s3transfer.manager import TransferConfig
        except ImportError:
            raise _missing_extra(root, "boto3", "aws") from None
        retries: dict[str, Any] = {}
        if "AWS_RETRY_MODE" not in os.environ:
            retries["mode"] = "standard"
        if "AWS_MAX_ATTEMPTS" not in os.environ:
            retries["total_max_attempts"] = 5
        config = Config(retries=retries, max_pool_connections=max(10, 2 * max_workers))
        self._client = boto3.session.Session().client("s3", config=config)
        self._transfer_config = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_request_concurrency=max_workers,
        )
        self._max_workers = max_workers

    def url(self, path: str = "") -> str:
        rel = _clean(path)
        return f"{self.root}/{rel}" if rel else self.root

    def _key(self, path: str) -> str:
        return "/".join(p for p in (self.prefix, _clean(path)) if p)

    def _dir_prefix(self, path: str) -> str:
        key = self._key(path)
        return f"{key}/" if key else ""

    def _keys_under(self, path: str) -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._dir_prefix(path)):
            for obj in page.get("Contents", []):
                yield obj["Key"]

    def upload_dir(self, local_dir: Path, dest: str) -> None:
        from s3transfer.manager import TransferManager

        files = _local_files(Path(local_dir))
        base = self._dir_prefix(dest)
        with (
            self._errors("upload to", dest),
            TransferManager(self._client, self._transfer_config) as manager,
        ):
            futures = [manager.upload(str(path), self.bucket, base + rel) for path, rel in files]
            for future in futures:
                future.result()

    def download_dir(self, src: str, local_dir: Path) -> None:
        from s3transfer.manager import TransferManager

        base = self._dir_prefix(src)
        with self._errors("download from", src):
            keys = [k for k in self._keys_under(src) if not k.endswith("/")]
            if not keys:
                raise StorageError(f"nothing to download at {self.url(src)}")
            with TransferManager(self._client, self._transfer_config) as manager:
                futures = []
                for key in keys:
                    target = Path(local_dir) / _clean(key[len(base) :])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    futures.append(manager.download(self.bucket, key, str(target)))
                for future in futures:
                    future.result()

    def write_text(self, dest: str, text: str) -> None:
        with self._errors("write", dest):
            self._client.put_object(Bucket=self.bucket, Key=self._key(dest), Body=text.encode())

    def read_text(self, src: str) -> str | None:
        from botocore.exceptions import ClientError

        with self._errors("read", src):
            try:
                body = self._client.get_object(Bucket=self.bucket, Key=self._key(src))["Body"]
            except ClientError as e:
                if _s3_code(e) in ("NoSuchKey", "404"):
                    return None
                raise
            return body.read().decode()

    def exists(self, path: str) -> bool:
        from botocore.exceptions import ClientError

        with self._errors("check", path):
            key = self._key(path)
            if key:
                try:
                    self._client.head_object(Bucket=self.bucket, Key=key)
                    return True
                except ClientError as e:
                    if _s3_code(e) not in ("404", "NoSuchKey", "NotFound"):
                        raise
            # Not an object: a "directory" if anything is below it. A missing bucket
            # answers HEAD with a bare 404, so this also tells the two apart.
            page = self._client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._dir_prefix(path), MaxKeys=1
            )
            return bool(page.get("Contents"))

    def list_dirs(self, prefix: str = "") -> list[str]:
        base = self._dir_prefix(prefix)
        names = []
        with self._errors("list", prefix):
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base, Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    names.append(common["Prefix"][len(base) :].rstrip("/"))
        return sorted(n for n in names if n)

    def delete_dir(self, path: str) -> None:
        if not _clean(path):
            raise StorageError(f"refusing to delete the whole store {self.url()}")
        with self._errors("delete", path):
            keys = list(self._keys_under(path))
            for start in range(0, len(keys), 1000):  # DeleteObjects takes 1000 keys at most
                batch = [{"Key": k} for k in keys[start : start + 1000]]
                response = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
                if response.get("Errors"):
                    first = response["Errors"][0]
                    raise StorageError(
                        f"cannot delete {self.url(path)}: {len(response['Errors'])} objects"
                        f" failed, first {first.get('Key')}: {first.get('Code')}"
                        f" {first.get('Message', '')}"
                    )

    @contextmanager
    def _errors(self, action: str, path: str) -> Iterator[None]:
        import boto3.exceptions
        import botocore.exceptions
        import s3transfer.exceptions

        try:
            yield
        except StorageError:
            raise
        except (
            botocore.exceptions.BotoCoreError,
            botocore.exceptions.ClientError,
            boto3.exceptions.Boto3Error,
            s3transfer.exceptions.RetriesExceededError,
            s3transfer.exceptions.S3UploadFailedError,
            s3transfer.exceptions.S3DownloadFailedError,
            OSError,
        ) as e:
            raise self._error(action, path, e) from None

    def _error(self, action: str, path: str, e: Exception) -> StorageError:
        import botocore.exceptions as bx

        where = self.url(path)
        endpoint = self._client.meta.endpoint_url
        what = f"cannot {action} {where}"
        if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError)):
            return StorageError(f"{what}: no AWS credentials found; {_AWS_CREDENTIALS_HINT}")
        if isinstance(e, (bx.EndpointConnectionError, bx.ConnectTimeoutError)):
            return StorageError(
                f"{what}: cannot reach the S3 endpoint {endpoint}; check AWS_ENDPOINT_URL"
                " (or AWS_ENDPOINT_URL_S3) for an S3-compatible store, AWS_REGION, and the"
                " network"
            )
        cause = e.last_exception if hasattr(e, "last_exception") else e
        if isinstance(cause, bx.ClientError):
            code = _s3_code(cause)
            status = cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket":
                return StorageError(
                    f"{what}: bucket {self.bucket!r} does not exist at {endpoint}; check the"
                    " bucket name, AWS_REGION, and AWS_ENDPOINT_URL for an S3-compatible store"
                )
            if code in _S3_AUTH_CODES or status in (401, 403):
                return StorageError(
                    f"{what}: access denied ({code}) at {endpoint}; check that the credentials"
                    f" are valid and may use bucket {self.bucket!r} ({_AWS_CREDENTIALS_HINT})"
                )
            return StorageError(f"{what}: S3 error {code} at {endpoint}: {cause}")
        return StorageError(f"{what}: {type(e).__name__}: {e}")


_S3_AUTH_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
}


def _s3_code(e: Any) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


# ----------------------------------------------------------------------------- GCS


class GCSStore:
    """A Google Cloud Storage bucket prefix.

    Credentials are Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
    ``gcloud auth application-default login``, or the VM's service account);
    ``STORAGE_EMULATOR_HOST`` points the client at an emulator. Files above
    ``chunk_size`` go up as resumable uploads in chunks; every request is retried on
    transient errors.
    """

    def __init__(self, root: str, *, chunk_size: int = 64 * MiB, max_workers: int = 8) -> None:
        _, self.bucket_name, self.prefix = _split_bucket_url(root)
        self.root = f"gs://{self.bucket_name}/{self.prefix}".rstrip("/")
        try:
            from google.cloud import storage
        except ImportError:
            raise _missing_extra(root, "google-cloud-storage", "gcs") from None
        with self._errors("open", ""):
            self._client = storage.Client()
        self._bucket = self._client.bucket(self.bucket_name)
        self._retry = storage.retry.DEFAULT_RETRY
        self._chunk_size = chunk_size
        self._max_workers = max_workers

    def url(self, path: str = "") -> str:
        rel = _clean(path)
        return f"{self.root}/{rel}" if rel else self.root

    def _key(self, path: str) -> str:
        return "/".join(p for p in (self.prefix, _clean(path)) if p)

    def _dir_prefix(self, path: str) -> str:
        key = self._key(path)
        return f"{key}/" if key else ""

    def _blob(self, key: str) -> Any:
        return self._bucket.blob(key, chunk_size=self._chunk_size)

    def upload_dir(self, local_dir: Path, dest: str) -> None:
        files = _local_files(Path(local_dir))
        base = self._dir_prefix(dest)

        def upload(item: tuple[Path, str]) -> None:
            path, rel = item
            # Whole-file uploads are idempotent: retry them although they carry no
            # generation precondition (the client only retries conditional ones).
            self._blob(base + rel).upload_from_filename(str(path), retry=self._retry)

        with self._errors("upload to", dest):
            _run_parallel(upload, files, self._max_workers)

    def download_dir(self, src: str, local_dir: Path) -> None:
        base = self._dir_prefix(src)

        def download(blob: Any) -> None:
            target = Path(local_dir) / _clean(blob.name[len(base) :])
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = _tmp_sibling(target)
            try:
                blob.download_to_filename(str(tmp), retry=self._retry)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)

        with self._errors("download from", src):
            blobs = [
                b
                for b in self._client.list_blobs(self._bucket, prefix=base)
                if not b.name.endswith("/")
            ]
            if not blobs:
                raise StorageError(f"nothing to download at {self.url(src)}")
            _run_parallel(download, blobs, self._max_workers)

    def write_text(self, dest: str, text: str) -> None:
        with self._errors("write", dest):
            self._blob(self._key(dest)).upload_from_string(text, retry=self._retry)

    def read_text(self, src: str) -> str | None:
        from google.api_core.exceptions import NotFound

        with self._errors("read", src):
            try:
                return self._blob(self._key(src)).download_as_text(retry=self._retry)
            except NotFound:
                self._check_bucket()  # a 404 for a missing bucket looks the same
                return None

    def exists(self, path: str) -> bool:
        with self._errors("check", path):
            key = self._key(path)
            if key and self._blob(key).exists(retry=self._retry):
                return True
            # Listing 404s for a missing bucket, where blob.exists() says False.
            blobs = self._client.list_blobs(
                self._bucket, prefix=self._dir_prefix(path), max_results=1
            )
            return any(True for _ in blobs)

    def list_dirs(self, prefix: str = "") -> list[str]:
        base = self._dir_prefix(prefix)
        with self._errors("list", prefix):
            blobs = self._client.list_blobs(self._bucket, prefix=base, delimiter="/")
            for _ in blobs:  # the prefixes are collected while the pages are read
                pass
            names = [p[len(base) :].rstrip("/") for p in blobs.prefixes]
        return sorted(n for n in names if n)

    def delete_dir(self, path: str) -> None:
        from google.api_core.exceptions import NotFound

        if not _clean(path):
            raise StorageError(f"refusing to delete the whole store {self.url()}")

        def delete(blob: Any) -> None:
            with suppress(NotFound):  # deleted meanwhile
                blob.delete(retry=self._retry)

        with self._errors("delete", path):
            blobs = list(self._client.list_blobs(self._bucket, prefix=self._dir_prefix(path)))
            _run_parallel(delete, blobs, self._max_workers)

    def _check_bucket(self) -> None:
        # objects.list needs only object-level permission, unlike buckets.get.
        for _ in self._client.list_blobs(self._bucket, max_results=1):
            break

    @contextmanager
    def _errors(self, action: str, path: str) -> Iterator[None]:
        import google.api_core.exceptions as gx
        import google.auth.exceptions as ax
        import requests

        what = f"cannot {action} {self.url(path)}"
        try:
            yield
        except StorageError:
            raise
        except ax.DefaultCredentialsError:
            raise StorageError(
                f"{what}: no Google Cloud credentials found; {_GCS_CREDENTIALS_HINT}"
            ) from None
        except ax.GoogleAuthError as e:
            raise StorageError(
                f"{what}: Google Cloud credentials were rejected ({type(e).__name__});"
                f" {_GCS_CREDENTIALS_HINT}"
            ) from None
        except gx.NotFound:
            raise StorageError(
                f"{what}: bucket {self.bucket_name!r} does not exist (or the path is gone);"
                " check the bucket name in the URL"
            ) from None
        except (gx.Forbidden, gx.Unauthorized) as e:
            raise StorageError(
                f"{what}: access denied ({e.code}); check that the credentials may use bucket"
                f" {self.bucket_name!r} ({_GCS_CREDENTIALS_HINT})"
            ) from None
        except requests.exceptions.ConnectionError:
            raise StorageError(
                f"{what}: cannot reach Google Cloud Storage; check the network (and"
                " STORAGE_EMULATOR_HOST if an emulator is meant)"
            ) from None
        except (gx.GoogleAPIError, requests.exceptions.RequestException, OSError) as e:
            raise StorageError(f"{what}: {type(e).__name__}: {e}") from None


# ----------------------------------------------------------------------------- background


@dataclass
class _Upload:
    local_dir: Path
    dest: str
    on_done: Callable[[], None] | None


class BackgroundUploader:
    """Uploads directories on a background thread, in submission order.

    ``on_done`` runs on that thread after a directory is fully uploaded. A failed
    upload is logged at once and raised by the next ``wait()``, ``submit()`` or
    ``close()``; until then it still counts in ``pending()``, so ``pending() == 0``
    means every directory submitted so far is in the store.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._queue: deque[_Upload] = deque()
        self._unfinished = 0  # queued or running
        self._errors: list[StorageError] = []
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="rlctl-uploader", daemon=True)
        self._thread.start()

    def submit(self, local_dir: Path, dest: str, on_done: Callable[[], None] | None = None) -> None:
        """Queue ``local_dir`` for upload to ``dest``; returns at once."""
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise StorageError(f"cannot upload {local_dir}: it is not a directory")
        self.store.url(dest)  # a bad path fails here, in the caller
        with self._cond:
            if self._closed:
                raise RuntimeError("BackgroundUploader.submit after close()")
            self._raise_error()
            self._queue.append(_Upload(local_dir, dest, on_done))
            self._unfinished += 1
            self._cond.notify_all()

    def pending(self) -> int:
        """Uploads not finished yet, plus failed ones whose error was not raised yet."""
        with self._cond:
            return self._unfinished + len(self._errors)

    def wait(self, timeout: float | None = None) -> None:
        """Block until every submitted upload has finished; raise the first failure.

        Raises TimeoutError if uploads are still running after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._unfinished:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"{self._unfinished} checkpoint uploads to {self.store.url()} still"
                        f" running after {timeout:g}s"
                    )
                self._cond.wait(remaining)
            self._raise_error()

    def close(self) -> None:
        """Finish the queued uploads, stop the thread, raise a failure not raised yet."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            self._raise_error()

    def __enter__(self) -> BackgroundUploader:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # an error is already on its way out: do not hide it behind an upload's
            self.close()
        except StorageError as upload_error:
            log.error("%s", upload_error)

    def _raise_error(self) -> None:
        if not self._errors:
            return
        first, more = self._errors[0], len(self._errors) - 1
        self._errors.clear()
        if more:
            raise StorageError(f"{first} (and {more} more uploads failed; see the log)")
        raise first

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return  # closed and drained
                job = self._queue.popleft()
            error = self._upload(job)
            with self._cond:
                if error is not None:
                    self._errors.append(error)
                self._unfinished -= 1
                self._cond.notify_all()

    def _upload(self, job: _Upload) -> StorageError | None:
        where = f"{self.store.root}/{job.dest}"
        try:
            where = self.store.url(job.dest)
            self.store.upload_dir(job.local_dir, job.dest)
        except Exception as e:
            error = StorageError(f"background upload of {job.local_dir} to {where} failed: {e}")
            log.error("%s", error)
            return error
        if job.on_done is not None:
            try:
                job.on_done()
            except Exception as e:
                error = StorageError(
                    f"{job.local_dir} was uploaded to {where}, but its on_done callback failed:"
                    f" {type(e).__name__}: {e}"
                )
                log.error("%s", error)
                return error
        return None
