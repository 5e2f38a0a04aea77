"""How many cores the rest of the machine kept busy while something was measured: a
figure taken while neighbours ran is not the code's own."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from grpo_bench.contention import machine_busy_s


def own_cpu_s() -> float:
    """CPU seconds of this process (all threads) and of its children already reaped
    (the sandbox's processes are, by the time their call returns)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass
class Span:
    """The wall time and the other processes' cores between ``Span()`` and ``end()``."""

    start: float = 0.0
    busy: float = 0.0
    own: float = 0.0
    wall_s: float = 0.0
    other_cores: float | None = None

    def __post_init__(self) -> None:
        self.start, self.busy, self.own = time.perf_counter(), machine_busy_s(), own_cpu_s()

    def end(self) -> Span:
        self.wall_s = time.perf_counter() - self.start
        foreign = (machine_busy_s() - self.busy) - (own_cpu_s() - self.own)
        # /proc/stat counts in clock ticks (10 ms): too coarse for spans this short
        self.other_cores = max(0.0, foreign) / self.wall_s if self.wall_s > 0.05 else None
        return self
