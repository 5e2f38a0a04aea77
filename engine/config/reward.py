"""``reward_model`` and ``custom_reward_function``: how responses are scored
(``engine.reward``): rule functions picked by each row's ``data_source``, or your own;
a learned reward model for all or some data sources, discriminative (a sequence
classifier, ``engine.workers.reward_model``) or generative (an LLM judge,
``engine.workers.judge``, configured in ``judge.py``); DAPO's overlong penalty; and the
rules on them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.config import verl_trees
from engine.config.fields import choice, inert, positive, setting, tree
from engine.config.judge import JudgeConfig, judge_rules

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

REWARD_MANAGERS = ("naive", "dapo", "gdpo")
REWARD_MODEL_STYLES = ("discriminative", "generative")


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment over the last ``len`` tokens of the budget."""

    enable: bool = setting(False, "Add the overlong penalty to every sample's score.")
    len: int = setting(
        0,
        "The last tokens of the response budget (data.max_response_length), over which the"
        " penalty grows linearly to `penalty_factor`.",
    )
    penalty_factor: float = setting(
        1.0, "The penalty at (and beyond) data.max_response_length tokens."
    )


@dataclass
class RewardModelModelConfig:
    """The learned reward model: a Hugging Face sequence-classification model
    (discriminative) or causal LM (generative, the judge)."""

    path: str = setting(
        "",
        "Folder or hub id of a *ForSequenceClassification model with num_labels=1"
        " (discriminative) or of a *ForCausalLM (generative); required with"
        " reward_model.enable.",
    )
    input_tokenizer: str | None = setting(
        None,
        "The policy's tokenizer, when the reward model's differs: each response is decoded"
        " with it and the chat (prompt messages + response) re-templated with the reward"
        " model's tokenizer. null: the reward model reads the policy's own tokens.",
    )
    trust_remote_code: bool = setting(
        False, "Run the model's own Python code from the hub or its folder (transformers')."
    )
    external_lib: str | None = inert(
        None,
        "verl: a Python module imported to register a custom model; not in this engine"
        " (refused when set).",
    )


# verl's reward_kwargs: the DAPO reward manager's arguments (the overlong buffer's are
# read as reward_model.overlong_buffer.*, aliases.py).
REWARD_KWARGS = {"max_resp_len": None, "overlong_buffer_cfg": {"log": False}}
_REWARD_KWARGS_HELP = (
    "verl's reward manager arguments: overlong_buffer_cfg.enable, len and penalty_factor"
    " are read as reward_model.overlong_buffer's; max_resp_len, when set, must be"
    " data.max_response_length (the penalty counts from there); overlong_buffer_cfg.log"
    " changes nothing here (the penalty is always in the metrics)."
)


@dataclass
class RewardModelConfig:
    """Scoring: the processes that run the reward functions, an optional learned reward
    model, and DAPO's overlong penalty."""

    enable: bool = setting(
        False,
        "Score with the learned reward model (`model.path`) instead of the rule functions,"
        " for the data sources `data_sources` names: on the training workers, or on its"
        " own (`enable_resource_pool`).",
    )
    enable_resource_pool: bool = setting(
        False,
        "Run the reward model on Ray workers of its own, `nnodes` × `n_gpus_per_node`"
        " devices beside the training ones (the job asks for them too), instead of on"
        " every training device.",
    )
    n_gpus_per_node: int = setting(
        0, "With `enable_resource_pool`: the reward model's devices on each of its nodes."
    )
    nnodes: int = setting(0, "With `enable_resource_pool`: the reward model's nodes.")
    style: str = setting(
        "discriminative",
        "discriminative (a sequence classifier scores each sample) or generative (an LLM"
        " judge generates a verdict, `judge`; docs/rewards.md).",
    )
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    micro_batch_size_per_gpu: int = setting(
        8,
        "Sequences in one forward pass of the reward model, on each device (the hf judge:"
        " prompts in one generate call).",
    )
    data_sources: list[str] | None = setting(
        None,
        "The data sources the reward model scores; the others keep their rule function."
        " null: every sample (verl's behaviour).",
    )
    reward_manager: str = setting(
        "naive",
        "naive, dapo or gdpo (verl's names; dapo's overlong penalty follows"
        " `overlong_buffer`, gdpo is naive: a reward function's dict gives GDPO its"
        " components).",
    )
    num_workers: int = setting(4, "Processes scoring samples in parallel.")
    timeout_s: float = setting(
        10.0, "Seconds one sample may take; a sample over it scores 0 (its worker is replaced)."
    )
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    # verl's other (legacy) reward_model keys (docs/verl-compat.md).
    reward_kwargs: dict[str, Any] = tree(REWARD_KWARGS, _REWARD_KWARGS_HELP, inert_tree=False)
    reward_loop_source: str | None = inert(
        None, "verl: where its reward loop class comes from; not in this engine (refused when set)."
    )
    reward_loop_module_path: str | None = inert(
        None, "verl: a reward loop module of your own; not in this engine (refused when set)."
    )
    reward_loop_class_name: str | None = inert(
        None, "verl: that module's class; not in this engine (refused when set)."
    )
    rollout: dict[str, Any] = tree(
        verl_trees.LEGACY_REWARD_MODEL_SERVING,
        "verl's legacy spelling of reward.reward_model.rollout (an inference engine serving"
        " the reward model); changes nothing here (see reward.reward_model.rollout).",
    )


@dataclass
class CustomRewardFunctionConfig:
    """Your own scoring function, used for every row instead of the built-in ones."""

    path: str | None = setting(
        None, "A .py file defining the function; null: the built-in scorers."
    )
    name: str = setting(
        "compute_score",
        "The function in it: (data_source, solution_str, ground_truth, extra_info) -> float"
        " or dict.",
    )


