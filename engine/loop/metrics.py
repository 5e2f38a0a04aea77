"""Step metrics with the names verl users know, and stage timing (``engine.tracking``
sends them to the loggers)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

from engine.algo.masked import masked_mean

# policy versions between the sampler and the update (async_training's modes)
STALENESS = "training/staleness"
# Metrics that measure the machine, not the run (times, throughput, memory peaks): two
# runs of the same seed agree on every other metric.
MACHINE_METRICS = ("timing_s/", "perf/", "memory/")


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
