"""Per-sample tool state: each row's ``extra_info.tools_kwargs`` (verl's column).

A row can give a tool keyword arguments of its own, e.g. the answer a checking tool
compares with, or the state a tool reveals, which the model never sees in the prompt::

    extra_info:
      tools_kwargs:
        secret: {create_kwargs: {value: "37"}}     # verl's form
        lookup: {table: "cities"}                  # or the keywords alone

verl's phases (``create_kwargs``, ``execute_kwargs``, ``calc_reward_kwargs``,
``release_kwargs``) are merged into one set of keywords: an rlctl tool is one function,
called once per call. A function tool receives them as keyword-only parameters that the
schema does not declare (``def secret(*, value): ...``): the model cannot set them, and
the sample's value wins over anything the model writes. The rows are checked at the
engine's start (``tool_kwargs_problems``): a tool no tool file declares, a keyword the
function does not take, a keyword it needs and the row lacks.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from engine.agents.tools.schemas import short

VERL_PHASES = ("create_kwargs", "execute_kwargs", "calc_reward_kwargs", "release_kwargs")
KEY = "extra_info.tools_kwargs"


def sample_tool_kwargs(extra_info: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The row's keywords for each tool (verl's phases merged); {} when it gives none.
    Shapes are not checked here (``tool_kwargs_problems`` does, at the start)."""
    given = (extra_info or {}).get("tools_kwargs") or {}
    if not isinstance(given, Mapping):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, entry in given.items():
        if not isinstance(entry, Mapping):
            continue
        if any(phase in entry for phase in VERL_PHASES):
            merged: dict[str, Any] = {}
            for phase in VERL_PHASES:
                merged.update(entry.get(phase) or {})
            out[str(name)] = merged
        else:
            out[str(name)] = dict(entry)
    return out


def sample_parameters(fn: Any, declared: Mapping[str, Any]) -> tuple[set[str] | None, set[str]]:
    """What a tool function takes from the sample: (the keywords it accepts, None for
    any; the ones it needs). They are its keyword-only parameters the schema does not
    declare."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None, set()
    own = [p for p in params if p.kind is p.KEYWORD_ONLY and p.name not in declared]
    accepted = None if any(p.kind is p.VAR_KEYWORD for p in params) else {p.name for p in own}
    return accepted, {p.name for p in own if p.default is p.empty}


def tool_kwargs_problems(
    extra_info: Mapping[str, Any] | None, tools: Mapping[str, Any], where: str
) -> list[str]:
    """What is wrong with one row's tools_kwargs for these tools (``where`` names the
    row); the tools' needs are checked too, so a row without kwargs can fail."""
    given = (extra_info or {}).get("tools_kwargs")
    if given is not None and not isinstance(given, Mapping):
        return [f"{where}: {KEY} must map tool names to keywords, got {short(given)}"]
    problems = []
    for name, entry in (given or {}).items():
        if name not in tools:
            problems.append(
                f"{where}: {KEY}.{name}: no tool is named {short(name, 60)}; the tools file"
                f" declares {', '.join(sorted(tools)) or 'none'}"
            )
        elif not isinstance(entry, Mapping) or any(
            phase in entry and not isinstance(entry[phase], Mapping | None) for phase in VERL_PHASES
        ):
            problems.append(
                f"{where}: {KEY}.{name}: expected a mapping of keywords, got {short(entry)}"
            )
    kwargs = sample_tool_kwargs(extra_info)
    for name, tool in tools.items():
        accepted, needed = getattr(tool, "sample_parameters", (set(), set()))
        mine = kwargs.get(name, {})
        unknown = sorted(set(mine) - accepted) if accepted is not None else []
        if unknown:
            takes = f"takes only {', '.join(sorted(accepted))}" if accepted else "takes none"
            problems.append(
                f"{where}: {KEY}.{name}: the tool takes no per-sample keyword"
                f" {', '.join(map(repr, unknown))} ({takes}: its keyword-only parameters"
                " that the schema does not declare); drop it or add it to the function"
            )
        missing = sorted(needed - set(mine))
        if missing:
            problems.append(
                f"{where}: {KEY}.{name}: the tool needs {', '.join(map(repr, missing))} from"
                " each sample; give it in the row, or a default in the function"
            )
    return problems
