"""How long the engine took to reach its first step, milestone by milestone.

``StartupClock`` holds the seconds from the process's start to each milestone of a run's
start-up, in the order they are reached:

    imports      the driver's heavy modules (torch, transformers, the trainer) imported
    data         the tokenizer loaded, the datasets read and checked
    ray          the Ray cluster up (started here, or joined)
    workers      every worker process up (Ray spawned it, it imported its roles' modules)
    models       every rank in its process group, its roles' models loaded
    validation   the validation before the first step done (when it runs)
    first_step   the first training step started
    first_step_end   ... and done

The driver reads its data while Ray and then the workers' processes start
(``engine.runtime``), so ``data`` may come after ``ray`` or ``workers``. The first step
logs them as ``timing_s/startup/<milestone>`` and prints one line (``start-up, seconds
from the start: imports 3.1, ...``). Torch-free.

``gc_paused`` imports a process's heavy modules with Python's cyclic garbage collector
off: importing torch and transformers makes millions of objects and no garbage, and the
collector's passes over them cost about a seventh of the imports' CPU time.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator

STARTUP_PREFIX = "timing_s/startup/"


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off inside (for imports), as it was after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def process_start_time() -> float:
    """When this process started, as a ``time.time()`` value (Linux's ``/proc``), or now
    where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        started_after_boot_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - (uptime_s - started_after_boot_s)


class StartupClock:
    """Seconds from ``started`` (a ``time.time()`` value) to each milestone; the first
    time a milestone is marked counts."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.time() if started is None else started
        self.seconds: dict[str, float] = {}
        self._reported = False

    def mark(self, milestone: str, at: float | None = None) -> None:
        """``milestone`` reached now, or at ``at`` (a ``time.time()`` value: a worker's)."""
        if milestone not in self.seconds:
            self.seconds[milestone] = (time.time() if at is None else at) - self.started

    def first_step_done(self) -> dict[str, float]:
        """The first step's end marked and the milestones printed, then returned as
        metrics; on every later call, nothing."""
        if self._reported:
            return {}
        self._reported = True
        self.mark("first_step_end")
        print(self.line(), flush=True)
        return {f"{STARTUP_PREFIX}{name}": s for name, s in self.seconds.items()}

    def line(self) -> str:
        parts = ", ".join(f"{name} {s:.1f}" for name, s in self.seconds.items())
        return f"start-up, seconds from the start: {parts}"
