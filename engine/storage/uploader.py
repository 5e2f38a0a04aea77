"""Uploads on a background thread, in submission order, while training goes on."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.storage.base import StorageError, Store

log = logging.getLogger(__name__)

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
