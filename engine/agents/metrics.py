"""What a step's multi-turn trajectories did, as metrics (``agent/...``)."""

from __future__ import annotations

from collections.abc import Sequence


def agent_metrics(
    stats: Sequence[dict[str, float]], masks: Sequence[Sequence[int]]
) -> dict[str, float]:
    """Means per trajectory (turns, tool calls), totals of what went wrong, and the
    model's tokens per turn; ``masks``: 1 on the model's tokens."""
    if not stats:
        return {}
    n = len(stats)
    turns = sum(s["turns"] for s in stats)
    calls = sum(s["tool_calls"] for s in stats)
    model_tokens = sum(sum(m) for m in masks)
    return {
        "agent/turns_mean": turns / n,
        "agent/turns_max": max(s["turns"] for s in stats),
        "agent/tool_calls_mean": calls / n,
        "agent/tool_call_rate": sum(s["tool_calls"] > 0 for s in stats) / n,
        "agent/tool_errors": sum(s["tool_errors"] for s in stats),
        "agent/tool_timeouts": sum(s["tool_timeouts"] for s in stats),
        "agent/tool_latency_s_mean": sum(s["tool_latency_s"] for s in stats) / calls
        if calls
        else 0.0,
        "agent/response_tokens_per_turn": model_tokens / turns if turns else 0.0,
        # answers an interaction sent back for another try, per trajectory
        "agent/feedback_turns_mean": sum(s.get("feedback_turns", 0.0) for s in stats) / n,
    }
