"""Summaries, ratios and the printed report; across repeated runs, the spread of
each ratio."""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
from pathlib import Path
from typing import Any

from .config import Setup, StepRecord
from .contention import QUIET_OTHER_CORES

# (a, b): a's seconds per step over b's, for each pair both sides of which ran.
RATIO_PAIRS = (
    ("engine-vllm-1x2", "trl-vllm"),
    ("engine-vllm-2x1", "trl-vllm"),
    ("engine-vllm-1x2", "trl-vllm-nosync"),
    ("engine-vllm-2x1", "trl-vllm-nosync"),
    ("engine-1x2", "trl"),
    ("engine-2x1", "trl"),
    ("engine-vllm-1x2", "engine-1x2"),
    ("trl-vllm", "trl"),
    ("engine-1x2", "floor"),
    ("engine-2x1", "floor"),
    ("engine-vllm-1x2", "floor"),
    ("trl", "floor"),
)
RATIO_KEYS = (
    ("median", "step_s_median"),
    ("min", "step_s_min"),
    ("quiet median", "step_s_quiet_median"),
)


def machine(vllm_path: str | None = None) -> dict[str, Any]:
    """The machine and the versions that ran: for vLLM, the build on ``vllm_path``
    when one is given (the vLLM systems run that one)."""
    from importlib import metadata

    import torch
    import transformers

    versions: dict[str, str | None] = {}
    for name in ("trl", "vllm"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    if vllm_path:
        found = list(metadata.distributions(path=[vllm_path]))
        versions["vllm"] = ", ".join(f"{d.metadata['Name']} {d.version}" for d in found)
    cpu_model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads_default": torch.get_num_threads(),
        "transformers": transformers.__version__,
        **versions,
        "platform": platform.platform(),
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(name: str, result: dict[str, Any]) -> dict[str, Any]:
    steps: list[StepRecord] = result["steps"]
    seconds = [s.seconds for s in steps]
    stage_names = list(dict.fromkeys(k for s in steps for k in s.stages))
    stages = {k: statistics.median(s.stages.get(k, 0.0) for s in steps) for k in stage_names}
    median_s = statistics.median(seconds)
    stages["other"] = max(0.0, median_s - sum(stages.values()))
    quiet = [
        s.seconds for s in steps if s.other_cores is not None and s.other_cores < QUIET_OTHER_CORES
    ]
    return {
        "system": name,
        "step_s_median": median_s,
        "step_s_min": min(seconds),
        "step_s_quiet_median": _median(quiet),
        "quiet_steps": len(quiet),
        "steps": len(steps),
        "wall_s_median": _median([s.wall_s for s in steps if s.wall_s is not None]),
        "tokens_per_step": statistics.median(s.tokens for s in steps),
        "tokens_per_s": statistics.median(s.tokens / s.seconds for s in steps),
        "response_length_mean": statistics.fmean(s.response_length for s in steps),
        "other_cores_median": _median([s.other_cores for s in steps if s.other_cores is not None]),
        "stages_median_s": stages,
        "process_s": result["process_s"],
        "per_step": [dataclasses.asdict(s) for s in steps],
    }


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> float | None:
    if a is None or b is None or a.get(key) is None or b.get(key) is None:
        return None
    return a[key] / b[key]


def all_ratios(summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for a, b in RATIO_PAIRS:
        values = {
            label: ratio(summaries.get(a), summaries.get(b), key) for label, key in RATIO_KEYS
        }
        values = {k: v for k, v in values.items() if v is not None}
        if values:
            out[f"{a}/{b}"] = values
    return out


def ratio_spread(runs: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """For each pair, its median-step ratio in every run (the runs interleave the
    systems, so each run's ratio compares neighbours in time) and their spread."""
    per_run = [all_ratios(summaries) for summaries in runs]
    out: dict[str, dict[str, Any]] = {}
    for pair in dict.fromkeys(p for r in per_run for p in r):
        values = [r[pair]["median"] for r in per_run if pair in r]
        out[pair] = {
            "runs": values,
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }
    return out


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def header(info: dict[str, Any], setup: Setup) -> list[str]:
    return [
        f"machine: {info['cpu_model']}, {info['cores']} cores ({info['usable_cores']} usable), "
        f"{info['memory_gb']} GB; python {info['python']}, torch {info['torch']}, "
        f"transformers {info['transformers']}, trl {info['trl']}, vllm {info['vllm']}"
        + (f" (systems with vLLM: {setup.vllm_path})" if setup.vllm_path else ""),
        f"config: {setup.prompts} prompts x {setup.n} samples = {setup.samples} completions, "
        f"<= {setup.max_new_tokens} new tokens, T={setup.temperature}, lr {setup.lr}, no KL, "
        f"fp32 CPU, gradient checkpointing {'on' if setup.gradient_checkpointing else 'off'} "
        f"(engine, TRL); {setup.warmup} warmup + {setup.steps} measured steps",
    ]


def format_run(summaries: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"{'system':<15} {'median s':>8} {'min s':>6} {'quiet med s (n)':>15} {'wall s':>6} "
        f"{'tok/step':>8} {'tok/s':>6} {'resp len':>8} {'other cores':>11}",
    ]
    for name, s in summaries.items():
        quiet = f"{_fmt(s['step_s_quiet_median'])} ({s['quiet_steps']}/{s['steps']})"
        lines.append(
            f"{name:<15} {s['step_s_median']:>8.3f} {s['step_s_min']:>6.3f} {quiet:>15} "
            f"{_fmt(s['wall_s_median']):>6} {s['tokens_per_step']:>8.0f} {s['tokens_per_s']:>6.0f} "
            f"{s['response_length_mean']:>8.1f} {_fmt(s['other_cores_median'], '.2f'):>11}"
        )
    lines += ["", "ratios of s/step (below 1: the first is faster):"]
    for pair, values in all_ratios(summaries).items():
        parts = ", ".join(f"{label} {v:.2f}x" for label, v in values.items())
        lines.append(f"  {pair:<27} {parts}")
    lines += ["", "where the time goes (median s per stage; other = step - stages):"]
    for name, s in summaries.items():
        stages = ", ".join(f"{k} {v:.3f}" for k, v in s["stages_median_s"].items())
        lines.append(f"  {name:<15} {stages}")
    return "\n".join(lines)


def format_spread(runs: list[dict[str, dict[str, Any]]]) -> str:
    lines = [f"across {len(runs)} runs, ratio of median s/step: median (min-max) [each run]"]
    for pair, s in ratio_spread(runs).items():
        each = " ".join(f"{v:.2f}" for v in s["runs"])
        lines.append(f"  {pair:<27} {s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f}) [{each}]")
    return "\n".join(lines)


CONTENTION_NOTE = (
    "other cores: CPU cores the rest of the machine kept busy during the steps; quiet "
    f"steps are those under {QUIET_OTHER_CORES}."
)
