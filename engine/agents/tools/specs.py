"""The tools file: which tools the model may call, checked once at load, as ``ToolSpec``s.

Two forms, per entry, in one ``tools:`` list (``docs/tools.md``):

verl's (``actor_rollout_ref.rollout.multi_turn.tool_config_path`` files)::

    tools:
      - class_name: code_interpreter          # a built-in, or "my_tools.py:search"
        config: {}                            # the built-in's options
        tool_schema:                          # what the model sees (OpenAI's format)
          type: function
          function:
            name: code_interpreter
            description: Run Python code.
            parameters: {type: object, properties: {code: {type: string}}, required: [code]}

rlctl's short one::

    tools:
      - name: calculator                      # a built-in with its own schema
      - name: search                          # a custom tool: a function in a .py file
        path: my_tools.py                     # relative to the tools file's folder
        function: search                      # default: the name
        description: Search the notes.
        parameters: {type: object, properties: {query: {type: string}}, required: [query]}

verl's class names (``verl.tools.sandbox_fusion_tools.SandboxFusionTool``) are refused
with the rlctl equivalent: rlctl runs its own tools. Every problem in the file is
reported at once, as one ``ConfigError`` naming the file, the entry's key, the value and
the fix.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.agents.tools.builtins import BUILTIN_TOOLS, FunctionTool
from engine.agents.tools.schemas import parameters_problems, short
from engine.agents.tools.types import Tool
from engine.algo.registry import unknown_name_message
from engine.errors import ConfigError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

_VERL_KEYS = ("class_name", "config", "tool_schema")
_SHORT_KEYS = ("name", "description", "parameters", "path", "function", "config")
_SCHEMA_KEYS = ("type", "function")
_FUNCTION_KEYS = ("name", "description", "parameters", "strict")
# verl's tool classes that have an rlctl built-in doing the same job.
_VERL_EQUIVALENTS = {"SandboxFusionTool": "code_interpreter"}


@dataclass(frozen=True)
class ToolSpec:
    """One declared tool: what the model sees, and what runs when it is called."""

    name: str  # what the model calls
    description: str
    parameters: dict[str, Any]  # a JSON Schema object for the arguments
    builtin: str | None = None  # the built-in that runs it; None: a custom function
    path: str | None = None  # custom: the .py file (absolute)
    function: str | None = None  # custom: the function's name in it
    config: dict[str, Any] = field(default_factory=dict)  # the built-in's options
    where: str = ""  # where it was declared, for messages: "tools.yaml: tools[1]"

    def openai_schema(self) -> dict[str, Any]:
        """``{"type": "function", "function": {name, description, parameters}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }


def tool_schemas(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The tools in OpenAI's format, for ``tokenizer.apply_chat_template(messages,
    tools=tool_schemas(specs))``."""
    return [spec.openai_schema() for spec in specs]


def load_tool_specs(path: str | Path) -> list[ToolSpec]:
    """Read and check a tools file; custom tools' paths are relative to its folder."""
    import yaml

    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            [f"tools file {str(path)!r} does not exist; give the path of a tools YAML"]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"tools file {str(path)!r} cannot be read: {exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None
    except RecursionError:
        raise ConfigError([f"{path}: nested too deeply to read"]) from None
    return parse_tool_specs(data, source=str(path), base_dir=file.resolve().parent)


def parse_tool_specs(
    data: Any, *, source: str = "tools", base_dir: str | Path | None = None
) -> list[ToolSpec]:
    """Check a tools file's content (``{"tools": [...]}``) and give its ``ToolSpec``s.

    ``source`` names the file in messages; relative custom paths are under ``base_dir``
    (default: the working directory)."""
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    if not isinstance(data, Mapping) or not isinstance(data.get("tools"), list):
        raise ConfigError(
            [
                f"{source}: expected a mapping with a list under tools: (tools: [- name: calculator]), got {short(data)}"
            ]
        )
    problems = _unknown_keys(data, ("tools",), source)
    if not data["tools"]:
        problems.append(f"{source}: tools: is empty; declare at least one tool")
    specs: list[ToolSpec] = []
    first_at: dict[str, str] = {}
    for i, entry in enumerate(data["tools"]):
        where = f"{source}: tools[{i}]"
        spec = _entry(entry, where, base, problems)
        if spec is None:
            continue
        if spec.name in first_at:
            problems.append(
                f"{where}: tool name {spec.name!r} is declared twice (also at "
                f"{first_at[spec.name].split(': ', 1)[-1]}); give each tool its own name"
            )
            continue
        first_at[spec.name] = where
        specs.append(spec)
    if problems:
        raise ConfigError(problems)
    return specs


