"""JSON Schema for tools: a declared ``parameters`` schema is checked once, at load; each
call's arguments are checked against it before the tool runs.

Both use ``jsonschema`` (Ray's own dependency, so it is wherever the engine runs),
imported on first use. A schema without ``$schema`` is read as draft 2020-12. Formats
(``"format": "email"``) are not checked, as JSON Schema's default is.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

MAX_PROBLEMS = 3  # the problems told about one call's arguments (the first few suffice)
_MESSAGE_CHARS = 200  # jsonschema quotes the value it refused: a long one is cut
_VALID = "(the parameters must be a valid JSON Schema)"
_TYPES = "(JSON Schema's types: string, number, integer, boolean, object, array, null)"


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a message quotes what it refused)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _dotted(where: str, path: Any) -> str:
    key = where
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key


def parameters_problems(parameters: Any, where: str) -> list[str]:
    """What is wrong with a tool's ``parameters`` schema, each naming its key under
    ``where`` (``"tools.yaml: tools[0].tool_schema.function.parameters"``). Empty when it
    is a valid JSON Schema for an object whose ``required`` names are all properties."""
    if not isinstance(parameters, Mapping):
        return [
            f"{where}: expected a JSON Schema object like {{type: object, properties: "
            f"{{...}}, required: [...]}}, got {short(parameters)}"
        ]
    if parameters.get("type") != "object":
        return [
            f"{where}.type: {short(parameters.get('type'))} — a tool's arguments are a JSON "
            "object: write type: object (with properties: for each argument)"
        ]
    from jsonschema.validators import validator_for

    try:
        meta = validator_for(parameters)
        problems = [
            f"{_dotted(where, error.absolute_path)}: {error.message[:_MESSAGE_CHARS]} "
            + (_TYPES if list(error.absolute_path)[-1:] == ["type"] else _VALID)
            for error in meta(meta.META_SCHEMA).iter_errors(dict(parameters))
        ][:MAX_PROBLEMS]
    except RecursionError:
        return [f"{where}: nested too deeply to check"]
    if problems:
        return problems
    properties = parameters.get("properties", {})
    names = properties if isinstance(properties, Mapping) else {}
    missing = [name for name in parameters.get("required", []) if name not in names]
    if missing:
        return [
            f"{where}.required: {', '.join(map(repr, missing))} not under properties "
            f"(properties: {', '.join(map(repr, names)) or 'none'}); declare each required "
            "argument under properties, or fix its spelling"
        ]
    return []


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    from jsonschema.validators import validator_for

    schema = json.loads(schema_json)
    return validator_for(schema)(schema)


def argument_problems(parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """Why ``arguments`` do not fit the ``parameters`` schema, as sentences for the model
    (at most ``MAX_PROBLEMS``); empty when they fit. Never raises."""
    try:
        validator = _validator(json.dumps(parameters, sort_keys=True, default=str))
        errors = sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.path))
    except RecursionError:
        return ["the arguments are nested too deeply"]
    except Exception as exc:  # a schema jsonschema cannot use (an unresolvable $ref)
        return [f"the tool's schema cannot check them ({type(exc).__name__}: {exc})"[:200]]
    problems = []
    for error in errors[:MAX_PROBLEMS]:
        at = _dotted("arguments", error.absolute_path)
        problems.append(f"{at}: {error.message[:_MESSAGE_CHARS]}")
    if len(errors) > MAX_PROBLEMS:
        problems.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return problems
