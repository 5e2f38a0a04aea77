"""The built-in tools: the calculator (a table, and a property: any text is a value or a
ToolError, quickly), and code_interpreter against the sandbox's contract (a stand-in
module always; the real engine/sandbox/run.py when it is in the tree)."""

from __future__ import annotations

import asyncio
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.agents.tools import (
    OK,
    RAISED,
    ToolCall,
    ToolError,
    build_tools,
    execute,
    parse_tool_specs,
)
from engine.agents.tools.builtins import as_text
from engine.agents.tools.calculator import MAX_EXPRESSION_CHARS, calculate
from engine.errors import ConfigError


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("-3 ** 2", "-9"),
        ("+4", "4"),
        ("1.5e3 + 1", "1501.0"),
        ("sqrt(16)", "4.0"),
        ("round(pi, 3)", "3.142"),
        ("round(2.5)", "2"),
        ("max(1, 7, 3) - min(4, 2)", "5"),
        ("abs(-3)", "3"),
        ("floor(2.7) + ceil(2.1)", "5"),
        ("log(e)", "1.0"),
        ("log10(1000)", "3.0"),
        ("2 ** 4000 // 2 ** 3999", "2"),
        ("  1 + 1  ", "2"),
    ],
)
def test_calculator_values(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("9**9**9", "387420489 is too large to compute"),
        ("2 ** 5000", "too large to compute"),
        ("10 ** 1000 * 10 ** 1000", "the result is too large"),
        ("1e308 * 10", "not a finite number"),
        ("2.0 ** 5000", "too large"),
        ("exp(1000)", "too large"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("sqrt(-1)", "math domain error"),
        ("log(0)", "math domain error"),
        ("min()", "expected at least 1 argument"),
        ("round(5, -10 ** 9)", "round's digits"),
        ("round(5, 2.5)", "round's digits"),
        ("__import__('os').system('true')", "unknown function"),
        ("(1).__class__", "Attribute is not allowed"),
        ("x + 1", "unknown name 'x'"),
        ("'a' * 3", "'a' is not a number"),
        ("True + 1", "True is not a number"),
        ("1j", "1j is not a number"),
        ("[1, 2]", "List is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("1 << 10", "BinOp is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("sqrt(x=4)", "positional arguments only"),
        ("2 +", "not an arithmetic expression"),
        ("1; 2", "not an arithmetic expression"),
        ("1\x00", "null"),
        ("-" * 1500 + "1", "nested too deeply"),
        ("(" * 300 + "1" + ")" * 300, "too many nested parentheses"),
        ("1" * (MAX_EXPRESSION_CHARS + 1), "longer than"),
        ("", "not an arithmetic expression"),
    ],
)
def test_calculator_refusals(expression, message):
    with pytest.raises(ToolError) as info:
        calculate(expression)
    assert message in str(info.value)


def test_calculator_refuses_non_text():
    with pytest.raises(ToolError, match="must be a string"):
        calculate(12)


_ARITHMETIC = st.recursive(
    st.one_of(
        st.integers(-(10**6), 10**6).map(str),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
        st.sampled_from(["pi", "e", "x", "9**9**9", "1e308", "0"]),
    ),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%", "**", "//"]), inner).map(
            " ".join
        ),
        inner.map(lambda x: f"({x})"),
        inner.map(lambda x: f"-{x}"),
        st.tuples(st.sampled_from(["sqrt", "round", "max", "log", "exp", "nope"]), inner).map(
            lambda t: f"{t[0]}({t[1]})"
        ),
    ),
    max_leaves=12,
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.one_of(_ARITHMETIC, st.text(max_size=60)))
def test_calculator_gives_a_value_or_a_tool_error_on_any_text(expression):
    try:
        value = calculate(expression)
    except ToolError as exc:
        assert str(exc)
        return
    number = float(value) if any(c in value for c in ".e") else int(value)
    assert not isinstance(number, float) or math.isfinite(number)
    assert len(value) < 1300  # MAX_INT_BITS is about 1233 decimal digits


def _run(tools, *calls, timeout_s=10.0):
    batch = [ToolCall(name, args, i) for i, (name, args) in enumerate(calls)]
    return asyncio.run(execute(batch, tools, timeout_s, 2000))


def test_calculator_tool_through_execute():
    tools = build_tools(parse_tool_specs({"tools": [{"name": "calculator"}]}))
    good, bad, missing = _run(
        tools,
        ("calculator", {"expression": "6 * 7"}),
        ("calculator", {"expression": "9**9**9"}),
        ("calculator", {}),
    )
    assert (good.kind, good.text) == (OK, "42")
    assert bad.kind == RAISED and "too large to compute" in bad.text
    assert missing.kind == "bad_arguments"


def test_code_interpreter_calls_the_sandbox_with_its_limits(fake_sandbox):
    specs = parse_tool_specs(
        {
            "tools": [
                {"name": "code_interpreter"},
                {
                    "class_name": "code_interpreter",
                    "config": {"wall_seconds": 3},
                    "tool_schema": {
                        "type": "function",
                        "function": {
                            "name": "python",
                            "parameters": {
                                "type": "object",
                                "properties": {"code": {"type": "string"}},
                                "required": ["code"],
                            },
                        },
                    },
                },
            ]
        }
    )
    plain, limited = _run(
        build_tools(specs), ("code_interpreter", {"code": "print(1)"}), ("python", {"code": "x"})
    )
    assert (plain.kind, plain.text, limited.text) == (OK, "ran 8 characters", "ran 1 characters")
    from engine.sandbox.limits import SandboxLimits

    assert sorted(fake_sandbox.calls) == [("print(1)", None), ("x", SandboxLimits(wall_seconds=3))]


def test_code_interpreter_config_that_is_not_a_sandbox_limit_is_refused_naming_it():
    for config, message in (({"timeout_s": 3}, "'timeout_s'] are not sandbox limits"),
                            ({"cpu_seconds": 0}, "tool 'code_interpreter': config:")):  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(message)):
            build_tools(parse_tool_specs({"tools": [{"class_name": "code_interpreter",
                                                     "config": config}]}))  # fmt: skip


def test_code_interpreter_whose_sandbox_fails(fake_sandbox):
    def broken(code, limits=None):
        raise OSError("no sandbox runtime on this node")

    fake_sandbox.code_interpreter = broken
    tools = build_tools(parse_tool_specs({"tools": [{"name": "code_interpreter"}]}))
    (result,) = _run(tools, ("code_interpreter", {"code": "1"}))
    assert result.kind == RAISED
    assert "OSError: no sandbox runtime on this node" in result.text


def test_code_interpreter_runs_code_in_the_real_sandbox():
    tools = build_tools(parse_tool_specs({"tools": [{"name": "code_interpreter"}]}))
    (result,) = _run(tools, ("code_interpreter", {"code": "print(6 * 7)"}), timeout_s=60)
    assert result.kind == OK, result.text
    assert "42" in result.text


def test_as_text():
    assert as_text("s") == "s"
    assert as_text(None) == ""
    assert as_text([1, {"a": None}]) == '[1, {"a": null}]'
    assert as_text({"x": {1, 2}}).startswith('{"x": "')  # not JSON-able: str() of the part
    assert as_text(3) == "3"
    circular = []
    circular.append(circular)
    assert as_text(circular) == "[[...]]"
