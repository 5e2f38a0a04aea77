"""The dataset's agent columns, checked at the engine's start, before any worker: each
row's ``agent_name`` names an agent loop, its ``extra_info.tools_kwargs`` fit the tools
it may call (``engine.agents.tools.sample``) and its ``extra_info.interaction_kwargs``
name a declared interaction (``engine.agents.interactions``). Every problem is reported with the
file's row, up to a few, with how many more there are."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine.agents.interactions import interaction_kwargs_problems
from engine.agents.tools.sample import tool_kwargs_problems
from engine.agents.tools.schemas import short

SHOWN = 5  # problems listed; the rest counted


def agent_row_problems(
    rows: Iterable[tuple[str, str | None, Mapping[str, Any]]],
    tools: Mapping[str, Any],
    agent_loops: tuple[str, ...],
    default_agent: str,
    interactions: Mapping[str, Any] | None = None,
) -> list[str]:
    """``rows``: (where, agent_name, extra_info) of each row."""
    problems: list[str] = []
    total = 0
    for where, agent, extra in rows:
        found = []
        if agent is not None and agent not in agent_loops:
            found.append(
                f"{where}: agent_name: unknown agent loop {short(agent, 60)}; use one of"
                f" {', '.join(agent_loops)} (or leave it empty for"
                f" multi_turn.default_agent={default_agent})"
            )
        elif (agent or default_agent) != "single_turn":
            found += tool_kwargs_problems(extra, tools, where)
            found += interaction_kwargs_problems(extra, interactions or {}, where)
        total += len(found)
        problems += found[: max(0, SHOWN - len(problems))]
    if total > len(problems):
        problems.append(f"... and {total - len(problems)} more problems like these")
    return problems
