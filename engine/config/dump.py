"""The resolved config back as YAML: whole (``--print-config``), compact (what a job
carries: verl's keys that change nothing here are left out at their defaults), or in
verl's layout (``--cfg job``: every key also under verl's own spelling of it)."""

from __future__ import annotations

import copy
import enum
import functools
import typing
from dataclasses import fields, is_dataclass
from typing import Any

from engine.config.engine import EngineConfig

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


def to_yaml(cfg: Any, compact: bool = False) -> str:
    """The config (``EngineConfig``, or another trainer's: SFT's) as YAML (OmegaConf's
    layout), every string read back as written. ``compact``: without the keys that
    change nothing here, where they have their defaults (a job's engine YAML, which
    people read)."""
    container = _container(cfg)
    if compact:
        _drop_inert_defaults(container, type(cfg)())
    return dump(container)


def verl_yaml(cfg: EngineConfig) -> str:
    """The config in verl's layout (``--cfg job``): the whole config, and each value this
    engine reads under its own name also under verl's current spelling of the key."""
    from engine.config.aliases import nest, shown_aliases

    container = _container(cfg)
    flat = _flat(container)
    extra = [(alias, copy.deepcopy(flat[key])) for alias, key in shown_aliases(cfg) if key in flat]
    return dump(_merge(container, nest(extra)))


def _container(cfg: Any) -> dict[str, Any]:
    """The config as plain data, as OmegaConf's ``to_container(structured(cfg),
    enum_to_str=True)`` gives it, walked directly: OmegaConf builds a node per key first,
    which made this most of a job's render (0.16 s of 0.26)."""
    return _plain_data(cfg, None)  # type: ignore[return-value]


def _plain_data(value: Any, hint: Any) -> Any:
    if is_dataclass(value):
        hints = _hints(type(value))
        return {
            f.name: _plain_data(getattr(value, f.name), hints[f.name])
            for f in fields(value)
            if f.metadata.get("omegaconf_ignore") is not True
        }
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, dict):
        return {k: _plain_data(v, None) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_data(v, None) for v in value]
    # A float key given a whole number holds it as a float in OmegaConf (1 -> 1.0).
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """Each field's type, ``float | None`` read as ``float`` (the only one that changes
    a value here)."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        out[name] = args[0] if len(args) == 1 and typing.get_args(hint) else hint
    return out


def _drop_inert_defaults(node: dict[str, Any], default: Any) -> None:
    """Remove the inert leaves (``fields.inert``, ``fields.tree``) equal to their
    defaults, the sections left empty, and an optional section (``omit_when_default``:
    a feature that is off) left at its defaults."""
    for f in fields(default):
        value = getattr(default, f.name)
        if f.metadata.get("omit_when_default") and node.get(f.name) == _plain_data(value, None):
            del node[f.name]
        elif is_dataclass(value):
            _drop_inert_defaults(node[f.name], value)
            if not node[f.name]:
                del node[f.name]
        elif f.metadata.get("inert") and node.get(f.name) == _plain(value):
            del node[f.name]


def _plain(value: Any) -> Any:
    return copy.deepcopy(value)


def _flat(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in node.items():
        out[f"{prefix}{key}"] = value
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
    return out


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into.setdefault(key, value)
    return into


def dump(container: dict[str, Any]) -> str:
    import yaml

    return yaml.dump(
        container,
        default_flow_style=False,
        allow_unicode=True,
        sort_keys=False,
        Dumper=_yaml_dumper(),
    )
