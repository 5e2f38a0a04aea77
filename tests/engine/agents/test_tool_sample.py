"""Per-sample tool state (``extra_info.tools_kwargs``): verl's phases merged, given to the
function as its keyword-only parameters, winning over the model's arguments, and every
row checked at the start with the row, the key and the fix."""

from __future__ import annotations

import asyncio

from engine.agents.rows import agent_row_problems
from engine.agents.tools import FunctionTool, ToolCall, execute, parse_tool_specs
from engine.agents.tools.sample import sample_tool_kwargs, tool_kwargs_problems

LOOPS = ("single_turn", "tool_agent")


def secret(*, value):
    return f"the secret is {value}"


def lookup(key, *, table, fallback="none"):
    return table.get(key, fallback)


def function_tool(fn, properties=None):
    properties = properties or {}
    schema = {
        "type": "function",
        "function": {
            "name": fn.__name__,
            "description": "",
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
            },
        },
    }
    return FunctionTool(fn.__name__, schema, fn)


TOOLS = {
    "secret": function_tool(secret),
    "lookup": function_tool(lookup, {"key": {"type": "string"}}),
}


def run(calls, tools, sample):
    return asyncio.run(execute(calls, tools, timeout_s=5, max_output_chars=100, sample=sample))


def test_verl_phases_merge_and_the_short_form_is_the_keywords():
    extra = {
        "tools_kwargs": {
            "secret": {"create_kwargs": {"value": "7"}, "execute_kwargs": {"x": 1}},
            "lookup": {"table": {"a": "b"}},
        }
    }
    assert sample_tool_kwargs(extra) == {
        "secret": {"value": "7", "x": 1},
        "lookup": {"table": {"a": "b"}},
    }
    assert sample_tool_kwargs({}) == {} == sample_tool_kwargs(None)


def test_the_sample_reaches_the_tool_and_wins_over_the_model():
    calls = [ToolCall("secret", {}, 0), ToolCall("lookup", {"key": "a"}, 1)]
    sample = {"secret": {"value": "3"}, "lookup": {"table": {"a": "apple"}}}
    results = run(calls, TOOLS, sample)
    assert [r.text for r in results] == ["the secret is 3", "apple"]
    # another row, another secret: the state is the row's, not the tool's
    assert run(calls[:1], TOOLS, {"secret": {"value": "9"}})[0].text == "the secret is 9"


def test_a_sample_keyword_the_model_also_writes_keeps_the_samples_value():
    tools = {"secret": FunctionTool("secret", TOOLS["secret"].schema, secret)}
    result = run([ToolCall("secret", {"value": "0"})], tools, {"secret": {"value": "5"}})
    assert result[0].text == "the secret is 5"


def test_a_tool_without_sample_state_is_called_as_before():
    class Plain:
        def __init__(self):
            self.name = "plain"
            self.schema = {"type": "function", "function": {"name": "plain", "parameters": {}}}

        async def call(self, arguments):  # no ``sample`` parameter at all
            from engine.agents.tools import ToolResult

            return ToolResult.success("plain")

    assert run([ToolCall("plain", {})], {"plain": Plain()}, {"secret": {"value": "1"}})[0].ok


def test_the_tools_file_accepts_a_keyword_only_parameter_the_schema_leaves_out(tmp_path):
    (tmp_path / "t.py").write_text("def secret(*, value):\n    return value\n")
    specs = parse_tool_specs(
        {
            "tools": [
                {
                    "name": "secret",
                    "path": "t.py",
                    "parameters": {"type": "object", "properties": {}},
                }
            ]
        },
        base_dir=tmp_path,
    )
    assert [s.name for s in specs] == ["secret"]


def test_row_problems_name_the_row_the_key_and_the_fix():
    where = "train.parquet: row 4"
    unknown = tool_kwargs_problems(
        {
            "tools_kwargs": {"secrte": {}},
        },
        TOOLS,
        where,
    )
    assert any(
        "row 4" in p and "tools_kwargs.secrte" in p and "lookup, secret" in p for p in unknown
    )
    extra = tool_kwargs_problems(
        {"tools_kwargs": {"secret": {"create_kwargs": {"value": 1, "salt": 2}}}}, TOOLS, where
    )
    assert any("'salt'" in p and "takes only value" in p for p in extra)
    missing = tool_kwargs_problems({}, TOOLS, where)
    assert any("secret" in p and "needs 'value'" in p for p in missing)
    assert any("lookup" in p and "needs 'table'" in p for p in missing)
    fine = {"tools_kwargs": {"secret": {"create_kwargs": {"value": "1"}}, "lookup": {"table": {}}}}
    assert tool_kwargs_problems(fine, TOOLS, where) == []
    assert tool_kwargs_problems({"tools_kwargs": [1]}, TOOLS, where)[0].endswith("got [1]")


def test_agent_rows_check_names_and_skip_single_turn_rows():
    fine = {"tools_kwargs": {"secret": {"value": "1"}, "lookup": {"table": {}}}}
    rows = [
        ("f: row 0", None, fine),
        ("f: row 1", "single_turn", {}),  # no tools, no kwargs needed
        ("f: row 2", "tool_agnet", fine),
        ("f: row 3", "tool_agent", {"tools_kwargs": {"lookup": {"table": {}}}}),
    ]
    problems = agent_row_problems(rows, TOOLS, LOOPS, "tool_agent")
    assert len(problems) == 2
    assert "f: row 2: agent_name: unknown agent loop 'tool_agnet'" in problems[0]
    assert problems[1].startswith("f: row 3") and "needs 'value'" in problems[1]


def test_many_bad_rows_are_counted_not_all_listed():
    rows = [(f"f: row {i}", "nope", {}) for i in range(12)]
    problems = agent_row_problems(rows, TOOLS, LOOPS, "tool_agent")
    assert len(problems) == 6 and problems[-1] == "... and 7 more problems like these"
