"""What flows between the parser, the tools and the agent loop: calls, turns, results.

A model's turn is parsed into a ``ParsedTurn`` (its text, the ``ToolCall``s it made, the
problems with the calls it got wrong); ``execute`` runs the calls and gives one
``ToolResult`` per call, in the calls' order. Every failure is a value here, never an
exception: the loop tells the model about it and counts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

# What happened to one call. "ok": the tool ran and its whole output is in the text; the
# others are what the metrics count: a name no tool has, arguments its schema refuses, a
# tool that raised, one that ran past the timeout, output cut at max_output_chars.
OK = "ok"
UNKNOWN_TOOL = "unknown_tool"
BAD_ARGUMENTS = "bad_arguments"
RAISED = "raised"
TIMEOUT = "timeout"
TRUNCATED = "truncated"
Outcome = Literal["ok", "unknown_tool", "bad_arguments", "raised", "timeout", "truncated"]
OUTCOMES: tuple[Outcome, ...] = (OK, UNKNOWN_TOOL, BAD_ARGUMENTS, RAISED, TIMEOUT, TRUNCATED)
# The outcomes of a call whose tool was run (the metrics' tool calls); an unknown tool or
# arguments its schema refused never reach a tool.
EXECUTED: tuple[Outcome, ...] = (OK, TRUNCATED, RAISED, TIMEOUT)


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call the model made."""

    name: str
    arguments: dict[str, Any]
    index: int = 0  # its place among the turn's <tool_call> blocks, from 0

    def as_openai(self) -> dict[str, Any]:
        """The call as a chat message's ``tool_calls`` entry (for ``apply_chat_template``)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedTurn:
    """A model's turn: its text outside the calls, the calls, and what was wrong.

    ``errors`` are sentences written for the model (``"tool call 2: ..."``, numbered from
    1 in the order the calls were written), one per malformed call; the well-formed calls
    of the same turn are in ``calls`` and run."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ToolResult:
    """What one call gave: the text the model reads, how it went, how long it took."""

    text: str
    kind: Outcome = OK
    name: str = ""  # the tool called (as the model wrote it)
    index: int = 0  # the call's ToolCall.index
    latency_s: float = 0.0  # from the call's start to its result (a timeout: the timeout)

    @property
    def ok(self) -> bool:
        return self.kind == OK

    @classmethod
    def success(cls, text: str) -> ToolResult:
        return cls(text=text)

    @classmethod
    def failure(cls, kind: Outcome, text: str) -> ToolResult:
        return cls(text=text, kind=kind)

    def as_message(self) -> dict[str, Any]:
        """The result as a ``tool`` chat message (the chat template wraps it, e.g. Qwen's
        ``<tool_response>``)."""
        return {"role": "tool", "name": self.name, "content": self.text}


class ToolError(Exception):
    """Raised by a tool for a failure the model should read as written (no exception type
    in front): "no city named 'Pariss'". Any other exception reaches the model as
    ``"TypeName: message"``; both are counted as ``raised``."""


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call. ``schema`` is its OpenAI-format declaration,
    ``{"type": "function", "function": {"name", "description", "parameters"}}``; ``call``
    gets arguments already checked against ``parameters``, and the sample's own keywords
    for this tool (``extra_info.tools_kwargs``) as ``sample`` when the row gives any."""

    name: str
    schema: dict[str, Any]

    async def call(self, arguments: dict[str, Any]) -> ToolResult: ...