def rules(cfg: EngineConfig) -> list[str]:
    rm = cfg.reward_model
    p = choice(rm.reward_manager, REWARD_MANAGERS, "reward_model.reward_manager", "reward manager")
    p += positive([("reward_model.num_workers", rm.num_workers)])
    if rm.timeout_s <= 0:
        p.append(f"reward_model.timeout_s must be > 0 seconds, got {rm.timeout_s}")
    ob = rm.overlong_buffer
    if ob.enable and not 0 < ob.len < cfg.data.max_response_length:
        p.append(
            f"reward_model.overlong_buffer.len {ob.len} must be in (0, data.max_response_length"
            f" = {cfg.data.max_response_length}): the penalty ramps over the last len tokens"
        )
    if rm.enable_resource_pool and not rm.enable:
        p.append(
            "reward_model.enable_resource_pool=true without reward_model.enable: no reward"
            " model would run on the devices it asks for; set reward_model.enable=true or"
            " enable_resource_pool=false"
        )
    return p + _reward_model_rules(cfg)


def _reward_model_rules(cfg: EngineConfig) -> list[str]:
    rm = cfg.reward_model
    if not rm.enable:
        return []
    p = choice(rm.style, REWARD_MODEL_STYLES, "reward_model.style", "reward model style")
    p += positive([("reward_model.micro_batch_size_per_gpu", rm.micro_batch_size_per_gpu)])
    if rm.data_sources is not None and not rm.data_sources:
        p.append(
            "reward_model.data_sources is an empty list, so the reward model scores nothing:"
            " name data sources, set it to null (every sample) or reward_model.enable=false"
        )
    p += _pool_rules(cfg)
    generative = rm.style == "generative"
    if generative:
        p += judge_rules(cfg)
    path = rm.model.path
    if not path:
        wanted = "*ForCausalLM" if generative else "*ForSequenceClassification"
        p.append(
            f"reward_model.model.path is empty: set it to a {wanted} model folder or hub id,"
            " or reward_model.enable=false"
        )
        return p
    return p + (causal_lm_problems(path) if generative else sequence_classifier_problems(path))


def _pool_rules(cfg: EngineConfig) -> list[str]:
    rm = cfg.reward_model
    if not rm.enable_resource_pool:
        return []
    return [
        f"reward_model.{key} must be >= 1 with reward_model.enable_resource_pool=true, got"
        f" {value}: set the reward model's own {what}, or enable_resource_pool=false to run"
        " it on the training workers"
        for key, value, what in (
            ("nnodes", rm.nnodes, "node count"),
            ("n_gpus_per_node", rm.n_gpus_per_node, "devices per node"),
        )
        if value < 1
    ]


def sequence_classifier_problems(path: str) -> list[str]:
    """What keeps ``path`` from being a reward model: a local folder must hold a
    ``config.json`` with a ``*ForSequenceClassification`` architecture and one label (a
    hub id is checked where it is loaded, ``engine.workers.reward_model``)."""
    return _model_folder_problems(
        path, "*ForSequenceClassification model", classifier_config_problems
    )


def _model_folder_problems(
    path: str, wanted: str, config_problems: Callable[[str, dict], list[str]]
) -> list[str]:
    """A missing local folder or config.json named as such, else ``config_problems`` of
    its config.json; nothing for a hub id (org/name), which is checked where it loads."""
    folder = Path(path).expanduser()
    if not folder.exists():
        if path.startswith(("/", ".", "~")) or path.count("/") != 1:
            return [
                f"reward_model.model.path {path!r} does not exist: give a local folder or a"
                f" hub id (org/name) of a {wanted}"
            ]
        return []
    config_file = folder / "config.json"
    if not config_file.is_file():
        return [
            f"reward_model.model.path {path!r} has no config.json: give the folder of a"
            f" Hugging Face {wanted}"
        ]
    return config_problems(path, json.loads(config_file.read_text()))


def classifier_config_problems(path: str, config: dict) -> list[str]:
    """The problems with a model's config (its config.json as a dict) as a reward model."""
    archs = config.get("architectures") or []
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        return [
            f"reward_model.model.path {path!r} is a {', '.join(archs) or 'model of no stated'}"
            " architecture, not a sequence-classification model: give a"
            " *ForSequenceClassification checkpoint with num_labels=1 (a causal LM cannot"
            " score; convert it or train a reward model first)"
        ]
    labels = len(config["id2label"]) if "id2label" in config else config.get("num_labels", 2)
    if labels != 1:
        return [
            f"reward_model.model.path {path!r} has {labels} labels; a reward model gives one"
            " score per sequence: give a checkpoint saved with num_labels=1"
        ]
    return []


def causal_lm_problems(path: str) -> list[str]:
    """What keeps ``path`` from being a judge: a local folder must hold a ``config.json``
    with a ``*ForCausalLM`` architecture (a hub id is checked where it is loaded)."""
    return _model_folder_problems(path, "*ForCausalLM model (the judge)", causal_lm_config_problems)


def causal_lm_config_problems(path: str, config: dict) -> list[str]:
    """The problems with a model's config (its config.json as a dict) as a judge."""
    archs = config.get("architectures") or []
    if not any(a.endswith("ForCausalLM") for a in archs):
        return [
            f"reward_model.model.path {path!r} is a {', '.join(archs) or 'model of no stated'}"
            " architecture, not a causal LM, so it cannot generate a verdict: give a"
            " *ForCausalLM checkpoint as the judge, or reward_model.style=discriminative for"
            " a sequence classifier"
        ]
    return []
