"""The engine keys whose relative paths name files on the launcher's machine, beside the
recipe (a multi-turn rollout's tools, interactions and agent loops files): the recipe
stage rebases them through ``extends:``, the job stage ships them (``rlctl/job/files.py``,
where the why is told)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOOLS_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
INTERACTIONS_KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
AGENT_LOOPS_KEY = "actor_rollout_ref.rollout.multi_turn.agent_loop_config_path"
TOOLS_DIR = "tools"  # in the job's directory


@dataclass(frozen=True)
class Shipped:
    """A key whose relative file is shipped: its folder in the job's directory, the list
    its file holds its entries under, and what to call it in messages."""

    folder: str
    entries: str | None  # None: the file is the list itself (the agent loops file)
    what: str
    example: str  # a smallest valid file, for the hint


SHIPPED = {
    TOOLS_KEY: Shipped(
        TOOLS_DIR, "tools", "tools file", "tools: [{name: code_interpreter}] (docs/tools.md)"
    ),
    INTERACTIONS_KEY: Shipped(
        "interactions",
        "interaction",
        "interactions file",
        "interaction: [{name: retry, class_name: retry}] (docs/agents.md)",
    ),
    AGENT_LOOPS_KEY: Shipped(
        "agent_loops",
        None,
        "agent loops file",
        "[{name: my_loop, _target_: my_loop.py:MyLoop}] (docs/agents.md)",
    ),
}


def is_launcher_path(value: Any) -> bool:
    """A relative path: the recipe's folder's, shipped; absolute or ``~``: the job's."""
    return (
        isinstance(value, str)
        and bool(value.strip())
        and not value.startswith(("/", "~"))
        and "://" not in value
    )


def rebase(raw: dict[str, Any], from_dir: Path, to_dir: Path) -> dict[str, Any]:
    """A recipe's fields as read from a file in ``from_dir`` (an ``extends`` parent),
    with its launcher paths made relative to ``to_dir`` (the recipe that extends it), so
    that they keep naming the same file. The engine block may be nested or dotted."""
    if from_dir.resolve() == to_dir.resolve() or not isinstance(raw.get("engine"), dict):
        return raw

    def walk(tree: dict[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict):
                out[key] = walk(value, f"{dotted}.")
            elif dotted in SHIPPED and is_launcher_path(value):
                out[key] = os.path.relpath((from_dir / value).resolve(), to_dir.resolve())
            else:
                out[key] = value
        return out

    return {**raw, "engine": walk(raw["engine"], "")}
