"""A job spec: everything a backend needs to run a recipe, resolved and checked.

recipe + plan + where the job runs  ──►  JobSpec
    setup steps (build the tiny model, prepare data) as argv lists
    the engine's full config, validated against the engine's own schema
    the environment (plain values) and the names of the secrets to pass

The engine config travels as a YAML file (``python -m engine.main --config``):
recipe values never become words of a shell command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlctl.errors import RlctlError
from rlctl.recipe import TINY_MODEL, Recipe, RecipeError


@dataclass(frozen=True)
class JobPaths:
    """Where the job's files live on the machine that runs it."""

    root: str  # the job's directory there

    @property
    def model_dir(self) -> str:
        return f"{self.root}/model"

    @property
    def data_dir(self) -> str:
        return f"{self.root}/data"

    @property
    def run_dir(self) -> str:
        return f"{self.root}/run"

    @property
    def engine_config(self) -> str:
        return f"{self.root}/engine.yaml"


@dataclass(frozen=True)
class JobSpec:
    recipe: Recipe
    paths: JobPaths
    engine_yaml: str  # the engine's full, validated config
    setup: tuple[tuple[str, ...], ...]  # argv of each step before training (python is "python")
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()

    @property
    def engine_command(self) -> tuple[str, ...]:
        return ("python", "-m", "engine.main", "--config", self.paths.engine_config)


def build_spec(recipe: Recipe, plan_overrides: dict[str, Any], paths: JobPaths) -> JobSpec:
    """Resolve the recipe for ``paths`` and check it against the engine's schema."""
    keys: dict[str, Any] = {}
    setup: list[tuple[str, ...]] = []
    if recipe.model == TINY_MODEL:
        setup.append(("python", "-m", "engine.models.tiny", paths.model_dir))
        keys["actor_rollout_ref.model.path"] = paths.model_dir
    else:
        keys["actor_rollout_ref.model.path"] = recipe.model
    if recipe.data.prepare:
        setup.append(
            ("python", "-m", "engine.data.prepare", recipe.data.prepare, "--out", paths.data_dir)
        )
        keys["data.train_files"] = [f"{paths.data_dir}/train.parquet"]
        keys["data.val_files"] = [f"{paths.data_dir}/val.parquet"]
    else:
        keys["data.train_files"] = list(recipe.data.train)
        keys["data.val_files"] = list(recipe.data.val)
    keys["trainer.default_local_dir"] = recipe.checkpoints or paths.run_dir
    # Order: what the recipe's fields mean, then the plan's sizing, then the recipe's
    # own engine keys (a person's explicit choice wins; the planner checked them).
    merged = {**keys, **recipe.engine_overrides(), **plan_overrides, **recipe.engine}
    return JobSpec(
        recipe=recipe,
        paths=paths,
        engine_yaml=engine_yaml(
            merged, recipe.source, model=None if recipe.model == TINY_MODEL else recipe.model
        ),
        setup=tuple(setup),
        env=dict(recipe.env),
        secrets=recipe.secrets,
    )


def engine_yaml(dotted: dict[str, Any], source: str, model: str | None = None) -> str:
    """The engine's config for these keys, validated; errors name the recipe's keys.
    With ``model``, the Megatron roles' sizes are also checked against its config
    (``megatron_problems``): what the engine would refuse once the cluster is up."""
    from engine.config import load_config, to_yaml
    from engine.errors import ConfigError

    try:
        cfg = load_config(base=nest(dotted))
        problems = megatron_problems(cfg, model) if model is not None else []
    except ConfigError as exc:
        problems = [p.replace("base config: ", "engine.") for p in exc.problems]
    if problems:
        raise RecipeError(
            f"recipe {source}: the engine config it makes is invalid:\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint="change the recipe's engine: keys (or hardware/algorithm) as each line says",
        ) from None
    return to_yaml(cfg)


def megatron_problems(cfg: Any, model: str) -> list[str]:
    """Why the Megatron engine would refuse this model with these sizes (TP must divide
    the heads, PP form the stages, EP divide the experts, the model type be convertible),
    from its config fields, before anything is launched. Empty without Megatron roles."""
    roles = cfg.megatron_roles()
    if not roles:
        return []
    from types import SimpleNamespace

    from engine.train.megatron_parallel import MegatronParallel
    from rlctl.models import model_config

    hf_config = SimpleNamespace(**model_config(model))
    problems: list[str] = []
    for key, section in roles.values():
        problems += MegatronParallel.of(section).model_problems(hf_config, key)
    return problems


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``."""
    tree: dict[str, Any] = {}
    for key, value in dotted.items():
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RlctlError(f"engine key {key!r} conflicts with {part!r} set to a value")
            node = child
        node[parts[-1]] = value
    return tree