def build_tools(specs: Sequence[ToolSpec]) -> dict[str, Tool]:
    """The runnable tools, by the name the model calls (custom files are imported again:
    run this where the tools run, e.g. in a rollout worker)."""
    tools: dict[str, Tool] = {}
    for spec in specs:
        schema = spec.openai_schema()
        if spec.builtin is not None:
            tools[spec.name] = BUILTIN_TOOLS.get(spec.builtin)(spec.name, schema, spec.config)
        else:
            problems: list[str] = []
            fn = _load_function(
                spec.path or "",
                spec.function,
                f"{spec.where}.path",
                f"{spec.where}.function",
                problems,
            )
            if fn is None:
                raise ConfigError(problems)
            tools[spec.name] = FunctionTool(spec.name, schema, fn)
    return tools


def _unknown_keys(entry: Mapping[str, Any], known: Sequence[str], where: str) -> list[str]:
    problems = []
    for key in entry:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
            problems.append(f"{where}: unknown key {short(key)} ({hint})")
    return problems


def _entry(entry: Any, where: str, base: Path, problems: list[str]) -> ToolSpec | None:
    if not isinstance(entry, Mapping):
        problems.append(
            f"{where}: expected a mapping (name: ..., or class_name: ... with tool_schema: ...), got {short(entry)}"
        )
        return None
    if "class_name" in entry or "tool_schema" in entry:
        return _verl_entry(entry, where, base, problems)
    if "name" in entry:
        return _short_entry(entry, where, base, problems)
    problems.append(
        f"{where}: give class_name: and tool_schema: (verl's form) or name: (rlctl's form); "
        f"got keys {', '.join(map(str, entry)) or 'none'}"
    )
    return None


def _verl_entry(
    entry: Mapping[str, Any], where: str, base: Path, problems: list[str]
) -> ToolSpec | None:
    found = _unknown_keys(entry, _VERL_KEYS, where)
    config = _config(entry.get("config"), f"{where}.config", found)
    implementation = _implementation(entry.get("class_name"), f"{where}.class_name", found)
    function: Mapping[str, Any] = {}
    schema = entry.get("tool_schema")
    if schema is None:
        if implementation is not None and implementation[0] is not None:
            builtin = BUILTIN_TOOLS.get(implementation[0])
            function = {
                "name": implementation[0],
                "description": builtin.DESCRIPTION,
                "parameters": builtin.PARAMETERS,
            }
        elif implementation is not None:
            found.append(
                f"{where}: a custom tool needs tool_schema: {{type: function, function: "
                "{name, description, parameters}}"
            )
    elif not isinstance(schema, Mapping):
        found.append(
            f"{where}.tool_schema: expected a mapping {{type: function, function: {{...}}}}, got {short(schema)}"
        )
    else:
        found += _unknown_keys(schema, _SCHEMA_KEYS, f"{where}.tool_schema")
        if schema.get("type", "function") != "function":
            found.append(
                f"{where}.tool_schema.type: {short(schema.get('type'))}; write type: function"
            )
        function = schema.get("function")
        if not isinstance(function, Mapping):
            found.append(
                f"{where}.tool_schema.function: expected a mapping {{name, description, parameters}}, got {short(function)}"
            )
            function = {}
        else:
            found += _unknown_keys(function, _FUNCTION_KEYS, f"{where}.tool_schema.function")
    if implementation is None and function.get("parameters") is not None:
        found += parameters_problems(
            function["parameters"], f"{where}.tool_schema.function.parameters"
        )
    problems += found
    if found or implementation is None:
        return None
    builtin, path, function_name = implementation
    return _spec(
        builtin=builtin,
        path=path,
        function=function_name,
        name=function.get("name"),
        description=function.get("description"),
        parameters=function.get("parameters"),
        config=config,
        keys={
            "name": ".tool_schema.function.name",
            "description": ".tool_schema.function.description",
            "parameters": ".tool_schema.function.parameters",
            "path": ".class_name",
            "function": ".class_name",
            "config": ".config",
        },
        where=where,
        base=base,
        problems=problems,
    )


