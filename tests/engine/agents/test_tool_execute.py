"""Running calls: concurrently, in order, each with its own timeout; a tool that raises,
hangs or floods its output gives the model a message and never stalls the turn.

Concurrency is shown with rendezvous (a barrier only the calls running together can pass),
not with a clock; the timeouts are short and nothing asserts how long a call took."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading

import pytest

from engine.agents.tools import (
    BAD_ARGUMENTS,
    OK,
    RAISED,
    TIMEOUT,
    TRUNCATED,
    UNKNOWN_TOOL,
    FunctionTool,
    ToolCall,
    ToolError,
    ToolResult,
    execute,
    truncate,
)

ANY_ARGS = {"type": "object"}


def tool(fn, parameters=ANY_ARGS, name=None):
    name = name or fn.__name__
    schema = {
        "type": "function",
        "function": {"name": name, "description": "", "parameters": parameters},
    }
    return FunctionTool(name, schema, fn)


def run(calls, tools, timeout_s=5.0, max_output_chars=1000):
    tools = {t.name: t for t in tools}
    return asyncio.run(execute(calls, tools, timeout_s, max_output_chars))


def calls(*names_and_args):
    return [ToolCall(name, args, i) for i, (name, args) in enumerate(names_and_args)]


def test_plain_functions_run_concurrently_in_threads():
    barrier = threading.Barrier(3, timeout=10)  # passes only if all three run at once

    def meet(n):
        barrier.wait()
        return f"met {n}"

    results = run(calls(("meet", {"n": 0}), ("meet", {"n": 1}), ("meet", {"n": 2})), [tool(meet)])
    assert [(r.kind, r.text, r.index) for r in results] == [
        (OK, "met 0", 0),
        (OK, "met 1", 1),
        (OK, "met 2", 2),
    ]


def test_async_functions_run_concurrently_and_results_keep_the_call_order():
    order = []

    async def main():
        second_done = asyncio.Event()

        async def first():
            await second_done.wait()  # finishes only after the second call has
            order.append("first")
            return "first"

        async def second():
            order.append("second")
            second_done.set()
            return "second"

        tools = {t.name: t for t in (tool(first), tool(second))}
        return await execute(calls(("first", {}), ("second", {})), tools, 5.0, 100)

    results = asyncio.run(main())
    assert order == ["second", "first"]
    assert [r.text for r in results] == ["first", "second"]


def test_a_hung_function_times_out_and_the_others_finish():
    release = threading.Event()

    def hang():
        release.wait(30)
        return "late"

    def quick():
        return "done"

    try:
        results = run(calls(("hang", {}), ("quick", {})), [tool(hang), tool(quick)], timeout_s=0.5)
    finally:
        release.set()
    assert results[0].kind == TIMEOUT
    assert results[0].text == "tool call 1 ('hang') did not finish within 0.5 s"
    assert (results[1].kind, results[1].text) == (OK, "done")
    assert results[0].latency_s > 0


def test_a_coroutine_that_swallows_cancellation_cannot_hold_the_turn():
    async def stubborn():
        with contextlib.suppress(asyncio.CancelledError):  # swallows the timeout's cancel
            await asyncio.sleep(10)
        await asyncio.sleep(10)
        return "late"

    async def main():
        (result,) = await execute(calls(("stubborn", {})), {"stubborn": tool(stubborn)}, 0.05, 100)
        still_running = asyncio.all_tasks() - {asyncio.current_task()}
        return result, len(still_running)  # asyncio.run cancels it again on the way out

    result, still_running = asyncio.run(main())
    assert result.kind == TIMEOUT
    assert still_running == 1


@pytest.mark.parametrize(
    ("fn", "text"),
    [
        (lambda: 1 / 0, "tool call 1 ('f') failed: ZeroDivisionError: division by zero"),
        (
            lambda: (_ for _ in ()).throw(ToolError("no city named 'Pariss'")),
            "tool call 1 ('f') failed: no city named 'Pariss'",
        ),
        (
            lambda: sys.exit(3),
            "tool call 1 ('f') failed: it called exit(3)",
        ),
    ],
    ids=["raises", "tool error", "exit in a thread"],
)
def test_a_raising_tool_is_a_message(fn, text):
    (result,) = run(calls(("f", {})), [tool(fn, name="f")])
    assert (result.kind, result.text) == (RAISED, text)


def test_exit_in_an_async_tool_ends_the_call_not_the_run():
    async def leave():
        raise SystemExit(2)

    async def fine():
        return "ok"

    results = run(calls(("leave", {}), ("fine", {})), [tool(leave), tool(fine)])
    assert [(r.kind, r.text) for r in results] == [
        (RAISED, "tool call 1 ('leave') failed: it called exit(2)"),
        (OK, "ok"),
    ]


def test_flooded_output_is_cut_and_marked():
    def flood():
        return "x" * 12_345

    (result,) = run(calls(("flood", {})), [tool(flood)], max_output_chars=100)
    assert result.kind == TRUNCATED
    assert result.text == "x" * 100 + "\n[truncated: 12245 more characters]"
    assert not result.ok


def test_an_error_message_is_cut_too_and_keeps_its_kind():
    def loud():
        raise ValueError("y" * 5000)

    (result,) = run(calls(("loud", {})), [tool(loud)], max_output_chars=50)
    assert result.kind == RAISED
    assert result.text.endswith("more characters]")


def test_unknown_tool():
    (result,) = run(calls(("serch", {})), [tool(lambda: "", name="search")])
    assert result.kind == UNKNOWN_TOOL
    assert (
        result.text
        == "tool call 1 ('serch'): no tool is named 'serch'; the tools: search (did you mean 'search'?)"
    )


def test_arguments_are_checked_against_the_schema_before_the_tool_runs():
    ran = []

    def search(query, limit=3):
        ran.append(query)
        return "found"

    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
        "required": ["query"],
        "additionalProperties": False,
    }
    results = run(
        calls(
            ("search", {"limit": 2}),
            ("search", {"query": 3, "limit": "five"}),
            ("search", {"query": "q", "sort": "date"}),
            ("search", {"query": "q", "limit": 0}),
            ("search", {"query": "cats", "limit": 2}),
        ),
        [tool(search, parameters)],
    )
    assert [r.kind for r in results] == [BAD_ARGUMENTS] * 4 + [OK]
    assert (
        results[0].text
        == "tool call 1 ('search'): bad arguments: arguments: 'query' is a required property"
    )
    assert results[1].text == (
        "tool call 2 ('search'): bad arguments: arguments.limit: 'five' is not of type 'integer'; "
        "arguments.query: 3 is not of type 'string'"
    )
    assert "'sort' was unexpected" in results[2].text
    assert "arguments.limit: 0 is less than the minimum of 1" in results[3].text
    assert ran == ["cats"]


def test_huge_arguments_are_quoted_short():
    (result,) = run(
        calls(("f", {"q": "z" * 100_000})),
        [tool(lambda q: q, {"type": "object", "properties": {"q": {"type": "integer"}}}, name="f")],
    )
    assert result.kind == BAD_ARGUMENTS
    assert len(result.text) < 400


def test_return_values_become_text():
    def data():
        return {"a": [1, "é"]}

    def nothing():
        return None

    def number():
        return 4.5

    results = run(
        calls(("data", {}), ("nothing", {}), ("number", {})),
        [tool(data), tool(nothing), tool(number)],
    )
    assert [r.text for r in results] == ['{"a": [1, "é"]}', "", "4.5"]


def test_a_tool_of_any_class_that_returns_the_wrong_type():
    class Odd:
        def __init__(self):
            self.name = "odd"
            self.schema = {"type": "function", "function": {"name": "odd", "parameters": ANY_ARGS}}

        async def call(self, arguments):
            return "not a ToolResult"

    (result,) = run(calls(("odd", {})), [Odd()])
    assert result.kind == RAISED
    assert "returned a str, not a ToolResult" in result.text


def test_result_fields_and_message():
    (result,) = run(calls(("f", {})), [tool(lambda: "hi", name="f")])
    assert result.ok and result.name == "f" and result.index == 0 and result.latency_s >= 0
    assert result.as_message() == {"role": "tool", "name": "f", "content": "hi"}
    assert ToolResult.failure(TIMEOUT, "t").ok is False


def test_no_calls():
    assert run([], []) == []


def test_truncate():
    assert truncate("abc", 3) == ("abc", False)
    assert truncate("abcd", 3) == ("abc\n[truncated: 1 more characters]", True)
