"""S3 and S3-compatible buckets (R2, MinIO) as a store, through boto3 (``rlctl[aws]``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.storage.base import (
    AWS_CREDENTIALS_HINT,
    BucketPaths,
    MiB,
    StorageError,
    clean_path,
    local_files,
    missing_extra,
    split_bucket_url,
)

# ----------------------------------------------------------------------------- S3


class S3Store(BucketPaths):
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
        _, self.bucket, self.prefix = split_bucket_url(root)
        self.root = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        try:
            import boto3
            from botocore.config import Config
            from s3transfer.manager import TransferConfig
        except ImportError:
            raise missing_extra(root, "boto3", "aws") from None
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

    def _keys_under(self, path: str) -> Iterator[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._dir_prefix(path)):
            for obj in page.get("Contents", []):
                yield obj["Key"]

    def upload_dir(self, local_dir: Path, dest: str) -> None:
        from s3transfer.manager import TransferManager

        files = local_files(Path(local_dir))
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
                    target = Path(local_dir) / clean_path(key[len(base) :])
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
        if not clean_path(path):
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
            return StorageError(f"{what}: no AWS credentials found; {AWS_CREDENTIALS_HINT}")
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
                    f" are valid and may use bucket {self.bucket!r} ({AWS_CREDENTIALS_HINT})"
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
