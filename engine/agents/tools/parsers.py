"""Find the tool calls in a model's turn: one registered parse function per output format.

``hermes``: the format of Qwen2.5's and Qwen3's chat templates (and Hermes 2 Pro's),
which tell the model to write each call as a JSON object between tags::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

``arguments`` may also be a JSON string holding the object (as Qwen2.5's template renders
a string argument), or left out (no arguments). Several calls a turn are allowed; the text
outside the tags is the turn's content.

Every parse function takes ``(text, max_calls)`` and returns a ``ParsedTurn``; it never
raises and runs in time linear in the text: a malformed call (bad JSON, no name, a tag
never closed, a stray ``</tool_call>``) becomes one of the turn's ``errors``, a sentence
for the model, and the turn's well-formed calls still run. Calls beyond ``max_calls`` are
not decoded and are reported in one error. Arguments are checked against the tool's
schema by ``execute`` (the parser knows formats, not tools).

To add a format: a function ``parse_x(text, max_calls) -> ParsedTurn`` registered with
``@TOOL_CALL_PARSERS.register("x")`` in this module (``decode_call`` decodes a JSON call
body for any format that writes JSON), and a case table in
``tests/engine/agents/test_tool_parsers.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.agents.tools.schemas import short
from engine.agents.tools.types import ParsedTurn, ToolCall
from engine.algo.registry import Registry, unknown_name_message
from engine.errors import ConfigError

DEFAULT_MAX_CALLS = 8  # calls run per turn; more are reported, not run
MAX_ERRORS = 8  # error sentences per turn; the rest are summed up in one more

ParseFn = Callable[[str, int], ParsedTurn]
TOOL_CALL_PARSERS: Registry[ParseFn] = Registry("tool-call parser")

_CALL_SHAPE = '{"name": "<tool name>", "arguments": {...}}'


@dataclass(frozen=True)
class ToolCallParser:
    """A format and the most calls a turn may make: ``parser.parse(text)``."""

    name: str = "hermes"
    max_calls: int = DEFAULT_MAX_CALLS

    def parse(self, text: str) -> ParsedTurn:
        return TOOL_CALL_PARSERS.get(self.name)(text, self.max_calls)


def tool_call_parser_names() -> tuple[str, ...]:
    return TOOL_CALL_PARSERS.names()


def get_tool_call_parser(
    name: str, max_calls: int = DEFAULT_MAX_CALLS, *, key: str = "tool_call_parser"
) -> ToolCallParser:
    """The parser for format ``name``; a ``ConfigError`` naming ``key`` for an unknown
    one or a ``max_calls`` below 1."""
    problems = []
    if name not in TOOL_CALL_PARSERS:
        problems.append(
            f"{key}: {unknown_name_message('tool-call format', name, tool_call_parser_names())}"
        )
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
        problems.append(f"max tool calls per turn: {max_calls!r}; give a whole number ≥ 1")
    if problems:
        raise ConfigError(problems)
    return ToolCallParser(name, max_calls)


class _Errors:
    """A turn's error sentences: the first ``MAX_ERRORS``, then a count of the rest."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.dropped = 0

    def add(self, message: str) -> None:
        if len(self.kept) < MAX_ERRORS:
            self.kept.append(message)
        else:
            self.dropped += 1

    def done(self) -> list[str]:
        if self.dropped:
            return [*self.kept, f"and {self.dropped} more problems with tool calls"]
        return self.kept


def decode_call(body: str, number: int, index: int) -> ToolCall | str:
    """A JSON call body (``{"name": ..., "arguments": ...}``) as a ``ToolCall``, or the
    sentence that tells the model what is wrong with it (``number`` counts from 1)."""
    where = f"tool call {number}"
    stripped = body.strip()
    if not stripped:
        return f"{where} is empty; write {_CALL_SHAPE} inside the tags"
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError as exc:
        return (
            f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            f"write {_CALL_SHAPE}"
        )
    except RecursionError:
        return f"{where}: its JSON is nested too deeply"
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        return f"{where} is not valid JSON ({str(exc)[:100]})"
    if not isinstance(value, dict):
        return f"{where} is a JSON {type(value).__name__}, not an object; write {_CALL_SHAPE}"
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'{where} has no "name" (got {short(name)}); write {_CALL_SHAPE}'
    name = name.strip()
    label = f"{where} ({short(name, 40)})"
    if "arguments" not in value:
        if "parameters" in value:
            return f'{label}: write its arguments under "arguments", not "parameters"'
        return ToolCall(name=name, arguments={}, index=index)
    arguments = _arguments(value["arguments"])
    if isinstance(arguments, str):
        return f"{label}: {arguments}"
    return ToolCall(name=name, arguments=arguments, index=index)


def _arguments(value: Any) -> dict[str, Any] | str:
    """The arguments as an object (decoding a JSON string holding one), or a problem."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return '"arguments" is a string that is not a JSON object; write an object: {...}'
    if not isinstance(value, dict):
        return f'"arguments" must be a JSON object {{...}}, got {short(value, 40)}'
    return value


@TOOL_CALL_PARSERS.register("hermes")
def parse_hermes(text: str, max_calls: int) -> ParsedTurn:
    """``<tool_call>{json}</tool_call>`` blocks (see the module's docstring).

    One left-to-right pass: each ``str.find`` starts where the last one found its tag, so
    the work is linear in ``len(text)`` whatever the tags' order. A ``<tool_call>`` with
    another ``<tool_call>`` before its ``</tool_call>`` (nested), or none after it, is an
    unclosed call and is dropped up to the next opening tag (or the end)."""
    open_tag, close_tag = "<tool_call>", "</tool_call>"
    content: list[str] = []
    calls: list[ToolCall] = []
    errors = _Errors()
    stray = 0  # closing tags outside any call
    blocks = 0  # opening tags seen (the calls the model meant to make)
    decoded = 0  # well-closed blocks decoded (good or not): at most max_calls
    skipped = 0  # well-closed blocks past those, not decoded
    pos = 0
    next_open = text.find(open_tag)
    next_close = text.find(close_tag)
    while next_open != -1:
        outside = text[pos:next_open]
        stray += outside.count(close_tag)
        content.append(outside)
        blocks += 1
        body_start = next_open + len(open_tag)
        if next_close != -1 and next_close < body_start:
            next_close = text.find(close_tag, body_start)
        following = text.find(open_tag, body_start)
        if next_close == -1 or (following != -1 and following < next_close):
            errors.add(
                f"tool call {blocks}: <tool_call> is not closed"
                + (" before the next <tool_call>" if following != -1 else "")
                + f"; end each call with {close_tag}"
            )
            pos = following if following != -1 else len(text)
        else:
            if decoded >= max_calls:
                skipped += 1
            else:
                decoded += 1
                call = decode_call(text[body_start:next_close], blocks, blocks - 1)
                if isinstance(call, ToolCall):
                    calls.append(call)
                else:
                    errors.add(call)
            pos = next_close + len(close_tag)
        next_open = following
    tail = text[pos:]
    stray += tail.count(close_tag)
    content.append(tail)
    if stray:
        errors.add(
            f"{stray} {close_tag} without a <tool_call> before it; open each call with <tool_call>"
        )
    if skipped:
        errors.add(
            f"{skipped} tool calls after the first {max_calls} were not run: "
            f"at most {max_calls} calls a turn"
        )
    return ParsedTurn(content="".join(content).strip(), calls=calls, errors=errors.done())
