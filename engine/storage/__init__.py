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

from engine.storage.base import REMOTE_SCHEMES, StorageError, Store
from engine.storage.gcs import GCSStore
from engine.storage.local import LocalStore
from engine.storage.s3 import S3Store
from engine.storage.uploader import BackgroundUploader


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


__all__ = [
    "REMOTE_SCHEMES",
    "BackgroundUploader",
    "GCSStore",
    "LocalStore",
    "S3Store",
    "StorageError",
    "Store",
    "is_remote",
    "open_store",
]
