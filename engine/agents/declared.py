"""Files that declare classes by name: the interactions file and the agent loops file.

Each entry names a class (a built-in's name, or ``file.py:Class`` read from beside the
file) and the config it is built with, once, as ``cls(config)``. Every problem comes
back at once, each with the entry, the key and the fix, as one ``ConfigError``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from engine.agents.tools.schemas import short
from engine.algo.registry import Registry, unknown_name_message
from engine.errors import ConfigError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class Declared:
    """One kind of file: what its entries are, where they are listed, what they take."""

    what: str  # "interaction", "agent loop": for messages
    list_key: str | None  # the mapping key the entries are listed under; None: a bare list
    class_keys: tuple[str, ...]  # the entry keys that may name the class (the first wins)
    builtins: Registry[Any]
    reserved: tuple[str, ...] = ()  # names an entry may not take (the built-in loops)
    check_class: Callable[[Any], str | None] | None = None  # what is wrong with it, or None
    docs: str = "docs/agents.md"

    @property
    def entry_keys(self) -> tuple[str, ...]:
        return ("name", *self.class_keys, "config")


def load_declared(path: str | Path, kind: Declared) -> dict[str, Any]:
    """The classes a file declares, built, by name."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError([f"{path}: no such file; give the {kind.what}s file's path"])
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None
    return parse_declared(data, kind, source=str(path), base_dir=file.parent)


def parse_declared(
    data: Any, kind: Declared, *, source: str, base_dir: str | Path = "."
) -> dict[str, Any]:
    entries = data.get(kind.list_key) if kind.list_key and isinstance(data, Mapping) else data
    if not isinstance(entries, list) or not entries:
        where = f"a non-empty '{kind.list_key}:' list" if kind.list_key else "a non-empty list"
        raise ConfigError([f"{source}: expected {where} of {{{', '.join(kind.entry_keys)}}}"])
    problems: list[str] = []
    built: dict[str, Any] = {}
    seen: set[str] = set()
    label = kind.list_key or kind.what.replace(" ", "_")
    for i, entry in enumerate(entries):
        where = f"{source}: {label}[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{where}: expected a mapping with {', '.join(kind.entry_keys)}")
            continue
        unknown = sorted(set(entry) - set(kind.entry_keys))
        if unknown:
            problems.append(f"{where}: unknown keys {unknown}; use {', '.join(kind.entry_keys)}")
        class_key = next((k for k in kind.class_keys if k in entry), kind.class_keys[0])
        class_value = entry.get(class_key)
        name = entry.get("name", class_value)
        problem = _name_problem(name, kind, seen)
        if problem:
            problems.append(f"{where}.name: {problem}")
            continue
        seen.add(name)
        config = entry.get("config") or {}
        if not isinstance(config, Mapping):
            problems.append(f"{where}.config: expected a mapping, got {short(config)}")
            continue
        cls = _class(class_value, f"{where}.{class_key}", Path(base_dir), kind, problems)
        if cls is None:
            continue
        known = getattr(cls, "CONFIG_KEYS", None)
        extra = sorted(set(config) - set(known)) if known is not None else []
        if extra:
            problems.append(f"{where}.config: {extra} not taken; {name!r} takes {', '.join(known)}")
            continue
        try:
            built[name] = cls(dict(config))
        except ConfigError as exc:
            problems += [f"{where}: {p}" for p in exc.problems]
        except Exception as exc:
            problems.append(
                f"{where}: building {short(class_value)} failed: {type(exc).__name__}: {exc}"
            )
    if problems:
        raise ConfigError(problems)
    return built


def _name_problem(name: Any, kind: Declared, seen: set[str]) -> str | None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return f"{short(name)} is not a name (letters, digits, _.-)"
    if name in kind.reserved:
        return f"{name!r} is a built-in {kind.what}'s name; give yours another"
    if name in seen:
        return f"{name!r} is declared twice; names must be unique"
    return None


def _class(value: Any, key: str, base: Path, kind: Declared, problems: list[str]) -> Any:
    """A built-in's class, or ``file.py:Class`` loaded from beside the file."""
    if isinstance(value, str) and ":" in value and value.split(":")[0].endswith(".py"):
        from engine.reward.custom import load_custom_function
        from engine.reward.types import RewardError

        path, _, attr = value.partition(":")
        full = Path(path) if Path(path).is_absolute() else base / path
        try:
            cls = load_custom_function(full, attr, path_key=key, name_key=key)
        except RewardError as exc:
            problems.append(str(exc))
            return None
        wrong = kind.check_class(cls) if kind.check_class else None
        if wrong:
            problems.append(f"{key}: {value}: {wrong}")
            return None
        return cls
    if isinstance(value, str) and value in kind.builtins:
        return kind.builtins.get(value)
    hint = ""
    if isinstance(value, str) and "." in value and ":" not in value:
        hint = f" (a dotted class path, as verl's, is not read: write the class as file.py:Class, {kind.docs})"
    problems.append(
        f"{key}: {short(value)}: "
        + unknown_name_message(f"built-in {kind.what}", str(value), list(kind.builtins.names()))
        + f"; or give a class as file.py:Class{hint}"
    )
    return None
