"""Starting the actor's LoRA from a saved PEFT adapter (``actor_rollout_ref.model.
lora_adapter_path``, verl's key): a folder with ``adapter_config.json`` and the weights
``PeftModel.save_pretrained`` writes.

Two steps, each where it belongs:

- before any worker starts (``resolve``): the adapter's rank, alpha and target modules
  become the run's ``lora_rank``, ``lora_alpha`` and ``target_modules`` (keys left at
  their defaults take the adapter's; a key set to something else is refused naming both),
  so that every role and the rollout see one resolved config; an adapter with what the
  engine's LoRA does not do (DoRA, rsLoRA, per-module ranks, extra trained modules) is
  refused by name;
- in the actor (``load_weights``): once peft has injected the same layers
  (``engine.train.lora.apply_lora``), the saved A and B are loaded into them, before
  sharding and before the first step. The reference stays the base model (the adapter
  switched off), as in verl.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config import ModelConfig
from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.config import EngineConfig

KEY = "actor_rollout_ref.model"
CONFIG_FILE = "adapter_config.json"  # peft's
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")  # peft's, either
_DEFAULTS = ModelConfig()
# the config's LoRA keys and the adapter_config.json fields they are read from
_SAVED_AS = {
    "lora_rank": "r",
    "lora_alpha": "lora_alpha",
    "target_modules": "target_modules",
    "exclude_modules": "exclude_modules",
}
# adapter_config.json fields whose non-default values the engine's LoRA does not do:
# (field, its default, the feature in words)
_UNSUPPORTED = (
    ("use_dora", False, "DoRA (use_dora)"),
    ("use_rslora", False, "rank-stabilised scaling (use_rslora)"),
    ("rank_pattern", {}, "per-module ranks (rank_pattern)"),
    ("alpha_pattern", {}, "per-module alphas (alpha_pattern)"),
    ("modules_to_save", None, "fully trained extra modules (modules_to_save)"),
    ("bias", "none", "trained biases (bias)"),
    ("lora_bias", False, "a bias on B (lora_bias)"),
    ("layers_to_transform", None, "a subset of layers (layers_to_transform)"),
    ("target_parameters", None, "adapted parameters (target_parameters)"),
)


def resolve(cfg: EngineConfig) -> EngineConfig:
    """``cfg`` with the actor's LoRA settings read from its saved adapter (unchanged
    without ``lora_adapter_path``); raises ``ConfigError`` naming the keys."""
    model = cfg.actor_rollout_ref.model
    if not model.lora_adapter_path:
        return cfg
    resolved = adapter_settings(model)
    arr = dataclasses.replace(cfg.actor_rollout_ref, model=resolved)
    out = dataclasses.replace(cfg, actor_rollout_ref=arr)
    from engine.config.actor import lora_problems

    problems = lora_problems(out)  # the adapter's values under the config's rules
    if problems:
        raise ConfigError(problems)
    return out


def adapter_settings(model: ModelConfig) -> ModelConfig:
    """``model`` with lora_rank, lora_alpha, target_modules and exclude_modules the
    adapter's (each checked against a value set in the config)."""
    saved = read_adapter_config(model.lora_adapter_path)
    where = f"{KEY}.lora_adapter_path={model.lora_adapter_path!r}"
    problems = [
        f"{where} is an adapter with {what}, which the engine's LoRA does not do; save one"
        " without it"
        for name, default, what in _UNSUPPORTED
        if saved.get(name, default) not in (default, None, {}, [], False)
    ]
    values = {name: _names(saved.get(field)) for name, field in _SAVED_AS.items()}
    for name, value in values.items():
        mine, default = getattr(model, name), getattr(_DEFAULTS, name)
        if mine != default and _names(mine) != value:
            problems.append(
                f"{KEY}.{name}={mine!r} but {where} has {_SAVED_AS[name]}={value!r} in its"
                f" {CONFIG_FILE}: leave {name} at its default ({default!r}) to take the"
                f" adapter's, or set it to {value!r}"
            )
    rank, alpha = values["lora_rank"], values["lora_alpha"]
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, int | float):
        problems.append(f"{where}: its {CONFIG_FILE} has r={rank!r}, lora_alpha={alpha!r}")
    if problems:
        raise ConfigError(problems)
    return dataclasses.replace(
        model,
        lora_rank=values["lora_rank"],
        lora_alpha=float(values["lora_alpha"]),
        target_modules=values["target_modules"],
        exclude_modules=values["exclude_modules"],
    )


def read_adapter_config(path: str) -> dict[str, Any]:
    """The folder's ``adapter_config.json``, after checking its weights are there."""
    folder = Path(path).expanduser()
    where = f"{KEY}.lora_adapter_path={path!r}"
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise ConfigError(
            [
                f"{where}: no {CONFIG_FILE} there; give a folder PEFT's save_pretrained"
                f" wrote ({CONFIG_FILE} and {WEIGHT_FILES[0]})"
            ]
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ConfigError([f"{where}: no adapter weights there ({' or '.join(WEIGHT_FILES)})"])
    try:
        saved = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError([f"{where}: {CONFIG_FILE} is not JSON ({exc})"]) from None
    if saved.get("peft_type", "LORA") != "LORA":
        raise ConfigError([f"{where} is a {saved['peft_type']} adapter; LoRA's is read here"])
    return saved


def load_weights(peft_model: Any, path: str) -> None:
    """The saved adapter's A and B into ``peft_model``'s LoRA layers (injected with the
    adapter's settings, ``resolve``); every saved tensor must land, every layer get one."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    weights = load_peft_weights(str(Path(path).expanduser()), device="cpu")
    result = set_peft_model_state_dict(peft_model, weights)
    missing = [k for k in result.missing_keys if ".lora_A." in k or ".lora_B." in k]
    if result.unexpected_keys or missing:
        names = result.unexpected_keys or missing
        what = "matches no adapted module" if result.unexpected_keys else "got no saved weight"
        raise ConfigError(
            [
                f"{KEY}.lora_adapter_path={path!r}: {len(names)} tensor(s) of the adapter"
                f" {what} (e.g. {names[0]}); was it saved for this model"
                f" ({KEY}.path={peft_model.peft_config['default'].base_model_name_or_path!r})?"
            ]
        )


def _names(value: Any) -> Any:
    """Module names in one order (peft saves a set as a list), any other value as is."""
    return sorted(value) if isinstance(value, list | tuple | set) else value
