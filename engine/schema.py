"""What the launcher (rlctl) may use of the engine, in one place: the config schema and
its rules (the RL trainer's, and ``SFT``: engine.sft's, loaded with ``load(...,
schema=SFT)``), what each advantage estimator needs, the config error, the Megatron parallel
rules, a saved LoRA adapter's settings, the Ulysses sizes against a model's heads and the model families' shape rules (``family_rules``; ``MODEL_TYPES``: those the
Megatron backend converts) that the planner and ``rlctl validate`` need. Torch-free,
Ray-free: rlctl imports the engine through this module only
(tests/rlctl/test_import_graph.py checks both)."""

from engine.algo.names import estimator_needs
from engine.config import (
    EngineConfig,
    config_keys,
    key_problems,
    load_config,
    schema_leaf,
    to_yaml,
)
from engine.config.load import load
from engine.config.sft import SFT
from engine.config.sft_sections import SFTConfig
from engine.config.train import (
    quantized_model_problems,
    ulysses_heads_problems,
    ulysses_model_problems,
)
from engine.errors import ConfigError
from engine.models.families import MODEL_TYPES, family_rules
from engine.train.lora_saved import CONFIG_FILE as ADAPTER_CONFIG_FILE
from engine.train.lora_saved import adapter_settings
from engine.train.megatron_parallel import MegatronParallel, pipeline_stage_layers

__all__ = [
    "ADAPTER_CONFIG_FILE",
    "MODEL_TYPES",
    "SFT",
    "ConfigError",
    "EngineConfig",
    "MegatronParallel",
    "SFTConfig",
    "adapter_settings",
    "config_keys",
    "estimator_needs",
    "family_rules",
    "key_problems",
    "load",
    "load_config",
    "pipeline_stage_layers",
    "quantized_model_problems",
    "schema_leaf",
    "to_yaml",
    "ulysses_heads_problems",
    "ulysses_model_problems",
]
