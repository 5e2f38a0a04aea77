"""What a run is told at start about the keys it gave: the ones that change nothing in
this engine (verl's keys accepted so that its command lines run, ``fields.inert``), in
one line, so that nothing a user set is dropped without a word."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import Field, fields, is_dataclass
from typing import Any

from engine.config.engine import EngineConfig
from engine.config.load import Loaded


def field_at(key: str, root: Any = None) -> tuple[Field, str] | None:
    """The schema field that holds a dotted key (the key's own leaf, or the mapping it is
    inside) and the key of that field; None where the schema has no such key."""
    node = EngineConfig() if root is None else root
    walked: list[str] = []
    for part in key.split("."):
        if not is_dataclass(node):
            break
        found = next((f for f in fields(node) if f.name == part), None)
        if found is None:
            return None
        walked.append(part)
        value = getattr(node, part)
        if not is_dataclass(value):
            return found, ".".join(walked)
        node = value
    return None


def inert_keys(keys: Iterable[str], root: Any = None) -> list[str]:
    """The keys among ``keys`` that change nothing here (``root``: a config of the
    trainer's schema; the RL trainer's when None)."""
    root = EngineConfig() if root is None else root
    out = []
    for key in keys:
        found = field_at(key, root)
        if found is not None and found[0].metadata.get("inert"):
            out.append(key)
    return out


def start_note(loaded: Loaded, program: str = "python -m engine.main") -> str | None:
    """The line a run prints at start about the keys it set that change nothing here
    (and Hydra's own settings); None when there are none."""
    keys = inert_keys(loaded.given, type(loaded.config)())
    keys += [line.split("=", 1)[0] for line in loaded.hydra]
    if not keys:
        return None
    return (
        f"note: {len(keys)} key(s) set change nothing in this engine (verl's, accepted so"
        f" that its command lines run; `{program} --help KEY` says why):"
        f" {', '.join(keys)}"
    )
