"""Hydra's composition as a verl command line uses it, on this engine's schema:

- a group choice (``model_engine=megatron``, ``actor@actor_rollout_ref.actor=megatron_actor``)
  picks one of verl's config files for a section; here each choice is a preset of
  schema keys (``GROUPS``), applied under everything the user sets;
- ``--config-path DIR --config-name NAME`` names the run's config file: a YAML file of
  verl's layout, whose ``defaults:`` list may name verl's bundled configs
  (``ppo_trainer``, ``ppo_megatron_trainer``), other files beside it, group choices and
  ``_self_`` (where the file's own keys go). A name that is no file there but one of
  verl's bundled configs is that config here (``--config-path=config
  --config-name=ppo_megatron_trainer`` in verl's examples).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ConfigError

_ROLES = {
    "actor": "actor_rollout_ref.actor",
    "ref": "actor_rollout_ref.ref",
    "critic": "critic",
}
_FAMILY_STRATEGY = {"dp": "fsdp", "megatron": "megatron", "veomni": "veomni"}


def _strategies(family: str, roles: tuple[str, ...] = tuple(_ROLES)) -> dict[str, Any]:
    return {f"{_ROLES[r]}.strategy": _FAMILY_STRATEGY[family] for r in roles}


def _engine_choice(family: str) -> dict[str, Any]:
    return {"model_engine": family, **_strategies(family)}


# group -> choice -> preset (dotted schema keys); a choice of verl's that configures
# what the engine's defaults already are is an empty preset.
GROUPS: dict[str, dict[str, dict[str, Any]]] = {
    "model_engine": {family: _engine_choice(family) for family in _FAMILY_STRATEGY},
    **{
        group: {
            group: {},  # the base file, which the per-engine ones build on
            f"dp_{group}": _strategies("dp", (group,)),
            f"megatron_{group}": _strategies("megatron", (group,)),
            f"veomni_{group}": _strategies("veomni", (group,)),
        }
        for group in _ROLES
    },
    "rollout": {"rollout": {}},
    "model": {"hf_model": {}},
    "data": {"legacy_data": {}},
    "reward": {"reward": {}},
    "algorithm": {"rollout_correction": {}},
    "distillation": {"distillation": {}},
    "transfer_queue": {"transfer_queue": {}},
    "legacy_reward_impl": {"legacy_reward_impl": {}},
    "profiler": {"profiler": {}},
    "npu_profile": {"npu_profile": {}},
    "optim": {name: {} for name in ("fsdp", "megatron", "veomni")},
    "engine": {name: {} for name in ("fsdp", "megatron", "veomni")},
}
# Choices of verl's (or its plugins') that name engines this one lacks.
_LACKING_CHOICES = {
    "torchtitan": "verl's TorchTitan engine is not in this engine; use dp (fsdp2) or megatron",
    "automodel": "verl's AutoModel engine is not in this engine; use dp (fsdp2) or megatron",
    "mlite": (
        "mlite is verl's Megatron-lite plugin engine (a config group of the verl_mlite"
        " package), not in this engine; use megatron_actor (strategy=megatron) with its"
        " actor_rollout_ref.actor.megatron.* sizes"
    ),
}

# verl's bundled top-level configs: what each is on this schema.
BUNDLED: dict[str, dict[str, Any]] = {
    "ppo_trainer": {},
    "ppo_megatron_trainer": _engine_choice("megatron"),
}


@dataclass(frozen=True)
class Groups:
    """One trainer's Hydra config groups: group -> choice -> preset (dotted schema keys),
    the choices of verl's that name what this engine lacks (-> why), and verl's bundled
    top-level configs (name -> preset)."""

    groups: Mapping[str, Mapping[str, Mapping[str, Any]]]
    lacking: Mapping[str, str]
    bundled: Mapping[str, Mapping[str, Any]]


PPO_GROUPS = Groups(GROUPS, _LACKING_CHOICES, BUNDLED)  # the RL trainer's


@dataclass(frozen=True)
class Layer:
    """Keys from one source, nested; a ``preset`` stands for a choice of verl's configs
    (a group choice, a bundled config), which the user's own keys override."""

    source: str
    keys: dict[str, Any]
    preset: bool = False


