"""Google Cloud Storage buckets as a store (``rlctl[gcs]``: google-cloud-storage)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from engine.storage.base import (
    GCS_CREDENTIALS_HINT,
    BucketPaths,
    MiB,
    StorageError,
    clean_path,
    local_files,
    missing_extra,
    run_parallel,
    split_bucket_url,
    tmp_sibling,
)

# ----------------------------------------------------------------------------- GCS


class GCSStore(BucketPaths):
    """A Google Cloud Storage bucket prefix.

    Credentials are Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
    ``gcloud auth application-default login``, or the VM's service account);
    ``STORAGE_EMULATOR_HOST`` points the client at an emulator. Files above
    ``chunk_size`` go up as resumable uploads in chunks; every request is retried on
    transient errors.
    """

    def __init__(self, root: str, *, chunk_size: int = 64 * MiB, max_workers: int = 8) -> None:
        _, self.bucket_name, self.prefix = split_bucket_url(root)
        self.root = f"gs://{self.bucket_name}/{self.prefix}".rstrip("/")
        try:
            from google.cloud import storage
        except ImportError:
            raise missing_extra(root, "google-cloud-storage", "gcs") from None
        with self._errors("open", ""):
            self._client = storage.Client()
        self._bucket = self._client.bucket(self.bucket_name)
        self._retry = storage.retry.DEFAULT_RETRY
        self._chunk_size = chunk_size
        self._max_workers = max_workers

    def _blob(self, key: str) -> Any:
        return self._bucket.blob(key, chunk_size=self._chunk_size)

    def upload_dir(self, local_dir: Path, dest: str) -> None:
        files = local_files(Path(local_dir))
        base = self._dir_prefix(dest)

        def upload(item: tuple[Path, str]) -> None:
            path, rel = item
            # Whole-file uploads are idempotent: retry them although they carry no
            # generation precondition (the client only retries conditional ones).
            self._blob(base + rel).upload_from_filename(str(path), retry=self._retry)

        with self._errors("upload to", dest):
            run_parallel(upload, files, self._max_workers)

    def download_dir(self, src: str, local_dir: Path) -> None:
        base = self._dir_prefix(src)

        def download(blob: Any) -> None:
            target = Path(local_dir) / clean_path(blob.name[len(base) :])
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = tmp_sibling(target)
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
            run_parallel(download, blobs, self._max_workers)

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

        if not clean_path(path):
            raise StorageError(f"refusing to delete the whole store {self.url()}")

        def delete(blob: Any) -> None:
            with suppress(NotFound):  # deleted meanwhile
                blob.delete(retry=self._retry)

        with self._errors("delete", path):
            blobs = list(self._client.list_blobs(self._bucket, prefix=self._dir_prefix(path)))
            run_parallel(delete, blobs, self._max_workers)

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
                f"{what}: no Google Cloud credentials found; {GCS_CREDENTIALS_HINT}"
            ) from None
        except ax.GoogleAuthError as e:
            raise StorageError(
                f"{what}: Google Cloud credentials were rejected ({type(e).__name__});"
                f" {GCS_CREDENTIALS_HINT}"
            ) from None
        except gx.NotFound:
            raise StorageError(
                f"{what}: bucket {self.bucket_name!r} does not exist (or the path is gone);"
                " check the bucket name in the URL"
            ) from None
        except (gx.Forbidden, gx.Unauthorized) as e:
            raise StorageError(
                f"{what}: access denied ({e.code}); check that the credentials may use bucket"
                f" {self.bucket_name!r} ({GCS_CREDENTIALS_HINT})"
            ) from None
        except requests.exceptions.ConnectionError:
            raise StorageError(
                f"{what}: cannot reach Google Cloud Storage; check the network (and"
                " STORAGE_EMULATOR_HOST if an emulator is meant)"
            ) from None
        except (gx.GoogleAPIError, requests.exceptions.RequestException, OSError) as e:
            raise StorageError(f"{what}: {type(e).__name__}: {e}") from None
