"""A recipe's ``engine:`` block: engine config keys, nested or dotted, flattened to
dotted keys and checked against the engine's schema (engine/schema.py) before anything
is planned, rendered or launched."""

from __future__ import annotations

import difflib
from typing import Any


def engine_key_problems(keys: dict[str, Any], sft: bool = False) -> list[str]:
    """Each engine key checked against the engine's schema (``sft``: engine.sft's): that
    it exists, names a value (not a section of keys), and that the value has the key's
    type. One line per problem, ``engine.<key>: ...``, naming the value and what to give
    instead."""
    import functools

    import engine.schema as engine_schema

    root = engine_schema.SFTConfig if sft else engine_schema.EngineConfig
    schema_leaf = functools.partial(engine_schema.schema_leaf, root=root)
    known = engine_schema.config_keys(root)
    problems: list[str] = []
    typed: dict[str, Any] = {}
    for key, value in keys.items():
        if schema_leaf(key) is not None or _inside_a_mapping(key, schema_leaf):
            typed[key] = value  # a key inside a mapping: its shape is checked by the engine
            continue
        inside = [k for k in known if k.startswith(f"{key}.")]
        if inside:
            problems.append(
                f"engine.{key}: a section of keys, not a value; set the keys in it, e.g."
                f" {inside[0]}"
            )
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        where = "docs/sft.md" if sft else "docs/configuration.md"
        hint = f"did you mean {close[0]!r}?" if close else f"{where} lists them"
        problems.append(f"engine.{key}: unknown engine key; {hint}")

    checked = engine_schema.key_problems(typed, engine_schema.SFT if sft else None)
    problems += [p.replace("base config: ", "engine.", 1) for p in checked]
    return problems


def _inside_a_mapping(key: str, schema_leaf: Any) -> bool:
    """Whether a section above ``key`` is a mapping value of the schema (a recipe's nested
    keys are flattened: ``engine_kwargs: {vllm: {...}}`` arrives as dotted keys)."""
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        found = schema_leaf(".".join(parts[:end]))
        if found is not None:
            return getattr(found[0], "__origin__", found[0]) is dict
    return False


def short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def flatten(
    tree: dict[str, Any], prefix: str = "", errors: list[str] | None = None
) -> dict[str, Any]:
    """``{data: {train_batch_size: 8}}`` and ``{data.train_batch_size: 8}`` alike; with
    ``errors``, a key given both ways is reported there."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        inner = flatten(value, f"{name}.", errors) if isinstance(value, dict) else {name: value}
        for dotted, leaf in inner.items():
            if dotted in out and errors is not None:
                errors.append(
                    f"engine.{dotted}: given twice (dotted and nested), as {short(out[dotted])}"
                    f" and {short(leaf)}; keep one"
                )
            out[dotted] = leaf
    return out
