"""verl's other spellings of a key: read as the key the schema holds (``load_config``,
``key_problems``), so that a newer verl command line carries over too.

verl moved the Ulysses size into each role's engine block (``fsdp_config`` for the
actor and the reference; the critic's moved from ``critic.model.fsdp_config`` to
``critic.fsdp``) and kept the old keys, deprecated. Here the old key is the field and
the new ones are aliases: one value, whichever spelling set it. A source (the base
mapping, one YAML file, the overrides) that sets a key under two spellings with
different values is refused naming both: which one wins would be a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.errors import ConfigError

# alias -> the schema's key
ALIASES = {
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    ),
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size"
    ),
    "critic.fsdp.ulysses_sequence_parallel_size": "critic.ulysses_sequence_parallel_size",
    "critic.model.fsdp_config.ulysses_sequence_parallel_size": (
        "critic.ulysses_sequence_parallel_size"
    ),
}


def aliases_of(key: str) -> list[str]:
    """The other spellings of a schema key (for its help text)."""
    return [alias for alias, target in ALIASES.items() if target == key]


def dotted_to_schema(pairs: Sequence[tuple[str, Any]], source: str) -> list[tuple[str, Any]]:
    """``(key, value)`` pairs with every alias renamed to its key; two spellings of one
    key with different values raise ``ConfigError`` naming both."""
    seen: dict[str, tuple[str, Any]] = {}
    problems = []
    renamed = []
    for key, value in pairs:
        target = ALIASES.get(key, key)
        if target in seen and key != seen[target][0] and seen[target][1] != value:
            problems.append(_conflict(source, seen[target], (key, value)))
        seen[target] = (key, value)
        renamed.append((target, value))
    if problems:
        raise ConfigError(problems)
    return renamed


def uses_alias(layer: Mapping[str, Any]) -> bool:
    """Whether a nested mapping spells a key as one of its aliases."""
    for alias in ALIASES:
        parts = alias.split(".")
        parent = _walk(layer, parts[:-1])
        if parent is not None and parts[-1] in parent:
            return True
    return False


def nested_to_schema(layer: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A nested mapping (a YAML file, a base config) with the aliases' values moved to
    their keys; a section the move leaves empty is dropped (``critic.fsdp`` is no
    section of the schema)."""
    tree = _copy(layer)
    found = []
    for alias in ALIASES:
        parts = alias.split(".")
        parent = _walk(tree, parts[:-1])
        if parent is not None and parts[-1] in parent:
            found.append((alias, parent.pop(parts[-1])))
            _prune(tree, parts[:-1])
    for key in set(ALIASES.values()):
        parts = key.split(".")
        parent = _walk(tree, parts[:-1])
        if parent is not None and parts[-1] in parent:
            found.insert(0, (key, parent[parts[-1]]))
    for key, value in dotted_to_schema(found, source):
        parts = key.split(".")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return tree


def _conflict(source: str, first: tuple[str, Any], second: tuple[str, Any]) -> str:
    (a, x), (b, y) = first, second
    return (
        f"{source}: {a}={x!r} and {b}={y!r} set the same value (verl's two spellings of"
        f" it); give one of them"
    )


def _copy(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {k: _copy(v) for k, v in node.items()}
    return node


def _walk(tree: Mapping[str, Any], parts: list[str]) -> Any:
    """The mapping at ``parts`` of ``tree``; None where there is none."""
    node: Any = tree
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, Mapping) else None


def _prune(tree: dict[str, Any], parts: list[str]) -> None:
    """Drop the empty sections left along ``parts``, deepest first."""
    for depth in range(len(parts), 0, -1):
        parent = _walk(tree, parts[: depth - 1])
        if parent is not None and parent.get(parts[depth - 1]) == {}:
            del parent[parts[depth - 1]]
