"""Part (a): tool calls per second through ``engine.agents.tools.execute``.

Each batch is one ``asyncio.run(execute(calls, tools, ...))``, as an agent loop's
``episode.call_tools`` runs one turn's calls: ``concurrency`` calls at once, batch after
batch, until at least ``calls`` calls and ``MIN_S`` seconds have passed. Concurrency 1 is
the serial figure. Every result must be ``ok``: a broken sandbox would otherwise look
fast. The floor is ``asyncio.run`` of a coroutine that does nothing: what every turn with
calls pays.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

from agent_bench.cpu import Span
from engine.agents.tools import FunctionTool, ToolCall, build_tools, execute, parse_tool_specs

TIMEOUT_S = 60.0  # far above any call here: a timeout is a failure, not a figure
MAX_OUTPUT_CHARS = 2000
MIN_S = 0.2  # each measurement's least duration
CODE = "print(1+1)"  # the sandbox's fixed cost: a fresh process, its isolation, teardown


def wait_tool(name: str = "wait", record: list[tuple[float, float]] | None = None) -> FunctionTool:
    """A tool that sleeps ``ms`` milliseconds in its own thread (as every plain function
    tool runs), recording each call's start and end in ``record``: a stand-in for a tool
    that waits on something else (a web search, a remote sandbox). A row's
    ``extra_info.tools_kwargs`` may give it ``row_ms``, which wins over the model's
    ``ms``: latencies that differ per row with the same call in every row's turn."""

    def wait(ms: int, *, row_ms: int | None = None) -> str:
        ms = ms if row_ms is None else row_ms
        start = time.perf_counter()
        time.sleep(ms / 1000)
        if record is not None:
            record.append((start, time.perf_counter()))  # list.append: thread-safe
        return f"waited {ms} ms"

    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": "Wait the given number of milliseconds.",
            "parameters": {
                "type": "object",
                "properties": {"ms": {"type": "integer", "description": "milliseconds"}},
                "required": ["ms"],
            },
        },
    }
    return FunctionTool(name, schema, wait)


@dataclass(frozen=True)
class Case:
    label: str  # as printed
    call: ToolCall | None  # None: a turn with no call (asyncio.run alone, the floor)


def cases(wait_ms: int) -> list[Case]:
    return [
        Case("asyncio.run, no call (floor)", None),
        Case("calculator 17*23", ToolCall("calculator", {"expression": "17*23"})),
        Case("code_interpreter print(1+1)", ToolCall("code_interpreter", {"code": CODE})),
        Case(f"wait {wait_ms} ms (thread)", ToolCall("wait", {"ms": wait_ms})),
    ]


def tools() -> dict[str, Any]:
    specs = parse_tool_specs({"tools": [{"name": "calculator"}, {"name": "code_interpreter"}]})
    return {**build_tools(specs), "wait": wait_tool()}


async def _nothing() -> list[Any]:
    return []


def measure(case: Case, concurrency: int, tools: dict[str, Any], calls: int) -> dict[str, Any]:
    """Batches of ``concurrency`` calls until at least ``calls`` calls and MIN_S have
    passed (the calculator's batches take microseconds: one alone times nothing)."""
    batch = [] if case.call is None else [replace(case.call, index=i) for i in range(concurrency)]
    done = 0
    span = Span()
    while done < calls or time.perf_counter() - span.start < MIN_S:
        if case.call is None:
            results = asyncio.run(_nothing())
        else:
            results = asyncio.run(execute(batch, tools, TIMEOUT_S, MAX_OUTPUT_CHARS))
        bad = [r for r in results if not r.ok]
        if bad:
            raise RuntimeError(f"{case.label}: a call failed: {bad[0].kind}: {bad[0].text}")
        done += max(len(batch), 1)
    span.end()
    return {
        "calls": done,
        "wall_s": span.wall_s,
        "calls_per_s": done / span.wall_s,
        "other_cores": span.other_cores,
    }


def run(calls: int, wait_ms: int, concurrency: list[int], repeat: int) -> dict[str, Any]:
    """Every case at every concurrency, ``repeat`` times interleaved (each case's
    concurrencies one after another, so that they meet the same load), after one call
    of each case not counted (the sandbox probes the machine's isolation once)."""
    tool_map = tools()
    measured = cases(wait_ms)
    for case in measured:
        measure(case, 1, tool_map, 1)
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        c.label: {k: [] for k in (concurrency if c.call else [1])} for c in measured
    }
    for _ in range(repeat):
        for case in measured:
            for k in runs[case.label]:
                runs[case.label][k].append(measure(case, k, tool_map, calls))
    return runs
