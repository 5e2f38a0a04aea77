"""verl's keys that this engine reads under another name, as data (``aliases`` applies
them): a verl key with two spellings (its deprecated one and its new one), a key verl
mirrors from another section (``actor.rollout_n`` is ``rollout.n``), verl's newer
``reward`` section, verl's other engines' sections (``veomni``), and verl's value names
(``bf16``) for this engine's.

Each alias names the schema key it sets; ``--help`` of either spelling says so.
"""

from __future__ import annotations

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"
_ROLES = {ACTOR: MODEL, REF: MODEL, "critic": "critic.model"}  # role -> its model's key


def _role_aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for role, model in _ROLES.items():
        # verl moved these into each role's engine section and mirrors them there
        for name in (
            "ulysses_sequence_parallel_size",
            "entropy_from_logits_with_chunking",
            "entropy_from_logits_chunk_size",
            "entropy_checkpointing",
            "use_torch_compile",
            "pad_to_length",
        ):
            out[f"{role}.fsdp_config.{name}"] = f"{role}.{name}"
        for name in ("entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size"):
            out[f"{role}.megatron.{name}"] = f"{role}.{name}"
        out[f"{role}.fsdp_config.dtype"] = f"{role}.fsdp_config.mixed_precision.param_dtype"
        out[f"{role}.megatron.dtype"] = f"{model}.dtype"
        out[f"{role}.megatron.use_remove_padding"] = f"{model}.use_remove_padding"
        out[f"{role}.rollout_n"] = f"{ROLLOUT}.n"
        # verl's VeOmni engine (model_engine=veomni): run on this engine's FSDP2
        for name in ("param_offload", "optimizer_offload", "fsdp_size", "forward_prefetch"):
            out[f"{role}.veomni.{name}"] = f"{role}.fsdp_config.{name}"
        out[f"{role}.veomni.ulysses_parallel_size"] = f"{role}.ulysses_sequence_parallel_size"
        for name in (
            "use_torch_compile",
            "entropy_from_logits_with_chunking",
            "entropy_checkpointing",
        ):
            out[f"{role}.veomni.{name}"] = f"{role}.{name}"
    for role in (ACTOR, "critic"):  # the roles that train
        out[f"{role}.optim.clip_grad"] = f"{role}.grad_clip"
        out[f"{role}.optim.warmup_style"] = f"{role}.optim.lr_scheduler_type"
        out[f"{role}.optim.lr_decay_style"] = f"{role}.optim.lr_scheduler_type"
    return out


# alias -> the schema's key
ALIASES: dict[str, str] = {
    **_role_aliases(),
    # verl's older spelling of the critic's Ulysses size
    "critic.model.fsdp_config.ulysses_sequence_parallel_size": (
        "critic.ulysses_sequence_parallel_size"
    ),
    # verl's routing replay mode per engine: one mode here, the actor's
    **{
        f"{ACTOR}.{engine}.router_replay.{name}": f"{ACTOR}.router_replay.{name}"
        for engine, names in (
            ("megatron", ("mode", "record_file", "replay_file")),
            ("veomni", ("mode",)),
        )
        for name in names
    },
    f"{ACTOR}.use_fused_kernels": f"{MODEL}.use_fused_kernels",
    f"{ACTOR}.use_remove_padding": f"{MODEL}.use_remove_padding",
    f"{ACTOR}.policy_loss.tau_pos": f"{ACTOR}.tau_pos",
    f"{ACTOR}.policy_loss.tau_neg": f"{ACTOR}.tau_neg",
    f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes": (
        f"{ROLLOUT}.update_weights_bucket_megabytes"
    ),
    f"{ROLLOUT}.agent.agent_loop_config_path": f"{ROLLOUT}.multi_turn.agent_loop_config_path",
    f"{ROLLOUT}.agent.default_agent_loop": f"{ROLLOUT}.multi_turn.default_agent",
    f"{ROLLOUT}.mtp": f"{MODEL}.mtp",
    "data.tokenizer": f"{MODEL}.tokenizer_path",
    "data.trust_remote_code": f"{MODEL}.trust_remote_code",
    "data.tool_config_path": f"{ROLLOUT}.multi_turn.tool_config_path",
    "data.function_tool_path": f"{ROLLOUT}.multi_turn.function_tool_path",
    # verl's newer reward section
    "reward.num_workers": "reward_model.num_workers",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.enable_resource_pool": "reward_model.enable_resource_pool",
    "reward.reward_model.n_gpus_per_node": "reward_model.n_gpus_per_node",
    "reward.reward_model.nnodes": "reward_model.nnodes",
    "reward.reward_model.model_path": "reward_model.model.path",
    **{
        f"reward_model.reward_kwargs.overlong_buffer_cfg.{name}": (
            f"reward_model.overlong_buffer.{name}"
        )
        for name in ("enable", "len", "penalty_factor")
    },
}

# A key under the prefix is the key under the target (after which ALIASES still apply).
PREFIX_ALIASES: dict[str, str] = {
    "critic.fsdp.": "critic.fsdp_config.",  # verl's newer name of the critic's section
    "critic.model.fsdp_config.": "critic.fsdp_config.",  # and its older one
    f"{ROLLOUT}.mtp.": f"{MODEL}.mtp.",
    "reward.custom_reward_function.": "custom_reward_function.",
    "reward.reward_kwargs.": "reward_model.reward_kwargs.",
    "sandbox_fusion.": "reward.sandbox_fusion.",  # verl's legacy spelling
}

_DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "half": "float16",
    "float": "float32",
}
# verl's FSDP-based engines run on this engine's FSDP2.
_STRATEGIES = {"veomni": "fsdp2", "fsdp_turbo": "fsdp2"}
# schema key -> {verl's value: the schema's}
VALUE_ALIASES: dict[str, dict[str, str]] = {
    **{f"{model}.dtype": _DTYPES for model in set(_ROLES.values())},
    f"{ROLLOUT}.dtype": _DTYPES,
    **{
        f"{role}.fsdp_config.mixed_precision.{name}": _DTYPES
        for role in _ROLES
        for name in ("param_dtype", "reduce_dtype", "buffer_dtype")
    },
    **{f"{role}.strategy": _STRATEGIES for role in _ROLES},
    f"{ROLLOUT}.multi_turn.default_agent": {"single_turn_agent": "single_turn"},
}