def _short_entry(
    entry: Mapping[str, Any], where: str, base: Path, problems: list[str]
) -> ToolSpec | None:
    found = _unknown_keys(entry, _SHORT_KEYS, where)
    config = _config(entry.get("config"), f"{where}.config", found)
    name = entry.get("name")
    path = entry.get("path")
    builtin = None
    if path is None:
        if "function" in entry:
            found.append(f"{where}.function: set only with path: (the .py file that holds it)")
        if isinstance(name, str) and name not in BUILTIN_TOOLS:
            found.append(
                f"{where}.name: {unknown_name_message('built-in tool', name, BUILTIN_TOOLS.names())}; "
                "for a tool of your own give path: (a .py file) and function:"
            )
        builtin = name if isinstance(name, str) else None
    elif not isinstance(path, str) or not path.strip():
        found.append(f"{where}.path: expected the path of a .py file, got {short(path)}")
    problems += found
    if found:
        return None
    function = entry.get("function", name) if path is not None else None
    return _spec(
        builtin=builtin,
        path=path,
        function=function,
        name=name,
        description=entry.get("description"),
        parameters=entry.get("parameters"),
        config=config,
        keys={key: f".{key}" for key in _SHORT_KEYS},
        where=where,
        base=base,
        problems=problems,
    )


