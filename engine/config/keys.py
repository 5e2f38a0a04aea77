"""The schema as a list of dotted keys: each leaf's type, default and help text, each
section's description; for error messages, ``--help KEY`` and docs/configuration.md."""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from engine.config.engine import EngineConfig


@dataclass(frozen=True)
class Leaf:
    """A key that holds a value: its annotation, default (as the whole config's default
    sets it: ``critic.optim.lr`` is the critic's own) and help text."""

    key: str
    kind: Any
    default: Any
    help: str
    type_words: str | None = None  # the type in words, where the annotation is Any

    @property
    def type_name(self) -> str:
        return self.type_words or type_name(self.kind)


def config_keys(cls: type = EngineConfig, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the schema whose root is ``cls`` (for suggestions and
    docs): ``EngineConfig``, the RL trainer's, or another trainer's root (SFT's)."""
    if not prefix:
        return [leaf.key for leaf in _leaves(cls)]
    return [leaf.key for leaf in _walk(cls(), prefix)]


def schema_leaf(key: str, root: type = EngineConfig) -> tuple[Any, Any] | None:
    """(type, default) of the schema's value at a dotted key; None where the key names
    no value (unknown, or a section of keys)."""
    found = leaf(key, root)
    return None if found is None else (found.kind, found.default)


def leaf(key: str, root: type = EngineConfig) -> Leaf | None:
    """The leaf at a dotted key; None where the key names no value."""
    return _by_key(root).get(key)


def leaves(prefix: str = "", root: type = EngineConfig) -> list[Leaf]:
    """The leaves under a section (``actor_rollout_ref.rollout``), in schema order; all
    of them for an empty prefix."""
    start = f"{prefix}." if prefix else ""
    return [leaf for leaf in _leaves(root) if leaf.key.startswith(start)]


def sections(root: type = EngineConfig) -> dict[str, str]:
    """Every section's dotted key ("" for the whole config) -> its description (the first
    paragraph of its class's docstring), in schema order."""
    return dict(_sections(root))


def type_name(kind: Any) -> str:
    """A schema type, short: ``int | None`` -> "int or null", ``list[str]`` -> "list[str]"."""
    return _type_in_words(kind, short=True)


def expected(kind: Any) -> str:
    """A schema type in words: ``int | None`` -> "a whole number or null"."""
    return _type_in_words(kind, short=False)


_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}


def _type_in_words(kind: Any, short: bool) -> str:
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_type_in_words(a, short) for a in inner) + (
            " or null" if len(inner) < len(args) else ""
        )
    if typing.get_origin(kind) is list:
        if short:
            return f"list[{_type_in_words(args[0], short) if args else 'any'}]"
        return f"a list of {_type_in_words(args[0], short) if args else 'values'}"
    name = getattr(kind, "__name__", str(kind))
    return name if short else _WORDS.get(kind, name)


@functools.cache
def _leaves(root: type) -> tuple[Leaf, ...]:
    return tuple(_walk(root(), ""))


@functools.cache
def _by_key(root: type) -> dict[str, Leaf]:
    return {leaf.key: leaf for leaf in _leaves(root)}


@functools.cache
def _sections(root: type) -> tuple[tuple[str, str], ...]:
    found = [("", _description(root))]

    def visit(node: Any, prefix: str) -> None:
        for f in fields(node):
            value = getattr(node, f.name)
            if is_dataclass(value):
                found.append((prefix + f.name, _description(type(value))))
                visit(value, f"{prefix}{f.name}.")

    visit(root(), "")
    return tuple(found)


def _walk(node: Any, prefix: str) -> Iterator[Leaf]:
    hints = typing.get_type_hints(type(node))
    for f in fields(node):
        value = getattr(node, f.name)
        key = prefix + f.name
        if is_dataclass(value):
            yield from _walk(value, f"{key}.")
        else:
            yield Leaf(
                key, hints[f.name], value, f.metadata.get("help", ""), f.metadata.get("type")
            )


def _description(cls: type) -> str:
    """The first paragraph of a section class's own docstring, on one line."""
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):  # the signature dataclass writes when there is none
        return ""
    first = inspect.cleandoc(doc).split("\n\n")[0]
    return " ".join(first.replace("``", "`").split())  # Markdown's code, not RST's
