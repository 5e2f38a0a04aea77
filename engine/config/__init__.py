"""The engine's whole configuration, as typed dataclasses, one module a section.

Defaults live in the dataclasses and nowhere else; every leaf field carries its help
text (``python -m engine.main --help KEY``, docs/configuration.md). Keys follow verl's
layout so that a verl command line carries over:

    data                          data.py        the prompts
    actor_rollout_ref.model       train.py       the model (also critic.model)
    actor_rollout_ref.actor       actor.py       the policy's update; optim, fsdp_config,
                                                 megatron from train.py
    actor_rollout_ref.rollout     rollout.py     generation and sampling
    actor_rollout_ref.actor.router_replay
                                  routing_replay.py  MoE routing replay (R2, R3)
    actor_rollout_ref.ref         actor.py       the frozen reference policy
    critic                        critic.py      the value model
    reward_model, custom_reward_function
                                  reward.py      scoring
    reward_model.judge            judge.py       the generative reward model (an LLM judge)
    algorithm                     algorithm.py   advantages, KL penalty, dynamic sampling
    trainer                       trainer.py     devices, length, checkpoints, loggers
    <role>.megatron               megatron.py    Megatron-core's sizes, and their rules
    distillation                  distillation.py  on-policy distillation from teachers
    reward, ray_kwargs, model_engine, transfer_queue, global_profiler, skip
                                  verl_sections.py  verl's sections beyond the engine's own

Every key of verl's trainer schema is known (docs/verl-compat.md): ``verl_names`` lists
verl's other spellings (read by ``aliases``), ``verl_trees`` the shapes of verl's
subtrees held as one mapping each, ``verl_features`` the keys that turn on what this
engine lacks (refused by name); a key that changes nothing here is declared with
``fields.inert`` and a run that sets one is told so (``given``, ``notes``).
``compose`` reads Hydra's config files and group choices, ``suggest`` words an unknown
key, ``dump`` writes the config back as YAML.

``engine.py`` holds ``EngineConfig`` (the sections together, and what is derived from
them). ``sft_sections.py`` and ``sft.py`` are ``python -m engine.sft``'s own schema
(verl's SFT trainer's keys, its rules, the ``SFT`` ``load.Schema`` the loader takes), which
reuses the sections' classes where verl's keys are the same (``ModelConfig``,
``OptimConfig``). Each section's module holds its rules too; ``rules.validate`` runs them all (its
docstring says where the rules that span sections live: ``batches.py`` for batch sizes,
``train.megatron_rules`` for the Megatron layout). ``load.py`` composes a config from a
YAML file and Hydra-style ``key=value`` overrides; ``keys.py`` lists the schema's keys
with their types, defaults and help; ``docs.py`` renders them for people.

This package imports neither torch nor ray: ``rlctl`` validates recipes with it on a
laptop (through ``engine.schema``).
"""

from engine.config.actor import ActorConfig, ActorRolloutRefConfig, PolicyLossConfig, RefConfig
from engine.config.algorithm import (
    FILTER_METRICS,
    ROLLOUT_IS_LEVELS,
    AlgorithmConfig,
    FilterGroupsConfig,
    KLControlConfig,
    RolloutCorrectionConfig,
)
from engine.config.critic import CriticConfig
from engine.config.data import TRUNCATION_MODES, DataConfig
from engine.config.dump import to_yaml, verl_yaml
from engine.config.engine import EngineConfig
from engine.config.judge import JudgeConfig
from engine.config.keys import config_keys, schema_leaf
from engine.config.load import Loaded, key_problems, load, load_config
from engine.config.megatron import MegatronConfig, RefMegatronConfig
from engine.config.multi_turn import AGENT_LOOPS, MultiTurnConfig
from engine.config.reward import (
    REWARD_MANAGERS,
    CustomRewardFunctionConfig,
    OverlongBufferConfig,
    RewardModelConfig,
)
from engine.config.role_keys import TOKEN_BUDGET_KEYS
from engine.config.rollout import PLACEMENTS, ROLLOUT_BACKENDS, RolloutConfig, SamplingConfig
from engine.config.rules import validate
from engine.config.train import (
    DTYPES,
    LR_SCHEDULERS,
    TRAIN_STRATEGIES,
    FSDPConfig,
    MixedPrecisionConfig,
    ModelConfig,
    OptimConfig,
)
from engine.config.trainer import DEVICES, LOGGERS, RESUME_MODES, TrainerConfig
from engine.errors import ConfigError

__all__ = [
    "AGENT_LOOPS",
    "DEVICES",
    "DTYPES",
    "FILTER_METRICS",
    "LOGGERS",
    "LR_SCHEDULERS",
    "PLACEMENTS",
    "RESUME_MODES",
    "REWARD_MANAGERS",
    "ROLLOUT_BACKENDS",
    "ROLLOUT_IS_LEVELS",
    "TOKEN_BUDGET_KEYS",
    "TRAIN_STRATEGIES",
    "TRUNCATION_MODES",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "EngineConfig",
    "FSDPConfig",
    "FilterGroupsConfig",
    "JudgeConfig",
    "KLControlConfig",
    "Loaded",
    "MegatronConfig",
    "MixedPrecisionConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PolicyLossConfig",
    "RefConfig",
    "RefMegatronConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "SamplingConfig",
    "TrainerConfig",
    "config_keys",
    "key_problems",
    "load",
    "load_config",
    "schema_leaf",
    "to_yaml",
    "validate",
    "verl_yaml",
]
