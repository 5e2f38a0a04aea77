"""How a section declares a field (its default and its help text), and the small
checks that every section's rules share."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import MISSING, field
from typing import Any

from engine.algo.registry import unknown_name_message


def setting(
    default: Any = MISSING,
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    kind: str | None = None,
) -> Any:
    """A leaf field: its default (or a ``factory`` for a mutable one) and its help text,
    kept in the field's metadata for ``--help KEY`` and docs/configuration.md. ``kind``
    names the type in words where the annotation cannot (a field typed ``Any``)."""
    metadata = {"help": help} if kind is None else {"help": help, "type": kind}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def choice(value: str, valid: Iterable[str], key: str, kind: str) -> list[str]:
    """The problem with a name that is not one of ``valid`` (none when it is)."""
    valid = tuple(valid)
    if value in valid:
        return []
    return [f"{key}: {unknown_name_message(kind, value, valid)}"]


def positive(checks: Iterable[tuple[str, int]]) -> list[str]:
    """The problem with each (key, value) whose value is below 1."""
    return [f"{key} must be a positive integer, got {value}" for key, value in checks if value < 1]


def selected(cfg: Any, key: str) -> Any:
    """The value at a dotted key."""
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def as_list(value: Any) -> list[str]:
    """A path or a list of paths (or None) as a list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def one_of(valid: Iterable[str]) -> str:
    """Names in words, for help texts: ``a, b or c``."""
    valid = list(valid)
    return valid[0] if len(valid) == 1 else f"{', '.join(valid[:-1])} or {valid[-1]}"
