"""How a section declares a field (its default and its help text), and the small
checks that every section's rules share."""

from __future__ import annotations

import math
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
    **marks: Any,
) -> Any:
    """A leaf field: its default (or a ``factory`` for a mutable one) and its help text,
    kept in the field's metadata for ``--help KEY`` and docs/configuration.md. ``kind``
    names the type in words where the annotation cannot (a field typed ``Any``);
    ``marks`` are further metadata (``inert``, ``tree``: see below)."""
    metadata = {"help": help, **marks} if kind is None else {"help": help, "type": kind, **marks}
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


def inert(
    default: Any = MISSING,
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    kind: str | None = None,
) -> Any:
    """A verl key accepted so that a verl command line runs unchanged, which changes
    nothing in this engine: ``help`` says what it does in verl and why not here. A run
    that sets one is told so in one line at start (``engine.config.given``)."""
    return setting(default, help, factory=factory, kind=kind, inert=True)


def tree(default: dict[str, Any], help: str, *, inert_tree: bool = True) -> Any:
    """A subtree of verl's keys held as one mapping with verl's default shape: a key
    under it that the default lacks is refused (``engine.config.verl_trees``), the
    values are not typed. ``inert_tree``: the subtree changes nothing here."""
    import copy

    def factory() -> dict[str, Any]:
        return copy.deepcopy(default)

    return setting(help=help, factory=factory, kind="mapping", tree=default, inert=inert_tree)


def mapping(help: str, factory: Callable[[], dict[str, Any]] = dict) -> Any:
    """A free-form mapping (keyword arguments passed on to a library): any key."""
    return setting(help=help, factory=factory, kind="mapping")


def divisors_near(n: int, around: int, count: int = 3) -> list[int]:
    """The ``count`` divisors of ``n`` nearest ``around``. Divisors come in pairs d, n/d
    with d <= √n: the search stops there (a batch of 10**12 must not hang validation)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    divisors = set(small) | {n // d for d in small}
    return sorted(sorted(divisors, key=lambda d: (abs(d - around), d))[:count])
