"""What the launcher (rlctl) may use of the engine, in one place: the config schema and
its rules, what each advantage estimator needs, the config error, and the Megatron
model-shape rules the planner and ``rlctl validate`` need. Torch-free, Ray-free: rlctl imports the engine through this
module only (tests/rlctl/test_import_graph.py checks both)."""

from engine.algo.names import estimator_needs
from engine.config import (
    EngineConfig,
    config_keys,
    key_problems,
    load_config,
    schema_leaf,
    to_yaml,
)
from engine.errors import ConfigError
from engine.train.megatron_parallel import MODEL_TYPES, MegatronParallel, pipeline_stage_layers

__all__ = [
    "MODEL_TYPES",
    "ConfigError",
    "EngineConfig",
    "MegatronParallel",
    "config_keys",
    "estimator_needs",
    "key_problems",
    "load_config",
    "pipeline_stage_layers",
    "schema_leaf",
    "to_yaml",
]
