"""The built-in agent loops, and the agent loops file that registers a user's own.

An agent loop is a class built once per rollout worker as ``cls(config)``, whose
``async def run(self, episode)`` drives one trajectory (``engine.agents.episode``). A
dataset row picks its loop by its ``agent_name`` column (verl's), else
``multi_turn.default_agent``. Built in:

- ``tool_agent``: the model writes a turn; its tool calls run and their results come
  back; an answer without a call goes to the row's interaction, if it has one, which
  may send it back with feedback; up to the turn limit and the token budget.
- ``single_turn``: one generation, no call read: the rollout without multi-turn.

The agent loops file (``multi_turn.agent_loop_config_path``) is verl's list::

    - name: guess                       # what rows name in agent_name
      _target_: guess_loop.py:GuessLoop # or class_name: a class in a file beside this one
      config: {tries: 3}                # given to the class as cls(config)
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from engine.agents.declared import Declared, load_declared, parse_declared
from engine.agents.episode import Episode
from engine.agents.trajectory import ANSWERED, LENGTH, MAX_TURNS
from engine.algo.registry import Registry

AGENT_LOOPS: Registry[Any] = Registry("built-in agent loop")


class AgentLoop(Protocol):
    async def run(self, episode: Episode) -> None: ...


class _Builtin:
    CONFIG_KEYS: ClassVar[tuple[str, ...]] = ()  # a built-in takes no config

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        pass


@AGENT_LOOPS.register("tool_agent")
class ToolAgentLoop(_Builtin):
    async def run(self, episode: Episode) -> None:
        while (turn := await episode.generate()) is not None:
            if not turn.finished:  # cut: no call or answer to read
                return episode.end(LENGTH)
            parsed = episode.parse_tool_calls(turn)
            if parsed.calls or parsed.errors:
                if not episode.turns_left:  # no turn left to read the results
                    return episode.end(MAX_TURNS)
                episode.add_tool_results(parsed, await episode.call_tools(parsed))
                continue
            feedback = episode.interact(turn)
            if feedback is None or feedback.done:
                return episode.end(ANSWERED)
            if not episode.turns_left:
                return episode.end(MAX_TURNS)
            episode.add_feedback(feedback)


@AGENT_LOOPS.register("single_turn")
class SingleTurnLoop(_Builtin):
    async def run(self, episode: Episode) -> None:
        await episode.generate()


def builtin_loops() -> dict[str, Any]:
    return {name: AGENT_LOOPS.get(name)({}) for name in AGENT_LOOPS.names()}


def _not_a_loop(cls: Any) -> str | None:
    run = getattr(cls, "run", None)
    if not isinstance(cls, type) or not inspect.iscoroutinefunction(run):
        return "not an agent loop: give a class with `async def run(self, episode)`"
    return None


FILE = Declared(
    "agent loop",
    None,
    ("_target_", "class_name"),
    AGENT_LOOPS,
    reserved=AGENT_LOOPS.names(),
    check_class=_not_a_loop,
)


def load_agent_loops(path: str | Path) -> dict[str, Any]:
    """The loops a file declares, built, by name (the built-ins not among them)."""
    return load_declared(path, FILE)


def parse_agent_loops(
    data: Any, *, source: str = "agent loops", base_dir: str | Path = "."
) -> dict[str, Any]:
    return parse_declared(data, FILE, source=source, base_dir=base_dir)
