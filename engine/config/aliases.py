"""verl's other spellings of a key (the table is ``verl_names``), read as the key the
schema holds: for the overrides (``dotted_to_schema``), for a YAML file or a base
mapping (``nested_to_schema``), and verl's names of values (``bf16``) as the schema's
(``canonical_value``). One value, whichever spelling set it: a source (the base
mapping, one YAML file, the overrides) that sets a key under two spellings with
different values is refused naming both, since which one wins would be a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.config.verl_names import ALIASES, PREFIX_ALIASES, VALUE_ALIASES
from engine.errors import ConfigError

__all__ = ["ALIASES", "PPO_NAMES", "PREFIX_ALIASES", "VALUE_ALIASES", "Names"]


@dataclass(frozen=True)
class Names:
    """One trainer's table of verl's other spellings: exact aliases, prefix aliases (a
    key under the prefix is the key under the target) and value names, each schema key
    -> verl's name of a value -> the schema's."""

    aliases: Mapping[str, str]
    prefixes: Mapping[str, str]
    values: Mapping[str, Mapping[str, str]]


PPO_NAMES = Names(ALIASES, PREFIX_ALIASES, VALUE_ALIASES)  # the RL trainer's (verl_names)


def schema_key(key: str, names: Names = PPO_NAMES) -> str:
    """The schema's spelling of ``key`` (itself when it has no other): exact aliases
    first, then the longest prefix alias, until neither applies."""
    for _ in range(4):  # chains are at most two long (critic.fsdp.X -> critic.fsdp_config.X -> ...)
        if key in names.aliases:
            key = names.aliases[key]
            continue
        prefix = max((p for p in names.prefixes if key.startswith(p)), key=len, default=None)
        if prefix is None:
            return key
        key = names.prefixes[prefix] + key[len(prefix) :]
    return key


def aliases_of(key: str, names: Names = PPO_NAMES) -> list[str]:
    """The other spellings of a schema key (for its help text): exact ones, and the
    key under each prefix alias that leads to it."""
    found = [alias for alias in names.aliases if schema_key(alias, names) == key]
    for prefix, target in names.prefixes.items():
        if key.startswith(target):
            found.append(prefix + key[len(target) :])
    return found


def canonical_value(key: str, value: Any, names: Names = PPO_NAMES) -> Any:
    """verl's name of a value as the schema's (``bf16`` -> ``bfloat16``)."""
    values = names.values.get(key)
    if values and isinstance(value, str):
        return values.get(value, value)
    return value


def dotted_to_schema(
    pairs: Sequence[tuple[str, Any]], source: str, names: Names = PPO_NAMES
) -> list[tuple[str, Any]]:
    """``(key, value)`` pairs with every alias renamed to its key; two spellings of one
    key with different values raise ``ConfigError`` naming both."""
    seen: dict[str, tuple[str, Any]] = {}
    problems = []
    renamed = []
    for key, value in pairs:
        target = schema_key(key, names)
        if target in seen and key != seen[target][0] and seen[target][1] != value:
            problems.append(_conflict(source, seen[target], (key, value)))
        seen[target] = (key, value)
        renamed.append((target, value))
    if problems:
        raise ConfigError(problems)
    return renamed


def nested_to_schema(
    layer: Mapping[str, Any], source: str, names: Names = PPO_NAMES
) -> dict[str, Any]:
    """A nested mapping (a YAML file, a base config) with every alias's value moved to
    its key."""
    return nest(dotted_to_schema(list(flatten(layer).items()), source, names))


def flatten(layer: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted leaves; an empty mapping is a leaf ({})."""
    out: dict[str, Any] = {}
    for key, value in layer.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def nest(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """Dotted ``(key, value)`` pairs as a nested mapping (later pairs win)."""
    tree: dict[str, Any] = {}
    for key, value in pairs:
        *parents, last = key.split(".")
        node = tree
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[last] = value
    return tree


def _conflict(source: str, first: tuple[str, Any], second: tuple[str, Any]) -> str:
    (a, x), (b, y) = first, second
    return (
        f"{source}: {a}={x!r} and {b}={y!r} set the same value (verl's two spellings of"
        f" it); give one of them"
    )


# Spellings verl itself no longer writes: read, but not shown by --cfg job.
_OLD = ("critic.model.fsdp_config.", "reward.reward_kwargs.")


def shown_aliases(cfg: object) -> list[tuple[str, str]]:
    """(verl's spelling, the schema's key) of every value ``--cfg job`` shows twice: each
    alias verl's current schema has (the VeOmni engine's only under model_engine=veomni)."""
    veomni = getattr(cfg, "model_engine", None) == "veomni"
    pairs = [
        *((alias, schema_key(alias)) for alias in ALIASES),
        *((prefix.rstrip("."), target.rstrip(".")) for prefix, target in PREFIX_ALIASES.items()),
        # an alias inside a renamed section, under the section's verl name too
        *(
            (prefix + alias[len(target) :], schema_key(alias))
            for alias in ALIASES
            for prefix, target in PREFIX_ALIASES.items()
            if alias.startswith(target)
        ),
    ]
    return [
        (alias, key)
        for alias, key in pairs
        if not any(old in alias for old in _OLD) and (veomni or ".veomni." not in alias)
    ]
