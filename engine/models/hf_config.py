"""A model's Hugging Face config as the engine builds it: the folder's ``config.json``
with ``<model>.override_config`` over it (verl's key), so that the actor, the reference,
the critic and the rollout engines all build the same model.

What an override means (the same on every side; vLLM's ``hf_overrides`` reads it so):

- a field of the config takes the given value (``max_position_embeddings: 32768``,
  ``attention_dropout: 0.0``); a field the config lacks is refused, naming the key,
  since transformers would keep it as an attribute no layer reads;
- a mapping given for a sub-config (``text_config: {...}``) sets that sub-config's
  fields, recursively; a mapping given for any other field (``rope_scaling``) is its
  value whole;
- verl's ``model_config: {...}`` level (its Megatron workers' spelling) holds the fields;
- ``attn_implementation`` is transformers' loading argument (eager, sdpa,
  flash_attention_2, ...), not a field: the training roles load with it, the rollout
  engines choose their own kernels.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from engine.errors import ConfigError

ATTN = "attn_implementation"  # transformers' loading argument, not a config field
VERL_LEVEL = "model_config"  # verl's Megatron workers' level of the fields


def is_vision_language(hf_config: Any) -> bool:
    """A model with a vision tower (its config has a ``vision_config``): it loads as
    an image-text-to-text model and takes the prompts' images (docs/vision.md)."""
    return getattr(hf_config, "vision_config", None) is not None


def config_overrides(model_cfg: Any) -> dict[str, Any]:
    """The fields ``model_cfg.override_config`` sets (verl's ``model_config`` level
    unwrapped, ``attn_implementation`` left out): what the rollout engines are given."""
    return _split(model_cfg)[0]


def loading_kwargs(model_cfg: Any) -> dict[str, Any]:
    """transformers' ``from_pretrained``/``from_config`` arguments the overrides ask for."""
    value = (model_cfg.override_config or {}).get(ATTN)
    return {ATTN: value} if value else {}


def _split(model_cfg: Any) -> tuple[dict[str, Any], list[str]]:
    """(the fields to set, the keys beside verl's ``model_config`` level that nothing
    would read)."""
    given = {k: v for k, v in (model_cfg.override_config or {}).items() if k != ATTN}
    if VERL_LEVEL not in given:
        return given, []
    fields = {k: v for k, v in (given[VERL_LEVEL] or {}).items() if k != ATTN}
    return fields, [k for k in given if k != VERL_LEVEL]


def override_problems(hf_config: Any, overrides: Mapping[str, Any], key: str) -> list[str]:
    """Each override ``hf_config`` has no field for, named by its dotted key under
    ``key`` (``actor_rollout_ref.model.override_config``), with the fields it has."""
    problems = []
    for name, value in overrides.items():
        dotted = f"{key}.{name}"
        if not hasattr(hf_config, name):
            problems.append(_unknown_field(hf_config, name, dotted))
        elif isinstance(value, Mapping) and _is_config(getattr(hf_config, name)):
            problems += override_problems(getattr(hf_config, name), value, dotted)
    return problems


def apply_overrides(hf_config: Any, overrides: Mapping[str, Any]) -> None:
    """Set the fields in place (checked first with ``override_problems``)."""
    for name, value in overrides.items():
        current = getattr(hf_config, name)
        if isinstance(value, Mapping) and _is_config(current):
            apply_overrides(current, value)
        else:
            setattr(hf_config, name, dict(value) if isinstance(value, Mapping) else value)


def load_hf_config(
    model_cfg: Any, key: str = "actor_rollout_ref.model", **from_pretrained: Any
) -> Any:
    """The model's config with its overrides applied; ``key``: the model's section, for
    the messages. A field the config lacks raises ``ConfigError`` naming it."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(
        model_cfg.path, trust_remote_code=model_cfg.trust_remote_code, **from_pretrained
    )
    overrides, stray = _split(model_cfg)
    problems = [
        f"{key}.override_config.{name}: beside verl's {VERL_LEVEL} level only {ATTN} is"
        f" read; move it under {key}.override_config.{VERL_LEVEL}, or remove it"
        for name in stray
    ]
    problems += override_problems(hf_config, overrides, _override_key(model_cfg, key))
    if problems:
        raise ConfigError(problems)
    apply_overrides(hf_config, overrides)
    return hf_config


def _override_key(model_cfg: Any, key: str) -> str:
    level = f".{VERL_LEVEL}" if VERL_LEVEL in (model_cfg.override_config or {}) else ""
    return f"{key}.override_config{level}"


def _is_config(value: Any) -> bool:
    from transformers import PretrainedConfig

    return isinstance(value, PretrainedConfig)


def _unknown_field(hf_config: Any, name: str, dotted: str) -> str:
    fields = sorted(hf_config.to_dict())
    holders = [f for f in fields if _is_config(getattr(hf_config, f, None))
               and hasattr(getattr(hf_config, f), name)]  # fmt: skip
    close = difflib.get_close_matches(name, fields, n=1)
    if holders:  # a vision-language model's text config, say
        prefix = dotted.rsplit(".", 1)[0]
        hint = f"its {holders[0]} has it: set {prefix}.{holders[0]}.{name}; "
    else:
        hint = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"{dotted}: the model's config ({type(hf_config).__name__}) has no field {name!r},"
        f" so the override would change nothing; {hint}its fields: {', '.join(fields)}"
    )
