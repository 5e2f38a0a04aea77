"""Composition: defaults, then a base mapping, a YAML file and Hydra-style ``key=value``
overrides (``load_config``), each key checked against the schema (``key_problems``); and
the resolved config back as YAML (``to_yaml``)."""

from __future__ import annotations

import copy
import difflib
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.config.aliases import dotted_to_schema, nested_to_schema, uses_alias
from engine.config.engine import EngineConfig
from engine.config.fields import selected
from engine.config.keys import config_keys, expected, schema_leaf
from engine.config.rules import validate
from engine.errors import ConfigError


def load_config(
    overrides: Sequence[str] = (),
    config_file: str | Path | None = None,
    base: Mapping[str, Any] | None = None,
    check: bool = True,
) -> EngineConfig:
    """Build an ``EngineConfig``: defaults, then ``base`` (a nested mapping), then a YAML
    ``config_file``, then Hydra-style ``overrides`` (``a.b=c``, ``a=[1,2]``, ``a=null``).

    Unknown keys and values of the wrong type raise ``ConfigError`` naming the key; with
    ``check`` every cross-field rule of ``validate`` is applied too.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = copy.deepcopy(_schema())
    layers: list[tuple[str, Any]] = []
    if base is not None:
        layers.append(("base config", dict(base)))
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError([f"config file {str(path)!r} does not exist"])
        layers.append((str(path), OmegaConf.load(path)))
    for source, layer in layers:
        if uses_alias(layer):  # verl's other spellings (``aliases``)
            plain = (
                OmegaConf.to_container(layer, resolve=False)
                if OmegaConf.is_config(layer)
                else layer
            )
            layer = nested_to_schema(plain, source)
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as exc:
            raise ConfigError([_omegaconf_problem(exc, source)]) from None

    problems = []
    for key, value in dotted_to_schema(_parse_overrides(overrides), "overrides"):
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException as exc:
            problems.append(_omegaconf_problem(exc, f"override {key}={value!r}"))
    if problems:
        raise ConfigError(problems)

    try:
        OmegaConf.resolve(cfg)
        result: EngineConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        raise ConfigError([_omegaconf_problem(exc, "config")]) from None
    untyped = [p for k in _PATH_KEYS if (p := _paths_problem(k, selected(result, k)))]
    if untyped:
        raise ConfigError(untyped)
    if check:
        validate(result)
    return result


@functools.cache
def _schema() -> Any:
    """The schema as OmegaConf's structured config, made once (the slowest step of a
    load); ``load_config`` works on a copy."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(EngineConfig)


def key_problems(dotted: Mapping[str, Any]) -> list[str]:
    """Each dotted key checked alone against the schema (it exists, and its value has the
    key's type; no cross-field rules), one problem a line as ``load_config`` words them
    for a base mapping: every bad key, not only the first one a merge meets."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    def nested(key: str, value: Any) -> dict[str, Any]:
        for part in reversed(key.split(".")):
            value = {part: value}
        return value

    try:
        renamed = dotted_to_schema(list(dotted.items()), "base config")
    except ConfigError as exc:
        return list(exc.problems)
    problems = []
    for key, value in renamed:
        try:
            merged = OmegaConf.merge(_schema(), nested(key, value))
            if isinstance(value, str) and "${" in value:  # an interpolation: resolved here
                OmegaConf.select(merged, key, throw_on_resolution_failure=True)
        except OmegaConfBaseException as exc:
            problems.append(_omegaconf_problem(exc, "base config"))
            continue
        if key in _PATH_KEYS and (problem := _paths_problem(key, value)):
            problems.append(f"base config: {problem}")
    return problems


# Keys the schema types as Any (a path or a list of paths): checked here instead.
_PATH_KEYS = ("data.train_files", "data.val_files")


def _paths_problem(key: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):  # None: none (as an empty list)
        return None
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return None
    return f"{key}: expected a path or a list of paths, got {_short(value)}"


# Line breaks besides \n that YAML readers fold inside a quoted scalar: a value holding
# one is written double-quoted, where they are escapes (\N, \L, \P) and survive.
_YAML_SPECIAL_BREAKS = ("\x85", "\u2028", "\u2029")


@functools.cache
def _yaml_dumper() -> type:
    """OmegaConf's YAML dumper, except that a string holding one of the special breaks is
    written double-quoted (made once: a representer is registered on the class)."""
    import yaml
    from omegaconf._utils import get_omega_conf_dumper

    base = get_omega_conf_dumper()

    class Dumper(base):  # type: ignore[misc, valid-type]
        pass

    def represent_str(dumper: yaml.Dumper, data: str) -> yaml.ScalarNode:
        if any(ch in data for ch in _YAML_SPECIAL_BREAKS):
            return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
        return base.str_representer(dumper, data)

    Dumper.add_representer(str, represent_str)
    return Dumper


def to_yaml(cfg: EngineConfig) -> str:
    """The config as YAML (OmegaConf's layout), every string read back as written."""
    import yaml
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    return yaml.dump(
        container,
        default_flow_style=False,
        allow_unicode=True,
        sort_keys=False,
        Dumper=_yaml_dumper(),
    )


def _parse_overrides(overrides: Sequence[str]) -> list[tuple[str, Any]]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed = []
    problems = []
    for line in overrides:
        try:
            (override,) = parser.parse_overrides([line])
        except OverrideParseException as exc:
            problems.append(f"cannot parse override {line!r}: {exc.message.splitlines()[0]}")
            continue
        if override.is_sweep_override():
            problems.append(
                f"override {line!r} is a sweep; the engine runs one config: give a single value"
            )
            continue
        if override.is_delete():
            problems.append(f"override {line!r} deletes a key; schema keys cannot be removed")
            continue
        parsed.append((override.key_or_group, override.value()))
    if problems:
        raise ConfigError(problems)
    return parsed


def _omegaconf_problem(exc: Exception, source: str) -> str:
    """One line from an OmegaConf error: the key, what was wrong, and for a typo the fix."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    key = getattr(exc, "full_key", None) or ""
    msg = str(getattr(exc, "msg", None) or exc).splitlines()[0]
    if isinstance(exc, ConfigKeyError | ConfigAttributeError):
        close = difflib.get_close_matches(key, config_keys(), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{source}: unknown key {key!r}{hint}"
    leaf = schema_leaf(key) if key else None
    wrong_type = ("could not be converted", "is not a valid", "Incompatible value", "is not a List")
    if leaf is not None and hasattr(exc, "value") and any(w in msg for w in wrong_type):
        kind, default = leaf
        example = "" if default is None else f" (the default is {_short(default)})"
        return (
            f"{source}: {key}: expected {expected(kind)}, got {_short(exc.value)};"
            f" give {expected(kind)}{example}"
        )
    return f"{source}: {key + ': ' if key else ''}{msg}"


def _short(value: Any, limit: int = 60) -> str:
    """A value as a person wrote it, cut short: messages repeat what the user gave."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