def is_group(name: str, known: Groups = PPO_GROUPS) -> bool:
    return name in known.groups


def group_preset(
    group: str, package: str | None, choice: Any, source: str, known: Groups = PPO_GROUPS
) -> dict[str, Any]:
    """The schema keys verl's ``group@package=choice`` sets (a ConfigError for a choice
    this engine does not have, with the ones it has)."""
    choices = known.groups.get(group)
    if choices is None:
        raise ConfigError([f"{source}: {group}: no config group of verl's by this name"])
    where = f"{group}@{package}" if package else group
    if choice in choices:
        return dict(choices[choice])
    for marker, why in known.lacking.items():
        if isinstance(choice, str) and marker in choice:
            raise ConfigError([f"{source}: {where}={choice}: {why}"])
    valid = ", ".join(choices)
    raise ConfigError([f"{source}: {where}={choice!r} is not one of verl's choices here: {valid}"])


def compose_file(
    config_path: str | None, config_name: str, known: Groups = PPO_GROUPS
) -> list[Layer]:
    """The layers a ``--config-path``/``--config-name`` pair stands for, lowest first."""
    name = config_name.removesuffix(".yaml").removesuffix(".yml")
    folder = Path(config_path or ".").expanduser()
    path = _find(folder, name)
    if path is None:
        if name in known.bundled:
            return [Layer(f"verl's {name}", _nest(known.bundled[name]), preset=True)]
        raise ConfigError(
            [
                f"--config-name {config_name}: no {name}.yaml in {folder}, and it is none of"
                f" verl's bundled configs ({', '.join(known.bundled)}): give the folder of"
                " your config file as --config-path"
            ]
        )
    return _compose(path, (), known)


def _find(folder: Path, name: str) -> Path | None:
    for suffix in (".yaml", ".yml"):
        candidate = folder / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def _compose(path: Path, seen: tuple[Path, ...], known: Groups) -> list[Layer]:
    from omegaconf import OmegaConf

    if path in seen:
        raise ConfigError([f"{path}: its defaults list includes itself"])
    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    if not isinstance(loaded, dict):
        raise ConfigError([f"{path}: a config file must be a mapping of keys"])
    defaults = loaded.pop("defaults", None) or []
    loaded.pop("hydra", None)  # Hydra's own settings (search path, output dir)
    own = Layer(str(path), loaded)
    layers: list[Layer] = []
    placed_self = False
    for entry in defaults:
        if entry == "_self_":
            layers.append(own)
            placed_self = True
        elif isinstance(entry, str):
            layers += _base(path, entry.removeprefix("/"), seen, known)
        elif isinstance(entry, Mapping) and len(entry) == 1:
            ((group, choice),) = entry.items()
            group = str(group).removeprefix("override ").strip()
            name, _, package = group.partition("@")
            if choice is None:  # "group: null" drops a default
                continue
            preset = group_preset(name, package or None, choice, str(path), known)
            layers.append(Layer(f"{path} ({group}={choice})", _nest(preset), preset=True))
        else:
            raise ConfigError([f"{path}: defaults entry {entry!r} is not one this engine reads"])
    if not placed_self:  # Hydra's default: the file's own keys last
        layers.append(own)
    return layers


def _base(path: Path, name: str, seen: tuple[Path, ...], known: Groups) -> list[Layer]:
    """A defaults entry naming a whole config: a file beside ``path``, or verl's own."""
    found = _find(path.parent, name.removesuffix(".yaml"))
    if found is not None:
        return _compose(found, (*seen, path), known)
    bundled = known.bundled.get(name.removesuffix(".yaml"))
    if bundled is not None:
        return [Layer(f"verl's {name}", _nest(bundled), preset=True)]
    raise ConfigError(
        [
            f"{path}: defaults names {name!r}, which is no file beside it nor one of verl's"
            f" bundled configs ({', '.join(known.bundled)})"
        ]
    )


def _nest(dotted: Mapping[str, Any]) -> dict[str, Any]:
    from engine.config.aliases import nest

    return nest(list(dotted.items()))
