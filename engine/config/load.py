"""Composition: defaults, then verl's config choices (``compose``), a base mapping, a
YAML file and Hydra-style ``key=value`` overrides (``load``, ``load_config``), verl's
spellings read as the schema's (``aliases``); and a mapping's keys checked alone
against the schema (``key_problems``). YAML output is in ``dump``."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config.aliases import (
    PPO_NAMES,
    Names,
    canonical_value,
    dotted_to_schema,
    flatten,
    nest,
    nested_to_schema,
)
from engine.config.async_training import apply_defaults as async_defaults
from engine.config.compose import PPO_GROUPS, Groups, Layer, compose_file, group_preset, is_group
from engine.config.engine import EngineConfig
from engine.config.fields import selected
from engine.config.keys import config_keys, expected, schema_leaf
from engine.config.rules import validate
from engine.config.suggest import unknown_key_message
from engine.config.verl_trees import tree_problems
from engine.errors import ConfigError


@dataclass(frozen=True)
class Schema:
    """One trainer's command line, as the loader reads it: the root of its typed config,
    verl's other spellings of its keys, its Hydra config groups, its rules (``validate``:
    raises one ConfigError), the conventions applied once the keys are read
    (``conventions(cfg, given)``), its keys typed ``Any`` that hold paths, and the
    program that reads it (for messages). ``key_groups``: groups that are keys too
    (verl's ``model_engine``)."""

    root: type
    names: Names
    groups: Groups
    validate: Callable[[Any], None]
    conventions: Callable[[Any, list[str]], None]
    path_keys: tuple[str, ...]
    program: str
    key_groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Loaded:
    """A config and what the run gave to make it: the dotted schema keys set by the
    base mapping, the files and the overrides (verl's spellings renamed), and Hydra's
    own settings (``hydra.*``), which change nothing here."""

    config: Any  # the schema's root: EngineConfig for the RL trainer
    given: tuple[str, ...] = ()
    hydra: tuple[str, ...] = ()


def load_config(
    overrides: Sequence[str] = (),
    config_file: str | Path | None = None,
    base: Mapping[str, Any] | None = None,
    check: bool = True,
    config_path: str | None = None,
    config_name: str | None = None,
) -> EngineConfig:
    """Build an ``EngineConfig``: defaults, then ``base`` (a nested mapping), then a YAML
    ``config_file`` (or Hydra's ``config_path``/``config_name`` pair), then Hydra-style
    ``overrides`` (``a.b=c``, ``a=[1,2]``, ``a=null``, ``+a=c``, ``~a``, group choices).

    Unknown keys and values of the wrong type raise ``ConfigError`` naming the key; with
    ``check`` every cross-field rule of ``validate`` is applied too.
    """
    return load(overrides, config_file, base, check, config_path, config_name).config


def load(
    overrides: Sequence[str] = (),
    config_file: str | Path | None = None,
    base: Mapping[str, Any] | None = None,
    check: bool = True,
    config_path: str | None = None,
    config_name: str | None = None,
    schema: Schema | None = None,
) -> Loaded:
    """``load_config``, with what the run gave (``Loaded``); ``schema``: the trainer's
    (``PPO``, the RL trainer's, when None; ``engine.config.sft.SFT``)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    schema = schema or PPO
    parsed = _parse_overrides(overrides, schema)
    files: list[Layer] = []
    if config_name is not None:
        files += compose_file(config_path, config_name, schema.groups)
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError([f"config file {str(path)!r} does not exist"])
        files.append(Layer(str(path), OmegaConf.to_container(OmegaConf.load(path), resolve=False)))
    # Choices of verl's configs fill defaults (as in Hydra): under everything the user
    # sets, the command line's choices over the files'.
    layers = [layer for layer in files if layer.preset] + parsed.presets
    if base is not None:
        layers.append(Layer("base config", dict(base)))
    layers += [layer for layer in files if not layer.preset]

    cfg = copy.deepcopy(_schema(schema.root))
    given: list[str] = []
    for layer in layers:
        if not isinstance(layer.keys, Mapping):
            raise ConfigError(
                [f"{layer.source}: a config must be a mapping of keys, got {_short(layer.keys)}"]
            )
        renamed = nested_to_schema(layer.keys, layer.source, schema.names)
        if not layer.preset:
            given += flatten(renamed)
        try:
            cfg.merge_with(renamed)  # in place: cfg is this load's own copy
        except OmegaConfBaseException as exc:
            raise ConfigError([_omegaconf_problem(exc, layer.source, schema)]) from None

    problems = []
    for key, value in dotted_to_schema(parsed.settings, "overrides", schema.names):
        given.append(key)
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException as exc:
            problems.append(_omegaconf_problem(exc, f"override {key}={value!r}", schema))
    for key in parsed.deletes:
        problems += _delete(cfg, key, schema)
    if problems:
        raise ConfigError(problems)
    _canonical_values(cfg, schema.names)

    try:
        OmegaConf.resolve(cfg)
        result = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError([_omegaconf_problem(exc, "config", schema)]) from None
    untyped = [p for k in schema.path_keys if (p := _paths_problem(k, selected(result, k)))]
    untyped += tree_problems(result)
    if untyped:
        raise ConfigError(untyped)
    schema.conventions(result, given)
    if check:
        schema.validate(result)
    return Loaded(result, tuple(dict.fromkeys(given)), tuple(parsed.hydra))


def apply_conventions(cfg: EngineConfig) -> None:
    """verl's conventions that stand for a value of another key, read as that value:
    Megatron's absolute ``optim.min_lr`` as ``min_lr_ratio``, and the fully async
    trainer's ``data.train_batch_size=0`` (a step of ``require_batches`` mini-batches)."""
    for optim in (cfg.actor_rollout_ref.actor.optim, cfg.critic.optim):
        if optim.min_lr > 0 and optim.min_lr_ratio == 0 and optim.lr > 0:
            optim.min_lr_ratio = optim.min_lr / optim.lr
    a = cfg.async_training
    if cfg.data.train_batch_size == 0 and a.mode == "fully_async":
        batches = 1 if a.require_batches is None else a.require_batches
        cfg.data.train_batch_size = batches * cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        a.require_batches = batches


def _ppo_conventions(cfg: EngineConfig, given: list[str]) -> None:
    apply_conventions(cfg)
    async_defaults(cfg, given)


@functools.cache
def _schema(root: type = EngineConfig) -> Any:
    """The schema as OmegaConf's structured config, made once (the slowest step of a
    load); ``load_config`` works on a copy."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(root)


def _canonical_values(cfg: Any, names: Names) -> None:
    """verl's names of values (``bf16``) as the schema's, where the user gave them."""
    from omegaconf import OmegaConf

    for key in names.values:
        value = OmegaConf.select(cfg, key)
        new = canonical_value(key, value, names)
        if new != value:
            OmegaConf.update(cfg, key, new, merge=False)


def _delete(cfg: Any, key: str, schema: Schema) -> list[str]:
    """Hydra's ``~key``: a schema key (or section) goes back to its default; an entry of
    a mapping (engine_kwargs.vllm.x) is removed."""
    from omegaconf import OmegaConf

    from engine.config.aliases import schema_key

    target = schema_key(key, schema.names)
    default = OmegaConf.select(_schema(schema.root), target, default=_MISSING)
    if default is not _MISSING:
        OmegaConf.update(cfg, target, copy.deepcopy(default), merge=False)
        return []
    parent_key, _, name = target.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else None
    if OmegaConf.is_dict(parent) and name in parent:
        del parent[name]
        return []
    return [f"override ~{key}: there is no such key to delete"]


_MISSING = object()


def key_problems(dotted: Mapping[str, Any], schema: Schema | None = None) -> list[str]:
    """Each dotted key checked alone against the schema (it exists, and its value has the
    key's type; no cross-field rules), one problem a line as ``load_config`` words them
    for a base mapping: every bad key, not only the first one a merge meets."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    schema = schema or PPO
    try:
        renamed = dotted_to_schema(list(dotted.items()), "base config", schema.names)
    except ConfigError as exc:
        return list(exc.problems)
    # All keys in one merge first (one copy of the schema: a valid mapping, the common
    # case, costs that alone); only when it fails, each key alone, to name every bad one.
    together = _merge_all(renamed, schema.root)
    problems = []
    for key, value in renamed:
        try:
            merged = (
                together
                if together is not None
                else OmegaConf.merge(_schema(schema.root), nest([(key, value)]))
            )
            if isinstance(value, str) and "${" in value:  # an interpolation: resolved here
                OmegaConf.select(merged, key, throw_on_resolution_failure=True)
        except OmegaConfBaseException as exc:
            problems.append(_omegaconf_problem(exc, "base config", schema))
            continue
        if key in schema.path_keys and (problem := _paths_problem(key, value)):
            problems.append(f"base config: {problem}")
    return problems


def _merge_all(renamed: list[tuple[str, Any]], root: type) -> Any:
    """The schema with every key merged, or None if any key fails (or two overlap, when
    a later one would hide an earlier one's value)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    keys = [key for key, _ in renamed]
    if len(set(keys)) < len(keys) or any(b.startswith(a + ".") for a in keys for b in keys):
        return None
    try:
        return OmegaConf.merge(_schema(root), nest(renamed))
    except OmegaConfBaseException:
        return None


# Keys the schema types as Any (one item or a list of them): checked here instead.
_PATH_KEYS = ("data.train_files", "data.val_files", "trainer.logger")

# verl's PPO trainer's command line (python -m engine.main)
PPO = Schema(
    root=EngineConfig,
    names=PPO_NAMES,
    groups=PPO_GROUPS,
    validate=validate,
    conventions=_ppo_conventions,
    path_keys=_PATH_KEYS,
    program="python -m engine.main",
    key_groups=("model_engine",),
)
_WHAT = {"trainer.logger": "a name or a list of names"}


def _paths_problem(key: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):  # None: none (as an empty list)
        return None
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return None
    what = _WHAT.get(key, "a path or a list of paths")
    return f"{key}: expected {what}, got {_short(value)}"


@dataclass
class _Overrides:
    settings: list[tuple[str, Any]]
    deletes: list[str]
    presets: list[Layer]  # group choices
    hydra: list[str]  # Hydra's own settings


def _parse_overrides(overrides: Sequence[str], schema: Schema) -> _Overrides:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    out = _Overrides([], [], [], [])
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
        key = override.key_or_group
        if key == "hydra" or key.startswith("hydra."):
            out.hydra.append(line)
        elif override.is_delete():
            out.deletes.append(key)
        elif override.package is not None or (
            is_group(key, schema.groups)
            and key not in schema.key_groups
            and schema_leaf(key, schema.root) is None
        ):
            # a group choice (actor@actor_rollout_ref.actor=megatron_actor)
            try:
                preset = group_preset(
                    key, override.package, override.value(), "overrides", schema.groups
                )
            except ConfigError as exc:
                problems += exc.problems
                continue
            out.presets.append(Layer(f"override {line}", nest(list(preset.items())), True))
        elif key in schema.key_groups:  # verl's engine family: a group choice and a key
            try:
                preset = group_preset(key, None, override.value(), "overrides", schema.groups)
            except ConfigError as exc:
                problems += exc.problems
                continue
            out.presets.append(Layer(f"override {line}", nest(list(preset.items())), True))
            out.settings.append((key, override.value()))
        else:  # key=value, +key=value, ++key=value: the schema decides what exists
            out.settings.append((key, override.value()))
    if problems:
        raise ConfigError(problems)
    return out


def _omegaconf_problem(exc: Exception, source: str, schema: Schema | None = None) -> str:
    """One line from an OmegaConf error: the key, what was wrong, and for a typo the fix."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    schema = schema or PPO
    key = getattr(exc, "full_key", None) or ""
    msg = str(getattr(exc, "msg", None) or exc).splitlines()[0]
    if isinstance(exc, ConfigKeyError | ConfigAttributeError):
        return unknown_key_message(key, config_keys(schema.root), source, schema.program)
    leaf = schema_leaf(key, schema.root) if key else None
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
