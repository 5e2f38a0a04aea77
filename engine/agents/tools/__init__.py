"""Tools for agentic rollouts: declared in a tools file, called by the model, run at once.

    from engine.agents.tools import (
        build_tools, execute, get_tool_call_parser, load_tool_specs, tool_schemas,
    )
    specs = load_tool_specs("tools.yaml")              # checked: ConfigError with the fix
    prompt = tokenizer.apply_chat_template(messages, tools=tool_schemas(specs), ...)
    tools = build_tools(specs)                         # where the tools run
    parser = get_tool_call_parser("hermes", max_calls=8)
    turn = parser.parse(response_text)                 # ParsedTurn(content, calls, errors)
    results = await execute(turn.calls, tools, timeout_s=30, max_output_chars=4000)

``specs.py``: the tools file (verl's form and rlctl's); ``parsers.py``: the model's
tool-call formats; ``builtins.py``: the built-in tools and custom functions;
``execute.py``: running calls with timeouts; ``types.py``: what flows between them.
``docs/tools.md`` is the user's guide.
"""

from engine.agents.tools.builtins import BUILTIN_TOOLS, FunctionTool
from engine.agents.tools.execute import execute, truncate
from engine.agents.tools.parsers import (
    DEFAULT_MAX_CALLS,
    TOOL_CALL_PARSERS,
    ToolCallParser,
    get_tool_call_parser,
    tool_call_parser_names,
)
from engine.agents.tools.specs import (
    ToolSpec,
    build_tools,
    load_tool_specs,
    parse_tool_specs,
    tool_schemas,
)
from engine.agents.tools.types import (
    BAD_ARGUMENTS,
    EXECUTED,
    OK,
    OUTCOMES,
    RAISED,
    TIMEOUT,
    TRUNCATED,
    UNKNOWN_TOOL,
    Outcome,
    ParsedTurn,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
)

__all__ = [
    "BAD_ARGUMENTS",
    "BUILTIN_TOOLS",
    "DEFAULT_MAX_CALLS",
    "EXECUTED",
    "OK",
    "OUTCOMES",
    "RAISED",
    "TIMEOUT",
    "TOOL_CALL_PARSERS",
    "TRUNCATED",
    "UNKNOWN_TOOL",
    "FunctionTool",
    "Outcome",
    "ParsedTurn",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "build_tools",
    "execute",
    "get_tool_call_parser",
    "load_tool_specs",
    "parse_tool_specs",
    "tool_call_parser_names",
    "tool_schemas",
    "truncate",
]
