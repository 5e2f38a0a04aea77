"""Run a turn's tool calls: all at once, each with its own timeout, one result per call.

``await execute(calls, tools, timeout_s, max_output_chars)`` never raises for what a call
does: a name no tool has, arguments the tool's schema refuses, a tool that raises (even
``SystemExit``), one that hangs past ``timeout_s`` (it is left behind, cancelled if it is a
coroutine; the turn goes on) and output longer than ``max_output_chars`` (cut, with a
``[truncated: N more characters]`` line) each become a ``ToolResult`` the model reads and
the loop counts (``ToolResult.kind``). Results come back in the calls' order.

A tool written ``async def`` that blocks the event loop (``time.sleep``) cannot be timed
out from inside it; the built-ins and custom plain functions run in threads, so they can.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from engine.agents.tools.schemas import argument_problems, short
from engine.agents.tools.types import (
    BAD_ARGUMENTS,
    OK,
    RAISED,
    TIMEOUT,
    TRUNCATED,
    UNKNOWN_TOOL,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
)


async def execute(
    calls: Sequence[ToolCall],
    tools: Mapping[str, Tool],
    timeout_s: float,
    max_output_chars: int,
    sample: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[ToolResult]:
    """One ``ToolResult`` per call, in order; the calls run concurrently. ``sample``: the
    row's own keywords for each tool by name (``extra_info.tools_kwargs``)."""
    own = sample or {}
    return list(
        await asyncio.gather(
            *(_run(call, tools, timeout_s, max_output_chars, own.get(call.name)) for call in calls)
        )
    )


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` cut to ``max_chars`` characters with a line saying how much was cut."""
    if len(text) <= max_chars:
        return text, False
    return f"{text[:max_chars]}\n[truncated: {len(text) - max_chars} more characters]", True


async def _run(
    call: ToolCall,
    tools: Mapping[str, Tool],
    timeout_s: float,
    max_output_chars: int,
    sample: Mapping[str, Any] | None,
) -> ToolResult:
    start = time.perf_counter()
    tool = tools.get(call.name)
    label = f"tool call {call.index + 1} ({short(call.name, 40)})"
    if tool is None:
        result = ToolResult.failure(UNKNOWN_TOOL, _unknown_tool_message(call.name, label, tools))
    else:
        problems = argument_problems(_parameters(tool), call.arguments)
        if problems:
            result = ToolResult.failure(
                BAD_ARGUMENTS, f"{label}: bad arguments: {'; '.join(problems)}"
            )
        else:
            result = await _call_with_timeout(tool, call.arguments, sample, label, timeout_s)
    text, cut = truncate(result.text, max_output_chars)
    return replace(
        result,
        text=text,
        kind=TRUNCATED if cut and result.kind == OK else result.kind,
        name=call.name,
        index=call.index,
        latency_s=time.perf_counter() - start,
    )


def _parameters(tool: Tool) -> Mapping[str, Any]:
    try:
        return tool.schema["function"].get("parameters") or {"type": "object"}
    except (AttributeError, KeyError, TypeError):
        return {"type": "object"}


def _unknown_tool_message(name: str, label: str, tools: Mapping[str, Tool]) -> str:
    names = sorted(tools)
    message = (
        f"{label}: no tool is named {short(name, 60)}; the tools: {', '.join(names) or 'none'}"
    )
    close = difflib.get_close_matches(name, names, n=1)
    return message + (f" (did you mean {close[0]!r}?)" if close else "")


async def _guarded(
    tool: Tool, arguments: dict[str, Any], sample: Mapping[str, Any] | None, label: str
) -> ToolResult:
    """The tool's result, or what it raised as a result (nothing escapes but cancelling)."""
    try:
        # A tool without per-sample state may not take ``sample`` at all
        result = await (tool.call(arguments, sample) if sample else tool.call(arguments))  # type: ignore[call-arg]
    except ToolError as exc:
        return ToolResult.failure(RAISED, f"{label} failed: {exc}")
    except Exception as exc:
        return ToolResult.failure(RAISED, f"{label} failed: {type(exc).__name__}: {exc}")
    except SystemExit as exc:
        return ToolResult.failure(RAISED, f"{label} failed: it called exit({exc.code})")
    if isinstance(result, ToolResult):
        return result
    return ToolResult.failure(
        RAISED, f"{label} failed: the tool returned a {type(result).__name__}, not a ToolResult"
    )


async def _call_with_timeout(
    tool: Tool,
    arguments: dict[str, Any],
    sample: Mapping[str, Any] | None,
    label: str,
    timeout_s: float,
) -> ToolResult:
    task = asyncio.ensure_future(_guarded(tool, arguments, sample, label))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task in done:
        return task.result()
    # Not awaited after cancelling: a tool that swallows the cancellation cannot hold the
    # turn. Its outcome, whenever it comes, is collected and dropped.
    task.cancel()
    task.add_done_callback(_drop)
    return ToolResult.failure(TIMEOUT, f"{label} did not finish within {timeout_s:g} s")


def _drop(task: asyncio.Future[Any]) -> None:
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()
