"""verl's top-level sections beyond this engine's own (docs/verl-compat.md):

reward             verl's newer reward section: its keys are read as reward_model's
                   and custom_reward_function's (``aliases``); what is left is here
ray_kwargs         arguments of ``ray.init`` (``engine.runtime.init_ray``)
model_engine       verl's engine family, a choice on its command line
transfer_queue, global_profiler, skip
                   verl features: their keys are accepted so that a verl command
                   line runs; turning one on is refused by name (``verl_features``)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.config import verl_trees
from engine.config.fields import choice, inert, mapping, one_of, tree

# verl's engine families (``model_engine=...``) and each role's strategy under them.
MODEL_ENGINES = {"dp": "fsdp", "megatron": "megatron", "veomni": "veomni"}


@dataclass
class RewardManagerSection:
    """Where verl's reward manager class comes from (its name is read as
    ``reward_model.reward_manager``)."""

    source: str = inert(
        "register",
        "register: a built-in manager by name (naive, dapo, gdpo); verl's importlib (a"
        " class from module.path) is refused.",
    )
    module: dict[str, Any] = tree(
        {"path": None, "name": "custom_reward_manager"},
        "verl's reward manager class of your own; not in this engine (a path is refused).",
    )


@dataclass
class RewardModelSection:
    """verl's reward model (its enable, model_path, resource pool keys are read as
    ``reward_model``'s)."""

    rollout: dict[str, Any] = tree(
        verl_trees.REWARD_MODEL_SERVING,
        "verl serves the reward model with an inference engine set here; changes nothing"
        " here: a discriminative reward model runs a forward pass on its workers, a judge"
        " runs on a second instance of the rollout engine (reward_model.judge).",
    )


@dataclass
class RewardSection:
    """verl's newer ``reward`` section. reward.num_workers, reward.reward_manager.name,
    reward.custom_reward_function.* and reward.reward_model.{enable, model_path,
    enable_resource_pool, nnodes, n_gpus_per_node} are read as this engine's
    reward_model and custom_reward_function keys (``--help`` of each names it)."""

    reward_manager: RewardManagerSection = field(default_factory=RewardManagerSection)
    reward_model: RewardModelSection = field(default_factory=RewardModelSection)
    sandbox_fusion: dict[str, Any] = tree(
        verl_trees.SANDBOX_FUSION,
        "verl's remote code sandbox for code rewards; not in this engine (a url is refused):"
        " score code with your own custom_reward_function. verl's legacy top-level"
        " sandbox_fusion.* sets it too.",
    )


@dataclass
class RayKwargsConfig:
    """Arguments of the Ray cluster the engine starts (verl's ``ray_kwargs``)."""

    ray_init: dict[str, Any] = mapping(
        "Keyword arguments of ray.init when the engine starts Ray itself (not with"
        " RAY_ADDRESS), over its own: num_cpus, runtime_env (merged with the engine's env"
        " vars), ...; a null value leaves the engine's choice.",
        factory=lambda: {"num_cpus": None, "runtime_env": {"py_executable": None}},
    )
    timeline_json_file: str | None = inert(
        None, "verl writes Ray's timeline here at the end; changes nothing here."
    )


_LACKS = "not in this engine; its keys are accepted, turning it on is refused"


MODEL_ENGINE_HELP = (
    f"verl's engine family ({one_of(MODEL_ENGINES)}; on verl's command line"
    " model_engine=megatron): here it sets the roles' strategy (dp: fsdp; veomni runs on"
    " this engine's FSDP2) unless a role's strategy is given; null: the strategies as set."
)
TRANSFER_QUEUE_HELP = f"verl's TransferQueue data plane ({_LACKS})."
GLOBAL_PROFILER_HELP = (
    "verl's profiler of whole steps; changes nothing here (the engine's stage timings are"
    " in its metrics)."
)
SKIP_HELP = f"verl's dump and replay of rollouts for debugging ({_LACKS})."


def model_engine_problems(value: str | None) -> list[str]:
    if value is None:
        return []
    return choice(value, MODEL_ENGINES, "model_engine", "engine family")


def ray_init_args(cfg: Any, own: dict[str, Any], joining: bool = False) -> dict[str, Any]:
    """``ray.init``'s keyword arguments: the engine's ``own``, with the user's
    ``ray_kwargs.ray_init`` over them (a null value leaves the engine's). ``runtime_env``
    is merged (its ``env_vars`` too), so the engine's worker variables stay. Joining a
    running cluster (RAY_ADDRESS) takes only the runtime_env: the cluster's resources are
    its own."""
    user = {k: v for k, v in (cfg.ray_kwargs.ray_init or {}).items() if v is not None}
    env = {k: v for k, v in (user.pop("runtime_env", None) or {}).items() if v is not None}
    out = dict(own) if joining else {**own, **user}
    if env:
        mine = dict(own.get("runtime_env") or {})
        theirs = {k: str(v) for k, v in (env.pop("env_vars", None) or {}).items()}  # Ray: text
        env_vars = {**mine.get("env_vars", {}), **theirs}
        out["runtime_env"] = {**mine, **env, **({"env_vars": env_vars} if env_vars else {})}
    return out
