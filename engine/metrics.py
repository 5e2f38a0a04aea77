"""Step metrics with the names verl users know, stage timing, and where they go."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import torch

from engine.algo.masked import masked_mean


class StageTimer:
    """``with timer("gen"): ...`` records timing_s/gen (summed if a stage repeats)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def batch_metrics(
    *,
    scores_B: torch.Tensor,
    token_rewards_BR: torch.Tensor,
    advantages_BR: torch.Tensor,
    returns_BR: torch.Tensor,
    response_mask_BR: torch.Tensor,
    prompt_lengths_B: torch.Tensor,
    max_response_length: int,
    values_BR: torch.Tensor | None = None,
) -> dict[str, float]:
    mask = response_mask_BR
    valid = mask.bool()
    response_lengths = mask.sum(-1)
    out = _stats("critic/score", scores_B)
    out |= _stats("critic/rewards", (token_rewards_BR * mask).sum(-1))
    if valid.any():
        out |= _stats("critic/advantages", advantages_BR[valid])
        out |= _stats("critic/returns", returns_BR[valid])
        if values_BR is not None:
            out |= _stats("critic/values", values_BR[valid])
            residual = returns_BR - values_BR
            var_returns = torch.var(returns_BR[valid], unbiased=False)
            out["critic/vf_explained_var"] = float(
                1.0 - torch.var(residual[valid], unbiased=False) / (var_returns + 1e-8)
            )
    out |= _stats("response_length", response_lengths)
    out["response_length/clip_ratio"] = float(
        (response_lengths >= max_response_length).float().mean()
    )
    out |= _stats("prompt_length", prompt_lengths_B)
    out["critic/advantages/token_mean"] = float(masked_mean(advantages_BR, mask))
    return out


def throughput_metrics(num_tokens: int, step_seconds: float, num_devices: int) -> dict[str, float]:
    return {
        "perf/total_num_tokens": float(num_tokens),
        "perf/time_per_step": step_seconds,
        "perf/throughput": num_tokens / max(step_seconds, 1e-9) / num_devices,
    }


def reduce_rank_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Average each metric over the ranks that reported it."""
    keys = {k for m in per_rank for k in m}
    return {k: sum(m[k] for m in per_rank if k in m) / sum(k in m for m in per_rank) for k in keys}


# The headline of the console line: a person watching a run looks for these.
CONSOLE_KEYS = (
    ("critic/score/mean", "score"),
    ("val/score/mean", "val"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/entropy", "entropy"),
    ("actor/ppo_kl", "ppo_kl"),
    ("actor/grad_norm", "grad_norm"),
    ("critic/vf_loss", "vf_loss"),
    ("response_length/mean", "resp_len"),
    ("timing_s/step", "step_s"),
    ("perf/throughput", "tok/s/dev"),
)


def console_line(step: int, total: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step}/{total}"]
    for key, label in CONSOLE_KEYS:
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.4g}")
    return " | ".join(parts)


class Tracker:
    """Sends each step's metrics to the configured loggers.

    The JSONL file in the run directory is always written: it is the record that
    ``rlctl`` and resumed runs read back.
    """

    def __init__(self, loggers: list[str], run_dir: str | Path, stream: TextIO | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.console = "console" in loggers
        self.stream = stream or sys.stdout
        self.jsonl = (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8")

    def log(self, step: int, total: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _jsonable(v) for k, v in sorted(metrics.items())}}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.console:
            print(console_line(step, total, metrics), file=self.stream, flush=True)

    def close(self) -> None:
        self.jsonl.close()


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item()
    return value
