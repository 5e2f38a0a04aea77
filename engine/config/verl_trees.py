"""verl's subtrees of keys that this engine holds as one mapping each (``fields.tree``):
their default shapes (verl's key names and defaults, so that ``--print-config`` and
``--cfg job`` show every verl key), and the rule that a key under one must be a key of
its shape (a typo is refused, not carried silently).

Most of these subtrees configure verl features that change nothing here (profilers,
metrics servers, verl's other trainers' settings). Where one turns on a feature this
engine lacks, ``engine.config.verl_features`` refuses it by name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

_TOOL_RUN = {
    "contents": [],
    "discrete": False,
    "profile_token_start": None,
    "profile_token_end": None,
}
PROFILER = {
    "tool": None,
    "enable": False,
    "all_ranks": False,
    "ranks": [],
    "save_path": None,
    "tool_config": {
        "nsys": {"discrete": None},
        "npu": {"level": "level0", "analysis": True, **_TOOL_RUN},
        "torch": {
            **_TOOL_RUN,
            "schedule": {"skip_first": 0, "wait": 0, "warmup": 0, "active": 0, "repeat": 0},
        },
        "torch_memory": {"trace_alloc_max_entries": 100000, "stack_depth": 32},
        "precision_debugger": {
            "config_path": None,
            "steps": None,
            "stages": None,
            "strict": False,
        },
    },
    "relocate_results": False,
    "finish_hook_cmd": None,
    "finish_hook_all_ranks": False,
    "finish_hook_ranks": [],
}
# verl's SFT trainer's profiler group (profiler/profiler.yaml): the roles' shape, with
# its own defaults and each tool's name
SFT_PROFILER = {
    **PROFILER,
    "tool": "torch",
    "save_path": "outputs/profile",
    "tool_config": {
        name: {**settings, "name": label}
        for (name, settings), label in zip(
            PROFILER["tool_config"].items(),
            ("nsight", "npu", "torch", "torch_memory", "precision_debugger"),
            strict=True,
        )
    },
}
_NSIGHT = {
    "trace": "cuda,nvtx,cublas,ucx",
    "cuda-memory-usage": "true",
    "cuda-graph-trace": "graph",
}
GLOBAL_PROFILER = {
    "tool": None,
    "steps": None,
    "profile_continuous_steps": False,
    "save_path": "outputs/profile",
    "global_tool_config": {
        "nsys": {
            "discrete": False,
            "controller_nsight_options": dict(_NSIGHT),
            "worker_nsight_options": {
                **_NSIGHT,
                "capture-range": "cudaProfilerApi",
                "capture-range-end": None,
                "kill": "none",
            },
        },
        "torch_memory": {
            "trace_alloc_max_entries": 100000,
            "stack_depth": 32,
            "context": "all",
            "stacks": "all",
            "kw_args": {},
        },
        "precision_debugger": {
            "config_path": None,
            "steps": None,
            "stages": None,
            "strict": False,
        },
    },
    "relocate_results": False,
    "finish_hook_cmd": None,
    "finish_hook_all_ranks": False,
    "finish_hook_ranks": [],
}
QAT = {
    "enable": False,
    "mode": "w4a16",
    "group_size": 16,
    "ignore_patterns": ["lm_head", "embed_tokens", "re:.*mlp.gate$"],
    "activation_observer": "static_minmax",
    "quantization_config_path": None,
}
ROUTER_REPLAY = {"mode": "disabled", "record_file": None, "replay_file": None}
CHECKPOINT = {
    "save_contents": ["model", "optimizer", "extra"],
    "load_contents": None,
    "async_save": False,
    "strict": True,
    "mbridge_config": {},
}
WRAP_POLICY = {"min_num_params": 0}
TURBO_CONFIG = {
    "distributed": {
        "fully_shard_parallel_size": 16,
        "tensor_parallel_size": 1,
        "expert_parallel_size": 1,
        "expert_fully_shard_parallel_size": 1,
        "ulysses_parallel_size": 1,
        "fsdp_plan": {
            "param_dtype": "bf16",
            "reduce_dtype": "fp32",
            "output_dtype": "bf16",
            "fsdp_implementation": "native",
            "num_to_forward_prefetch": 1,
            "num_to_backward_prefetch": 1,
            "apply_modules": {},
            "hook_modules": [],
        },
        "ep_plan": {"apply_modules": [], "dispatcher": None},
    },
    "memory": {"recompute": False, "recompute_plan": []},
}
MTP = {
    "enable": False,
    "enable_train": False,
    "enable_rollout": False,
    "detach_encoder": False,
    "mtp_loss_scaling_factor": 0.1,
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "method": "mtp",
    "num_speculative_tokens": 1,
}
MEGATRON_LORA = {
    "type": "lora",
    "merge": False,
    "rank": 0,
    "alpha": 32,
    "dropout": 0.0,
    "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
    "exclude_modules": [],
    "dropout_position": "pre",
    "lora_A_init_method": "xavier",
    "lora_B_init_method": "zero",
    "a2a_experimental": False,
    "dtype": None,
    "adapter_path": None,
    "freeze_vision_model": True,
    "freeze_vision_projection": True,
    "freeze_language_model": True,
}
TILED_MLP = {"enabled": False, "num_shards": 4}
DISAGGREGATION = {
    "enabled": False,
    "prefill_replicas": 1,
    "decode_replicas": 1,
    "decode_tensor_model_parallel_size": None,
    "transfer_backend": "nixl",
    "bootstrap_port": None,
    "ib_device": None,
}
PROMETHEUS = {
    "enable": False,
    "port": 9090,
    "file": "/tmp/ray/session_latest/metrics/prometheus/prometheus.yml",
    "served_model_name": None,
}
TRACE = {
    "project_name": None,
    "experiment_name": None,
    "backend": None,
    "token2text": False,
    "max_samples_per_step_per_worker": None,
}
# rollout.agent without the keys read under the schema's names (aliases.py).
AGENT = {"num_workers": 8, "custom_async_server": {"path": None, "name": None}}
# rollout.checkpoint_engine without update_weights_bucket_megabytes (aliases.py).
CHECKPOINT_ENGINE = {"backend": "naive", "engine_kwargs": {}, "custom_backend_module": None}
PF_PPO = {"reweight_method": "pow", "weight_pow": 2.0}
_TEACHER_INFERENCE = {
    "name": None,
    "dtype": None,
    "gpu_memory_utilization": 0.5,
    "enforce_eager": True,
    "cudagraph_capture_sizes": None,
    "free_cache_engine": True,
    "data_parallel_size": 1,
    "expert_parallel_size": 1,
    "tensor_model_parallel_size": 2,
    "max_num_batched_tokens": 8192,
    "max_model_len": None,
    "max_num_seqs": 1024,
    "load_format": "auto",
    "engine_kwargs": {},
    "limit_images": None,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "disable_log_stats": True,
    "skip_tokenizer_init": True,
    "prompt_length": None,
    "response_length": None,
    "temperature": None,
}
TEACHER = {"key": None, "model_path": None, "num_replicas": 0, "inference": _TEACHER_INFERENCE}
TRANSFER_QUEUE = {
    "enable": False,
    "metrics": {"enabled": False, "port": 0},
    "backend": {
        "storage_backend": "SimpleStorage",
        "SimpleStorage": {"total_storage_size": 100000, "num_data_storage_units": 8},
        "MooncakeStore": {
            "auto_init": False,
            "metadata_server": "localhost:50123",
            "master_server_address": "localhost:50124",
            "local_hostname": "localhost",
            "protocol": "tcp",
            "global_segment_size": 4294967296,
            "local_buffer_size": 1073741824,
            "device_name": "",
        },
    },
}
_DUMP = {"enable": False, "dump_dir": "~/.verl/rollout_dump", "steps": [], "action": "cache"}
SKIP = {"rollout": dict(_DUMP), "rollout_tq": dict(_DUMP), "async_rollout": dict(_DUMP)}
TRAINER_V1 = {
    "trainer_mode": "sync",
    "sync": {},
    "colocate_async": {"num_warmup_batches": 1},
    "separate_async": {
        "num_warmup_batches": 1,
        "parameter_sync_step": 4,
        "hybrid_rollout": {
            "enable_switch": False,
            "switch_threshold_ratio": 0.4,
            "adaptive_switch_threshold": True,
            "switch_threshold_step_up": 0.05,
            "switch_threshold_step_down": 0.03,
            "switch_threshold_release_steps": 2,
            "switch_cost_window_size": 3,
        },
    },
    "sampler": {
        "max_off_policy_threshold": 8,
        "max_off_policy_strategy": "drop",
        "sync_refill_failed_groups": False,
        "custom_sampler": {"path": None, "name": None},
        "sampler_kwargs": {},
    },
}
SANDBOX_FUSION = {"url": None, "max_concurrent": 64, "memory_limit_mb": 1024}
_ENGINE_SERVING = {
    "name": None,
    "dtype": "bfloat16",
    "gpu_memory_utilization": 0.5,
    "enforce_eager": True,
    "cudagraph_capture_sizes": None,
    "free_cache_engine": True,
    "data_parallel_size": 1,
    "expert_parallel_size": 1,
    "tensor_model_parallel_size": 2,
    "pipeline_model_parallel_size": 1,
    "max_num_batched_tokens": 8192,
    "max_model_len": None,
    "max_num_seqs": 1024,
    "load_format": "auto",
    "layered_summon": False,
    "scheduling_policy": "fcfs",
    "full_determinism": False,
    "seed": 42,
    "multi_stage_wake_up": False,
    "engine_kwargs": {},
    "limit_images": None,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "disable_log_stats": True,
    "skip_tokenizer_init": False,
    "ignore_eos": False,
    "temperature": 1.0,
    "top_k": -1,
    "top_p": 1,
    "do_sample": True,
    "n": 1,
    "prompt_length": 2048,
    "response_length": 2048,
    "quantization": None,
    "quantization_config_file": None,
    "mtp": None,
    "disaggregation": DISAGGREGATION,
}
# reward.reward_model.rollout (verl's reward model served by an inference engine).
REWARD_MODEL_SERVING = dict(_ENGINE_SERVING)
# reward_model.rollout, verl's legacy spelling: every value null (verl reads reward.*).
LEGACY_REWARD_MODEL_SERVING = dict.fromkeys(
    [
        k
        for k in _ENGINE_SERVING
        if k
        not in (
            "pipeline_model_parallel_size",
            "layered_summon",
            "scheduling_policy",
            "full_determinism",
            "seed",
            "multi_stage_wake_up",
            "ignore_eos",
            "temperature",
            "top_k",
            "top_p",
            "do_sample",
            "n",
            "quantization",
            "quantization_config_file",
            "mtp",
            "disaggregation",
        )
    ]
)
CONTINUOUS_TOKEN = {"enable": False, "model_family": "auto"}
# <role>.veomni: verl's VeOmni engine (an FSDP2 engine; model_engine=veomni), without the
# keys read under the schema's names (aliases.py).
VEOMNI = {
    "expert_parallel_size": 1,
    "mixed_precision": True,
    "seed": 42,
    "full_determinism": False,
    "init_device": "meta",
    "enable_full_shard": True,
    "ckpt_manager": "dcp",
    "load_checkpoint_path": None,
    "strategy": "veomni",
    "forward_only": False,
    "enable_fsdp_offload": False,
    "enable_reentrant": False,
    "attn_implementation": "flash_attention_2",
    "moe_implementation": "fused",
    "cross_entropy_loss_implementation": "eager",
    "rms_norm_implementation": "eager",
    "swiglu_mlp_implementation": "eager",
    "rotary_pos_emb_implementation": "eager",
    "rms_norm_gated_implementation": "eager",
    "causal_conv1d_implementation": "eager",
    "chunk_gated_delta_rule_implementation": "eager",
    "load_balancing_loss_implementation": "eager",
    "dsa_indexer_implementation": "eager",
    "dsa_attention_implementation": "eager",
    "mhc_implementation": "eager",
    "force_use_huggingface": False,
    "activation_gpu_limit": 0.0,
    "basic_modules": [],
    "pad_to_length": False,
    "pad_to_length_bucket": 1024,
    "router_replay": {"mode": "disabled"},
}

# Subtrees whose entries are named by the user, each of a given shape.
NAMED = {"distillation.teacher_models": TEACHER}


def tree_problems(cfg: Any) -> list[str]:
    """Every key under a tree field that its default shape lacks (with the close ones)."""
    problems = []
    for key, value, default in _trees(cfg, ""):
        problems += _unknown(key, value, default)
    return problems


def _trees(node: Any, prefix: str) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    for f in fields(node):
        value = getattr(node, f.name)
        if "tree" in f.metadata:
            yield prefix + f.name, value, f.metadata["tree"]
        elif is_dataclass(value):
            yield from _trees(value, f"{prefix}{f.name}.")


def _unknown(key: str, value: Any, default: Any) -> list[str]:
    if not isinstance(default, Mapping) or not default or not isinstance(value, Mapping):
        return []  # a leaf, or a mapping verl leaves free ({} by default)
    shape = NAMED.get(key)
    if shape is not None:  # each entry a user-named record of one shape
        return [p for name, item in value.items() for p in _unknown(f"{key}.{name}", item, shape)]
    problems = []
    for name, item in value.items():
        if name not in default:
            close = difflib.get_close_matches(str(name), [str(k) for k in default], n=1)
            hint = f"; did you mean {key}.{close[0]}?" if close else ""
            valid = ", ".join(map(str, default))
            problems.append(f"{key}: unknown key {name!r}{hint} (its keys: {valid})")
        else:
            problems += _unknown(f"{key}.{name}", item, default[name])
    return problems


# verl's AutoModel engine (engine=automodel): its kernel and MoE choices, held whole
AUTOMODEL_BACKEND = {
    "attn": "sdpa",
    "linear": "te",
    "rms_norm": "torch_fp32",
    "rope_fusion": True,
    "dispatcher": "torch",
    "experts": "gmm",
    "gate_precision": None,
    "enable_hf_state_dict_adapter": True,
    "enable_fsdp_optimizations": False,
    "fake_balanced_gate": False,
    "fake_gate_noise": 0.0,
}
AUTOMODEL_MOE = {
    "ignore_router_for_ac": False,
    "reshard_after_forward": False,
    "lm_head_precision": None,
    "wrap_outer_model": True,
}
