"""What the launcher (rlctl) may use of the engine, in one place: the config schema and
its rules (the RL trainer's, and ``SFT``: engine.sft's, loaded with ``load(...,
schema=SFT)``), what each advantage estimator needs, the config error, the Megatron parallel
rules, a saved LoRA adapter's settings, the supported backend versions and the
pre-flight checks ``rlctl doctor`` makes from the launching machine (engine.doctor), the
Ulysses sizes against a model's heads, MoE routing replay against a dense model and the
model families' shape rules (``family_rules``; ``MODEL_TYPES``: those the
Megatron backend converts) that the planner and ``rlctl validate`` need; the supervisor's
command line and record and the exit codes in words, for the job scripts and ``rlctl
status``. Torch-free,
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
from engine.config.megatron_parallel import MegatronParallel, pipeline_stage_layers
from engine.config.routing_replay import model_problems as routing_replay_model_problems
from engine.config.sft import SFT
from engine.config.sft_sections import SFTConfig
from engine.config.train import (
    quantized_model_problems,
    ulysses_heads_problems,
    ulysses_model_problems,
)
from engine.doctor import check_bucket, check_secrets
from engine.errors import ConfigError
from engine.exits import exit_words, reason_words
from engine.memory_peaks import NEAR_LIMIT
from engine.models.families import MODEL_TYPES, family_rules
from engine.progress_file import PROGRESS_FILE
from engine.storage import open_store
from engine.supervisor import RECORD_FILE as RESTARTS_FILE
from engine.supervisor import Attempt, Restarts, read_restarts, supervisor_args
from engine.train.lora_saved import CONFIG_FILE as ADAPTER_CONFIG_FILE
from engine.train.lora_saved import adapter_settings
from engine.versions import SUPPORTED, version_tuple

__all__ = [
    "ADAPTER_CONFIG_FILE",
    "MODEL_TYPES",
    "NEAR_LIMIT",
    "PROGRESS_FILE",
    "RESTARTS_FILE",
    "SFT",
    "SUPPORTED",
    "Attempt",
    "ConfigError",
    "EngineConfig",
    "MegatronParallel",
    "Restarts",
    "SFTConfig",
    "adapter_settings",
    "check_bucket",
    "check_secrets",
    "config_keys",
    "estimator_needs",
    "exit_words",
    "family_rules",
    "key_problems",
    "load",
    "load_config",
    "open_store",
    "pipeline_stage_layers",
    "quantized_model_problems",
    "read_restarts",
    "reason_words",
    "routing_replay_model_problems",
    "schema_leaf",
    "supervisor_args",
    "to_yaml",
    "ulysses_heads_problems",
    "ulysses_model_problems",
    "version_tuple",
]
