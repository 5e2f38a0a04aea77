"""Peak memory against the plan, per role: ``rlctl status JOB``'s memory lines.

The engine logs each step's peak per phase (``memory/peak_gib/<role>.<method>``) and the
device's limit (``memory/limit_gib``) in metrics.jsonl (engine/memory_peaks.py); the plan
the job was launched with (the job store's plan JSON) holds the planner's peak per device
for training and for generation (rlctl/planner/model.py:MemoryEstimate). A role's peak
is its largest phase over the steps read; it is flagged when it reaches the engine's
near-limit margin of the device (NEAR_LIMIT, the same the engine warns at) or goes above
the plan's figure for it.

On CPU the engine measures the process's resident memory (the interpreter and its
libraries included) summed over a node's workers, against the node's RAM: its plan
figures count tensors only, so there only the limit is flagged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

PEAK_PREFIX = "memory/peak_gib/"
LIMIT_KEY = "memory/limit_gib"
# The plan's figure each role's peak is held against (MemoryEstimate's fields): the
# roles that train or score with the training state share training's peak; a reward
# model that sleeps between its turns has a figure of its own (judge_peak_gib, 0 when
# it is held through training: then training's figure counts it).
PLAN_FIGURES = {
    "actor": ("train_peak_gib",),
    "ref": ("train_peak_gib",),
    "critic": ("train_peak_gib",),
    "sft": ("train_peak_gib",),
    "rollout": ("rollout_peak_gib",),
    "rm": ("judge_peak_gib", "train_peak_gib"),
}


@dataclasses.dataclass(frozen=True)
class RoleMemory:
    role: str
    peak_gib: float  # the largest phase of the role over the steps read
    phase: str  # which of its phases
    plan_gib: float | None  # the plan's figure for it; None: the plan has none
    near_limit: bool
    above_plan: bool

    def flags(self, limit_gib: float) -> str:
        said = []
        if self.near_limit:
            said.append(f"NEAR THE LIMIT ({self.peak_gib / limit_gib:.0%})")
        if self.above_plan and self.plan_gib is not None:
            said.append(f"ABOVE THE PLAN (+{self.peak_gib - self.plan_gib:.2f} GiB)")
        return "; ".join(said) or "ok"


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    limit_gib: float
    cpu: bool  # the process's resident memory against the node's RAM
    roles: tuple[RoleMemory, ...]

    def lines(self) -> list[str]:
        what = "a node's RAM, its workers together" if self.cpu else "a device's memory"
        lines = [f"memory:   peak against the plan, of {self.limit_gib:.1f} GiB ({what})"]
        for r in self.roles:
            plan = "no plan figure" if r.plan_gib is None else f"plan {r.plan_gib:.2f} GiB"
            lines.append(
                f"  {r.role:<8} {r.peak_gib:7.2f} GiB ({r.phase})  {plan}  {r.flags(self.limit_gib)}"
            )
        if self.cpu:
            lines.append("  (CPU: resident memory, interpreter included; the plan counts tensors)")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "limit_gib": self.limit_gib,
            "cpu": self.cpu,
            "roles": [dataclasses.asdict(r) for r in self.roles],
        }


def memory_report(
    records: Sequence[Mapping[str, Any]], plan: Mapping[str, Any], near: float
) -> MemoryReport | None:
    """The roles' peaks in ``records`` (metrics.jsonl's) against ``plan`` (the plan's
    JSON), ``near`` the fraction of the limit flagged; None when no step logged memory."""
    peaks: dict[str, tuple[float, str]] = {}
    limits = []
    for record in records:
        for key, value in record.items():
            number = _number(value)
            if number is None:
                continue
            if key == LIMIT_KEY:
                limits.append(number)
            elif key.startswith(PEAK_PREFIX):
                phase = key.removeprefix(PEAK_PREFIX)
                role = phase.partition(".")[0]
                if number > peaks.get(role, (-1.0, ""))[0]:
                    peaks[role] = (number, phase)
    if not peaks or not limits:
        return None
    limit = min(limits)
    estimate = plan.get("memory") if isinstance(plan.get("memory"), dict) else {}
    cpu = plan.get("accelerator") is None
    roles = []
    for role in sorted(peaks):
        peak, phase = peaks[role]
        planned = _planned(role, estimate)
        roles.append(
            RoleMemory(
                role=role,
                peak_gib=peak,
                phase=phase,
                plan_gib=planned,
                near_limit=limit > 0 and peak >= near * limit,
                above_plan=not cpu and planned is not None and peak > planned,
            )
        )
    return MemoryReport(limit_gib=limit, cpu=cpu, roles=tuple(roles))


def _planned(role: str, estimate: Mapping[str, Any]) -> float | None:
    """The first of the role's plan figures that the plan gives (a zero is none)."""
    for name in PLAN_FIGURES.get(role, ()):
        value = _number(estimate.get(name))
        if value:
            return value
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
