"""The tool-call parsers: a hand-written table of well-formed, malformed and adversarial
turns per format, and properties (never raises, bounded time, calls capped) on any text."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.agents.tools import (
    ParsedTurn,
    ToolCall,
    get_tool_call_parser,
    tool_call_parser_names,
)
from engine.agents.tools.parsers import MAX_ERRORS, TOOL_CALL_PARSERS
from engine.errors import ConfigError


def call(name, arguments=None, **fields):
    body = {"name": name, "arguments": {} if arguments is None else arguments, **fields}
    return f"<tool_call>\n{json.dumps(body)}\n</tool_call>"


def hermes(text, max_calls=8) -> ParsedTurn:
    return get_tool_call_parser("hermes", max_calls).parse(text)


# (id, text, content, [(name, arguments)], [substrings of each error, in order])
HERMES_CASES = [
    ("plain text", "The answer is 4.", "The answer is 4.", [], []),
    ("empty", "", "", [], []),
    (
        "one call, Qwen's layout",
        "Let me compute.\n" + call("calculator", {"expression": "2+2"}),
        "Let me compute.",
        [("calculator", {"expression": "2+2"})],
        [],
    ),
    (
        "two calls",
        call("a", {"x": 1}) + "\n" + call("b", {"y": [1, 2]}),
        "",
        [("a", {"x": 1}), ("b", {"y": [1, 2]})],
        [],
    ),
    (
        "arguments as a JSON string (Qwen2.5's tojson of a string)",
        '<tool_call>{"name": "f", "arguments": "{\\"q\\": \\"hi\\"}"}</tool_call>',
        "",
        [("f", {"q": "hi"})],
        [],
    ),
    ("no arguments", '<tool_call>{"name": "now"}</tool_call>', "", [("now", {})], []),
    (
        "empty string arguments",
        '<tool_call>{"name": "now", "arguments": ""}</tool_call>',
        "",
        [("now", {})],
        [],
    ),
    (
        "name with spaces around",
        '<tool_call>{"name": " f ", "arguments": {}}</tool_call>',
        "",
        [("f", {})],
        [],
    ),
    (
        "text between and after calls is content",
        "a " + call("f") + " b " + call("g") + " c",
        "a  b  c",
        [("f", {}), ("g", {})],
        [],
    ),
    (
        "think block kept in content",
        "<think>\nI need 2+2\n</think>\n\n" + call("calculator", {"expression": "2+2"}),
        "<think>\nI need 2+2\n</think>",
        [("calculator", {"expression": "2+2"})],
        [],
    ),
    (
        "unicode arguments",
        call("search", {"query": "naïve café 数学"}),
        "",
        [("search", {"query": "naïve café 数学"})],
        [],
    ),
    # malformed
    (
        "malformed JSON",
        "<tool_call>{name: f}</tool_call>",
        "",
        [],
        ["tool call 1 is not valid JSON"],
    ),
    ("trailing comma", '<tool_call>{"name": "f",}</tool_call>', "", [], ["not valid JSON"]),
    ("empty body", "<tool_call>\n</tool_call>", "", [], ["tool call 1 is empty"]),
    (
        "a list, not an object",
        "<tool_call>[1, 2]</tool_call>",
        "",
        [],
        ["JSON list, not an object"],
    ),
    ("a bare string", '<tool_call>"f"</tool_call>', "", [], ["JSON str, not an object"]),
    ("missing name", '<tool_call>{"arguments": {}}</tool_call>', "", [], ['has no "name"']),
    (
        "empty name",
        '<tool_call>{"name": "  ", "arguments": {}}</tool_call>',
        "",
        [],
        ['has no "name"'],
    ),
    ("name not a string", '<tool_call>{"name": 3}</tool_call>', "", [], ['has no "name"']),
    (
        "parameters instead of arguments",
        '<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>',
        "",
        [],
        ['not "parameters"'],
    ),
    (
        "arguments a list",
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        "",
        [],
        ['"arguments" must be a JSON object'],
    ),
    (
        "arguments a number",
        '<tool_call>{"name": "f", "arguments": 3}</tool_call>',
        "",
        [],
        ['"arguments" must be a JSON object'],
    ),
    (
        "arguments a string that is not JSON",
        '<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>',
        "",
        [],
        ["a string that is not a JSON object"],
    ),
    (
        "arguments a string holding a list",
        '<tool_call>{"name": "f", "arguments": "[1]"}</tool_call>',
        "",
        [],
        ['"arguments" must be a JSON object'],
    ),
    (
        "unclosed at the end",
        'ok <tool_call>{"name": "f", "arguments": {}}',
        "ok",
        [],
        ["tool call 1: <tool_call> is not closed;"],
    ),
    (
        "unclosed, then a good call",
        '<tool_call>{"name": "f"' + call("g"),
        "",
        [("g", {})],
        ["tool call 1: <tool_call> is not closed before the next <tool_call>"],
    ),
    (
        "nested tags",
        '<tool_call><tool_call>{"name": "f"}</tool_call></tool_call>',
        "</tool_call>",
        [("f", {})],
        ["tool call 1: <tool_call> is not closed before", "1 </tool_call> without a <tool_call>"],
    ),
    ("stray closing tag", "done </tool_call>", "done </tool_call>", [], ["1 </tool_call> without"]),
    (
        "one bad call among good ones keeps the good",
        call("a") + "<tool_call>{oops}</tool_call>" + call("c"),
        "",
        [("a", {}), ("c", {})],
        ["tool call 2 is not valid JSON"],
    ),
    ("deep nesting", "<tool_call>" + "[" * 100_000 + "</tool_call>", "", [], ["tool call 1"]),
    (
        "an integer past Python's digit limit",
        '<tool_call>{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}</tool_call>",
        "",
        [],
        ["tool call 1 is not valid JSON"],
    ),
    (
        "garbage tags",
        "<tool_call<tool_call>>{}</tool_call>>",
        "<tool_call>",
        [],
        ["tool call 1 is not valid JSON"],
    ),
    ("tag-like text only", "<tool_call >{}</ tool_call>", "<tool_call >{}</ tool_call>", [], []),
]


@pytest.mark.parametrize(
    ("text", "content", "calls", "errors"),
    [pytest.param(*case[1:], id=case[0]) for case in HERMES_CASES],
)
def test_hermes_table(text, content, calls, errors):
    turn = hermes(text)
    assert turn.content == content
    assert [(c.name, c.arguments) for c in turn.calls] == calls
    assert len(turn.errors) == len(errors), turn.errors
    for message, expected in zip(turn.errors, errors, strict=True):
        assert expected in message, message


def test_calls_keep_their_place_among_the_blocks():
    turn = hermes(call("a") + "<tool_call>bad</tool_call>" + call("c"))
    assert [c.index for c in turn.calls] == [0, 2]
    assert turn.errors[0].startswith("tool call 2 ")


def test_calls_past_the_cap_are_reported_not_run():
    turn = hermes("".join(call(f"t{i}") for i in range(5)), max_calls=2)
    assert [c.name for c in turn.calls] == ["t0", "t1"]
    assert turn.errors == ["3 tool calls after the first 2 were not run: at most 2 calls a turn"]


def test_malformed_calls_count_toward_the_cap():
    turn = hermes("<tool_call>x</tool_call>" + call("a") + call("b"), max_calls=2)
    assert [c.name for c in turn.calls] == ["a"]
    assert "1 tool calls after the first 2" in turn.errors[-1]


def test_errors_are_capped_and_summed_up():
    turn = hermes("<tool_call>x</tool_call>" * 50, max_calls=50)
    assert len(turn.errors) == MAX_ERRORS + 1
    assert turn.errors[-1] == f"and {50 - MAX_ERRORS} more problems with tool calls"


def test_as_openai_round_trip():
    (parsed,) = hermes(call("f", {"x": 1})).calls
    assert parsed.as_openai() == {
        "type": "function",
        "function": {"name": "f", "arguments": {"x": 1}},
    }
    assert parsed == ToolCall("f", {"x": 1}, 0)


def test_unknown_format_and_bad_cap_name_the_key():
    assert "hermes" in tool_call_parser_names()
    with pytest.raises(
        ConfigError,
        match=r"rollout\.format: unknown tool-call format 'hermez'.*did you mean 'hermes'",
    ):
        get_tool_call_parser("hermez", key="rollout.format")
    with pytest.raises(ConfigError, match="max tool calls per turn: 0"):
        get_tool_call_parser("hermes", 0)


# Pieces that make the parser's paths meet: tags, halves of tags, JSON fragments, calls.
_PIECES = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<tool_",
        "call>",
        "</tool",
        '{"name": "f", "arguments": {"x": 1}}',
        '{"name": "f", "arguments": "{\\"x\\": 1}"}',
        '{"name": ',
        '"arguments": [',
        "{",
        "}",
        "[",
        "]",
        '"',
        "\\",
        "\n",
        " ",
        "text",
        "\x00",
        "\ud7ff",
        "9" * 50,
    ]
)
TEXTS = st.one_of(
    st.text(max_size=400), st.lists(_PIECES | st.text(max_size=8), max_size=60).map("".join)
)


def _check_turn(turn: ParsedTurn, max_calls: int) -> None:
    assert isinstance(turn, ParsedTurn)
    assert isinstance(turn.content, str)
    assert len(turn.calls) <= max_calls
    assert len(turn.errors) <= MAX_ERRORS + 1
    for parsed in turn.calls:
        assert isinstance(parsed.name, str) and parsed.name
        assert isinstance(parsed.arguments, dict)
    assert all(isinstance(e, str) and e for e in turn.errors)


@pytest.mark.parametrize("name", TOOL_CALL_PARSERS.names())
def test_parse_never_raises_on_any_text(name):
    parser = get_tool_call_parser(name, max_calls=3)

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(TEXTS)
    def prop(text):
        _check_turn(parser.parse(text), 3)

    prop()


class CountingText(str):
    """A text that counts the characters its ``find`` scans: the parser's work, measured
    without a clock (so the bound holds on any machine, however loaded)."""

    scanned = 0

    def find(self, sub, start=0, end=None):
        found = super().find(sub, start) if end is None else super().find(sub, start, end)
        CountingText.scanned += (found if found != -1 else len(self)) - (start or 0) + len(sub)
        return found


def hermes_work(text: str, max_calls: int = 8) -> tuple[ParsedTurn, int]:
    CountingText.scanned = 0
    turn = hermes(CountingText(text), max_calls)
    return turn, CountingText.scanned


@pytest.mark.parametrize(
    "unit",
    [
        "<tool_call>",  # every tag unclosed before the next
        "</tool_call>",  # all stray
        "<tool_call>{}</tool_call>",  # calls past the cap
        '<tool_call>{"name": "f"}</tool_call>',
        "<tool_call>" + "[" * 20,
        "<tool_call>x" + "</tool_call>" * 3,
        "<tool_",
    ],
)
def test_hermes_work_is_linear(unit):
    """The tags are searched in one pass: the characters scanned stay within a small
    multiple of the text's length, however the tags are arranged."""
    text = unit * 20_000
    turn, work = hermes_work(text)
    assert work <= 3 * len(text) + 100, (work, len(text))
    _check_turn(turn, 8)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(TEXTS)
def test_hermes_work_is_linear_on_any_text(text):
    turn, work = hermes_work(text, max_calls=3)
    assert work <= 3 * len(text) + 100
    _check_turn(turn, 3)
