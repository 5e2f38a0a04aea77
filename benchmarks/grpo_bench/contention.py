"""What the rest of the machine did while a system ran: a step during which other
processes kept cores busy is not the system's own time."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

# A step during which the rest of the machine kept less than this many cores busy counts
# as quiet: its time is the system's own, not the neighbours'.
QUIET_OTHER_CORES = 0.25


@dataclasses.dataclass(frozen=True)
class CpuSnapshot:
    t: float  # perf_counter seconds
    machine_busy_s: float  # CPU seconds every process has used, all cores
    own_cpu_s: float  # CPU seconds the measured system has used


def machine_busy_s() -> float:
    """CPU seconds spent busy since boot, all cores (Linux ``/proc/stat``; 0 elsewhere)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, *rest = (int(x) for x in first[1:])
    steal = rest[0] if rest else 0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def snapshot(own_cpu_s: float) -> CpuSnapshot:
    return CpuSnapshot(time.perf_counter(), machine_busy_s(), own_cpu_s)


def other_cores(a: CpuSnapshot, b: CpuSnapshot) -> float | None:
    """Cores the rest of the machine kept busy between two snapshots. Well above 0, the
    system shared its cores with someone else and its times are inflated."""
    if b.t <= a.t or not b.machine_busy_s:
        return None
    foreign = (b.machine_busy_s - a.machine_busy_s) - (b.own_cpu_s - a.own_cpu_s)
    return max(0.0, foreign) / (b.t - a.t)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its live descendants (the engine's driver, Ray's
    daemons and workers, the reward worker), plus this benchmark process's own."""
    import psutil  # a dependency of accelerate, which trl brings

    total = time.process_time()
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total
