"""Reading a sandboxed run's output with bounded memory, sync and async.

The code may print without end: each stream keeps its first ``cap`` bytes (and a short
tail, to tell a MemoryError), and the rest is read and dropped, so the code never blocks
on a full pipe and the parent never holds more than the cap."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import signal
import subprocess
import time

_CHUNK = 1 << 16
_TAIL = 4096


class Capture:
    """The first ``cap`` bytes of a stream, the last few KiB, and how much was dropped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))
        self.tail += chunk[-_TAIL:]
        del self.tail[:-_TAIL]

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        return self.head.decode("utf-8", errors="replace")


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def drain_sync(
    proc: subprocess.Popen, out_fd: int, err_fd: int, out: Capture, err: Capture, deadline: float
) -> bool:
    """Read both streams to their end and wait for ``proc``; past ``deadline`` kill its
    process group. True when the deadline killed it."""
    killed = False
    with selectors.DefaultSelector() as sel:
        for fd, capture in ((out_fd, out), (err_fd, err)):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ, capture)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # Whoever still holds the pipes is past the wall clock.
                if proc.poll() is None:
                    kill_group(proc.pid)
                killed = True
                break
            for key, _ in sel.select(min(remaining, 1.0)):
                try:
                    chunk = os.read(key.fd, _CHUNK)
                except BlockingIOError:
                    continue
                if chunk:
                    key.data.feed(chunk)
                else:
                    sel.unregister(key.fd)
    remaining = max(deadline - time.monotonic(), 0.1)
    try:
        proc.wait(remaining)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.wait()
        killed = True
    return killed


async def drain_async(
    proc: asyncio.subprocess.Process,
    stdout: asyncio.StreamReader,
    stderr: asyncio.StreamReader,
    out: Capture,
    err: Capture,
    deadline: float,
) -> bool:
    """``drain_sync`` for an asyncio subprocess."""

    async def pump(reader: asyncio.StreamReader, capture: Capture) -> None:
        while chunk := await reader.read(_CHUNK):
            capture.feed(chunk)

    everything = asyncio.gather(pump(stdout, out), pump(stderr, err), proc.wait())
    try:
        await asyncio.wait_for(everything, timeout=max(deadline - time.monotonic(), 0.1))
        return False
    except asyncio.TimeoutError:
        if proc.returncode is None:
            kill_group(proc.pid)
        await proc.wait()
        return True


def read_status(fd: int) -> dict:
    """Merge the JSON lines the sandbox's init wrote (it has exited, or is being
    killed: read what is there, without blocking)."""
    os.set_blocking(fd, False)
    data = bytearray()
    while len(data) < 1 << 20:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    status: dict = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            status.update(message)
    return status