def _config(value: Any, key: str, problems: list[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(f"{key}: expected a mapping of options, got {short(value)}")
        return {}
    return dict(value)


def _implementation(
    value: Any, key: str, problems: list[str]
) -> tuple[str | None, str | None, str | None] | None:
    """``class_name`` as (built-in, path, function), or None after adding the problem."""
    builtins = BUILTIN_TOOLS.names()
    if not isinstance(value, str) or not value.strip():
        problems.append(
            f"{key}: expected a built-in ({', '.join(builtins)}) or path/to/file.py:function, got {short(value)}"
        )
        return None
    if value in BUILTIN_TOOLS:
        return value, None, None
    file, colon, function = value.rpartition(":")
    if colon and file.endswith(".py"):
        if not function.isidentifier():
            problems.append(
                f"{key}: {value!r}: after the ':' write the function's name (file.py:function)"
            )
            return None
        return None, file, function
    if value.endswith(".py"):
        problems.append(f"{key}: {value!r}: name the function too, as {value}:function_name")
        return None
    if "." in value:
        equivalent = _VERL_EQUIVALENTS.get(value.rsplit(".", 1)[-1])
        instead = (
            f"the built-in {equivalent!r}" if equivalent else f"a built-in ({', '.join(builtins)})"
        )
        problems.append(
            f"{key}: {value!r} is a Python class (verl's tools); rlctl runs its own tools: "
            f"write {instead}, or path/to/file.py:function for a function of yours"
        )
        return None
    problems.append(
        f"{key}: {unknown_name_message('built-in tool', value, builtins)}; or write path/to/file.py:function"
    )
    return None


def _spec(
    *,
    builtin: str | None,
    path: Any,
    function: Any,
    name: Any,
    description: Any,
    parameters: Any,
    config: dict[str, Any],
    keys: dict[str, str],
    where: str,
    base: Path,
    problems: list[str],
) -> ToolSpec | None:
    """The checks both forms share, on values already pulled from the entry."""
    found: list[str] = []
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        found.append(
            f"{where}{keys['name']}: {short(name)}; a tool name is 1-64 letters, digits, _ or - "
            "(what the model writes to call it)"
        )
    if description is None:
        description = BUILTIN_TOOLS.get(builtin).DESCRIPTION if builtin else ""
    elif not isinstance(description, str):
        found.append(f"{where}{keys['description']}: expected text, got {short(description)}")
    if parameters is None:
        parameters = (
            copy.deepcopy(BUILTIN_TOOLS.get(builtin).PARAMETERS)
            if builtin
            else dict(EMPTY_PARAMETERS)
        )
    else:
        found += parameters_problems(parameters, f"{where}{keys['parameters']}")
    if not found and builtin is not None:
        found += _builtin_problems(builtin, parameters, config, where, keys)
    resolved = None
    if not found and builtin is None:
        if config:
            found.append(
                f"{where}{keys['config']}: a custom tool takes no config; read its settings in your file"
            )
        resolved = str((base / Path(path).expanduser()).resolve())
        if not Path(resolved).is_file():
            found.append(
                f"{where}{keys['path']}: {path!r} is not a file (looked for {resolved!r}; a "
                "relative path is read from the tools file's folder); give the path of a .py file"
            )
            resolved = None
    if not found and builtin is None:
        fn = _load_function(
            resolved, function, f"{where}{keys['path']}", f"{where}{keys['function']}", found
        )
        if fn is not None:
            found += _signature_problems(fn, parameters, f"{where}{keys['function']}")
    problems += found
    if found:
        return None
    return ToolSpec(
        name=name,
        description=description,
        parameters=dict(parameters),
        builtin=builtin,
        path=resolved,
        function=function if builtin is None else None,
        config=config,
        where=where,
    )


def _builtin_problems(
    builtin: str,
    parameters: Mapping[str, Any],
    config: Mapping[str, Any],
    where: str,
    keys: dict[str, str],
) -> list[str]:
    cls = BUILTIN_TOOLS.get(builtin)
    problems = []
    reason = cls.unavailable()
    if reason:
        problems.append(f"{where}: the built-in {builtin!r} cannot run here: {reason}")
    declared = parameters.get("properties", {})
    missing = [arg for arg in cls.ARGUMENTS if arg not in declared]
    if missing:
        problems.append(
            f"{where}{keys['parameters']}.properties: the built-in {builtin!r} reads "
            f"{', '.join(map(repr, missing))}; declare {'it' if len(missing) == 1 else 'them'} "
            "(or leave parameters out for the built-in's own)"
        )
    if cls.CONFIG_KEYS is not None:
        for key in config:
            problems.append(
                f"{where}{keys['config']}.{key}: the built-in {builtin!r} takes "
                + (f"only {', '.join(cls.CONFIG_KEYS)}" if cls.CONFIG_KEYS else "no options")
            )
    return problems


def _load_function(
    path: str, function: Any, path_key: str, function_key: str, problems: list[str]
) -> Callable[..., Any] | None:
    """The custom tool's function (the custom reward's loader), or None after the problem."""
    from engine.reward.custom import load_custom_function
    from engine.reward.types import RewardError

    if not isinstance(function, str) or not function.isidentifier():
        problems.append(
            f"{function_key}: expected the name of a function in {path!r}, got {short(function)}"
        )
        return None
    try:
        return load_custom_function(path, function, path_key=path_key, name_key=function_key)
    except RewardError as exc:
        problems.append(str(exc))
        return None


def _signature_problems(
    fn: Callable[..., Any], parameters: Mapping[str, Any], key: str
) -> list[str]:
    """Whether ``fn(**arguments)`` can take every declared argument and gets each one it
    needs (a parameter without a default must be required by the schema)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return []
    params = signature.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        accepted = None
    else:
        accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    declared = parameters.get("properties", {})
    required = set(parameters.get("required", []))
    label = f"{getattr(fn, '__name__', 'the function')}{signature}"
    problems = []
    if accepted is not None:
        extra = [name for name in declared if name not in accepted]
        if extra:
            problems.append(
                f"{key}: {label} takes no argument {', '.join(map(repr, extra))} that the schema declares; add it to the function or drop it from properties"
            )
    # A keyword-only parameter the schema does not declare comes from the sample
    # (extra_info.tools_kwargs, checked against the data at the start): not the model's.
    needed = [
        p.name
        for p in params
        if p.default is p.empty
        and (p.kind is p.POSITIONAL_OR_KEYWORD or (p.kind is p.KEYWORD_ONLY and p.name in declared))
        and p.name not in required
    ]
    if needed:
        problems.append(
            f"{key}: {label} needs {', '.join(map(repr, needed))}, which the schema does not require; list it under required or give it a default"
        )
    return problems
