"""Peak memory per role and phase, measured where the work runs, logged every step beside
the plan's figures (``rlctl status``), and said aloud when a node comes near its limit.

Each worker host times its calls as phases (``actor.update``, ``rollout.generate``,
``ref.log_probs``...). On an accelerator a phase's peak is the allocator's
(``max_memory_allocated``, reset as the phase starts): what PyTorch held at most, not
what another library (vLLM's KV cache, NCCL) took beside it. On CPU it is the process's
peak resident memory so far (``ru_maxrss``: the kernel keeps no per-phase peak), and the
limit is the node's RAM shared by every worker on it, so the node's workers' peaks add up.
"""

from __future__ import annotations

import contextlib
import resource
import socket
from collections.abc import Iterator
from typing import Any

GIB = 2**30
# A phase whose peak reaches this fraction of its limit is reported once, before an OOM.
NEAR_LIMIT = 0.9


class PhasePeaks:
    """A worker host's peaks since the controller last took them."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.peaks: dict[str, int] = {}

    def _accelerator(self) -> Any:
        import torch

        module = getattr(torch, self.device_type, None)
        return module if self.device_type != "cpu" and module is not None else None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        acc = self._accelerator()
        if acc is not None and acc.is_available():
            acc.reset_peak_memory_stats()
        try:
            yield
        finally:
            if acc is not None and acc.is_available():
                peak = int(acc.max_memory_allocated())
            else:  # Linux reports kilobytes
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.peaks[name] = max(peak, self.peaks.get(name, 0))

    def take(self) -> dict[str, Any]:
        """The peaks since the last take, this process's limit and its node."""
        peaks, self.peaks = self.peaks, {}
        return {
            "peaks": peaks,
            "limit": self._limit(),
            "node": socket.gethostname(),
            "device": self.device_type,
        }

    def _limit(self) -> int:
        acc = self._accelerator()
        if acc is not None and acc.is_available():
            return int(acc.get_device_properties(acc.current_device()).total_memory)
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
        return 0


def peak_metrics(reports: list[dict[str, Any]]) -> dict[str, float]:
    """``memory/peak_gib/<phase>``: the largest over the workers (on CPU, over the nodes of
    the node's workers' sum), and ``memory/limit_gib``: a device's memory (on CPU, a
    node's RAM)."""
    if not reports:
        return {}
    per_phase: dict[str, float] = {}
    if reports[0]["device"] == "cpu":
        by_node: dict[str, dict[str, int]] = {}
        for r in reports:
            node = by_node.setdefault(r["node"], {})
            for phase, peak in r["peaks"].items():
                node[phase] = node.get(phase, 0) + peak
        for node in by_node.values():
            for phase, total in node.items():
                per_phase[phase] = max(per_phase.get(phase, 0.0), total / GIB)
    else:
        for r in reports:
            for phase, peak in r["peaks"].items():
                per_phase[phase] = max(per_phase.get(phase, 0.0), peak / GIB)
    out = {f"memory/peak_gib/{phase}": round(v, 3) for phase, v in sorted(per_phase.items())}
    out["memory/limit_gib"] = round(min(r["limit"] for r in reports) / GIB, 3)
    return out


def near_limit(metrics: dict[str, float], told: set[str]) -> list[str]:
    """One line for each phase that reached ``NEAR_LIMIT`` of the limit and was not told
    of before (``told`` is updated)."""
    limit = metrics.get("memory/limit_gib", 0.0)
    lines = []
    for key, peak in metrics.items():
        if not key.startswith("memory/peak_gib/") or limit <= 0 or peak < NEAR_LIMIT * limit:
            continue
        phase = key.removeprefix("memory/peak_gib/")
        if phase in told:
            continue
        told.add(phase)
        lines.append(
            f"memory: {phase} peaked at {peak:.1f} GiB of {limit:.1f} GiB"
            f" ({peak / limit:.0%}): close to running out; lower the micro-batch or token"
            " budget of that role, offload (fsdp_config.param_offload/optimizer_offload), or"
            " lower rollout.gpu_memory_utilization (rlctl plan shows the estimate)"
        )
    return lines
